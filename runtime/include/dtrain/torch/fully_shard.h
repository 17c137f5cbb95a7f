#pragma once
// ShardedUnit: marks a submodule as one unit of ZeRO stage 3 (fully sharded parameters, as
// PyTorch's FSDP2 `fully_shard`). Wrap the modules whose parameters should be gathered only
// while they run -- each transformer layer, each ResNet stage -- then build the
// ShardedOptimizer with ZeroOptions::stage = 3: each marked module's parameters become views
// into one flat buffer per dtype, of which every rank keeps its 1/N between uses. The unit's
// forward all-gathers them before the module runs and frees them after; its backward gathers
// them again, and their gradients are reduce-scattered into the owned 1/N and freed once they
// are all in. libtorch's C++ frontend has no module hooks, so the wrapper is what runs the
// module: it takes the module's parameters, buffers and children under their own names, so a
// wrapped model has the same named_parameters() (and state_dict) as the plain one.
//
//   torch::nn::Sequential body = dtrain::shardEveryChild(torch::nn::Sequential(
//       torch::nn::Linear(1024, 4096), torch::nn::GELU(), torch::nn::Linear(4096, 1024)));
//   dtrain::DistributedDataParallel<torch::nn::Sequential> ddp(body, group);
//   dtrain::ZeroOptions zo;
//   zo.stage = 3;
//   dtrain::ShardedOptimizer optimizer(ddp, factory, zo);   // parameters freed from here on
//   ...  // train as at stage 2; read full parameters with optimizer.fullParameters()
//
// Unbound (no stage-3 optimizer over it) a ShardedUnit is the module it wraps, plain. Design:
// Note [ZeRO-3 unit lifecycle] (runtime/torch/zero/shard_group.h), docs/design.md "Sharding".

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include "dtrain/torch/unit_layout.h"

namespace dtrain {

class ShardedOptimizer;
namespace zero {
class UnitBinding;
}  // namespace zero

struct ShardedUnitOptions {
  // false: the unit's full parameters stay from its forward to its backward, which then needs
  // no second all-gather (PyTorch FSDP's reshard_after_forward=False): more memory between the
  // two, one collective less. A forward no backward follows (no_grad, an output that needs no
  // gradient) frees them as usual.
  bool reshardAfterForward = true;
};

class ShardedUnitImpl : public torch::nn::Module {
 public:
  // `module`: one whose forward takes and returns a tensor.
  explicit ShardedUnitImpl(torch::nn::AnyModule module, ShardedUnitOptions options = {});
  template <typename Impl>
  explicit ShardedUnitImpl(const torch::nn::ModuleHolder<Impl>& module,
                           ShardedUnitOptions options = {})
      : ShardedUnitImpl(torch::nn::AnyModule(module), options) {}

  at::Tensor forward(const at::Tensor& input);
  // Also the wrapped module's own flag (its children are this wrapper's children).
  void train(bool on = true) override;

  torch::nn::AnyModule& module() { return module_; }
  const ShardedUnitOptions& options() const { return options_; }

  // Internal: ShardedOptimizer (stage 3) binds the unit to its shards; once only.
  void bind(std::shared_ptr<zero::UnitBinding> binding);
  bool bound() const { return binding_ != nullptr; }

 private:
  torch::nn::AnyModule module_;
  ShardedUnitOptions options_;
  std::shared_ptr<zero::UnitBinding> binding_;
};
TORCH_MODULE(ShardedUnit);

// The policy of "one unit per layer": a Sequential whose every child is `sequential`'s child
// wrapped in a ShardedUnit, under the same name (parameter names unchanged). The modules are
// shared, not copied.
torch::nn::Sequential shardEveryChild(const torch::nn::Sequential& sequential,
                                      ShardedUnitOptions options = {});

// Every trained parameter of `optimizer`'s model, full and copied (name, tensor), in unit order:
// stage 3 gathers each unit and frees it again. What a test compares, or an export saves.
// Collective.
std::vector<std::pair<std::string, at::Tensor>> gatherFullParameters(ShardedOptimizer& optimizer);

}  // namespace dtrain
