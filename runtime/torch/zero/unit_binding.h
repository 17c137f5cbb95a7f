#pragma once
// UnitBinding: what ties a ShardedUnit (dtrain/torch/fully_shard.h) to the ShardGroup units of
// its parameters: the unit's forward and the autograd Function at its boundary call it. See
// Note [ZeRO-3 unit lifecycle] in shard_group.h.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/any.h>

namespace dtrain::zero {

class ShardGroup;

class UnitBinding {
 public:
  // `units`: the ShardGroup units holding the module's own parameters (one per dtype, trained
  // and frozen). `name`: the module's name in the model. `reshardAfterForward`:
  // ShardedUnitOptions'. `frozenRelease`: the ShardGroup's release of its frozen units, if it
  // has any (Note [Frozen units]).
  UnitBinding(std::weak_ptr<ShardGroup> shards, std::vector<size_t> units, std::string name,
              bool reshardAfterForward = true, std::optional<size_t> frozenRelease = {});

  // Gathers the units, runs `module`, frees what it gathered; the output goes through the
  // boundary whose backward gathers them again.
  at::Tensor forward(torch::nn::AnyModule& module, const at::Tensor& input);
  // The boundary's backward: before any node of the unit runs.
  void gatherForBackward();
  // The gradient of a forward's input is in: no node of this forward is left to run that the
  // input's gradient waits for (Note [Frozen units]).
  void inputGradientArrived();

  const std::string& name() const { return name_; }
  // Its ShardGroup is gone.
  bool expired() const { return shards_.expired(); }
  const std::vector<size_t>& units() const { return units_; }

 private:
  ShardGroup& shards();

  std::weak_ptr<ShardGroup> shards_;
  const std::vector<size_t> units_;
  const std::string name_;
  const bool reshardAfterForward_;
  const std::optional<size_t> frozenRelease_;
};

}  // namespace dtrain::zero
