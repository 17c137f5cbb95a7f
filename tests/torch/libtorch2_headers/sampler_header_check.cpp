// Compiled (syntax only) against the libtorch 2.x stand-ins beside it: see
// tests/torch/libtorch2_headers.cmake.
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/torch/distributed_sampler.h"

static_assert(std::is_same_v<decltype(std::declval<dtrain::DistributedSampler&>().next(1)),
                             std::optional<std::vector<size_t>>>,
              "DistributedSampler::next returns what libtorch 2.x's Sampler::next returns");
