#pragma once
// A stand-in for libtorch 2.x's torch/data/samplers/base.h holding only what
// dtrain/torch/distributed_sampler.h reads, declared as 2.x declares it: the Sampler interface
// takes and returns std::optional, and nothing includes c10/util/Optional.h (no c10::optional).

#include <cstddef>
#include <optional>
#include <vector>

namespace torch {
namespace serialize {
class OutputArchive;
class InputArchive;
}  // namespace serialize

namespace data::samplers {
template <typename BatchRequest = std::vector<size_t>>
class Sampler {
 public:
  using BatchRequestType = BatchRequest;
  virtual ~Sampler() = default;
  virtual void reset(std::optional<size_t> new_size) = 0;
  virtual std::optional<BatchRequest> next(size_t batch_size) = 0;
  virtual void save(serialize::OutputArchive& archive) const = 0;
  virtual void load(serialize::InputArchive& archive) = 0;
};
}  // namespace data::samplers
}  // namespace torch
