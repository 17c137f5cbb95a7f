#pragma once
// UnitBinding: what ties a ShardedUnit (dtrain/torch/fully_shard.h) to the ShardGroup units of
// its parameters: the unit's forward and the autograd Function at its boundary call it. See
// Note [ZeRO-3 unit lifecycle] in shard_group.h.

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/any.h>

namespace dtrain::zero {

class ShardGroup;

class UnitBinding {
 public:
  // `units`: the ShardGroup units holding the module's own parameters (one per dtype; none for
  // a module without trained parameters). `name`: the module's name in the model.
  // `reshardAfterForward`: ShardedUnitOptions'.
  UnitBinding(std::weak_ptr<ShardGroup> shards, std::vector<size_t> units, std::string name,
              bool reshardAfterForward = true);

  // Gathers the units, runs `module`, frees what it gathered; the output goes through the
  // boundary whose backward gathers them again.
  at::Tensor forward(torch::nn::AnyModule& module, const at::Tensor& input);
  // The boundary's backward: before any node of the unit runs.
  void gatherForBackward();

  const std::string& name() const { return name_; }
  const std::vector<size_t>& units() const { return units_; }

 private:
  ShardGroup& shards();

  std::weak_ptr<ShardGroup> shards_;
  const std::vector<size_t> units_;
  const std::string name_;
  const bool reshardAfterForward_;
};

}  // namespace dtrain::zero
