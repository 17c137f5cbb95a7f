#pragma once
// ShardedUnit: marks a submodule as one unit of ZeRO stage 3 (fully sharded parameters, as
// PyTorch's FSDP2 `fully_shard`). Wrap the modules whose parameters should be gathered only
// while they run -- each transformer layer, each ResNet stage -- then build the
// ShardedOptimizer with ZeroOptions::stage = 3: each marked module's parameters become views
// into one flat buffer per dtype, of which every rank keeps its 1/N between uses. The unit's
// forward all-gathers them before the module runs and frees them after; its backward gathers
// them again, and their gradients are reduce-scattered into the owned 1/N and freed once they
// are all in. Its frozen parameters (requires_grad false: a base model under LoRA adapters) are
// sharded too, in units of their own gathered and freed with the trained ones, without
// gradients or optimizer state (docs/design.md "Sharding", Frozen parameters); frozen
// parameters of no marked module stay whole. libtorch's C++ frontend has no module hooks, so the
// wrapper is what runs the
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
// docs/design.md "Sharding".
//
// A model larger than one rank's memory is built unit by unit with fullyShard(), which keeps
// only this rank's 1/N of each unit from the moment it is built, so that no rank ever holds more
// than one unit in full (docs/design.md "Sharding", Units sharded when built):
//
//   torch::manual_seed(42);                          // the same seed on every rank
//   torch::nn::Sequential body;
//   for (int i = 0; i < 48; ++i) body->push_back(dtrain::fullyShard(Block(4096), *group));

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include "dtrain/torch/detail/unit_layout.h"

namespace dtrain {

class ShardedOptimizer;
class ProcessGroup;
namespace zero {
class UnitBinding;
struct BuiltUnit;
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

  // Refused while the unit is sharded as built (fullyShard) and not yet bound, except to where
  // its shards are: its parameters have no memory to convert. Build it on its device, in its
  // dtype, before fullyShard.
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  // Internal: ShardedOptimizer (stage 3) binds the unit to its shards; once only.
  void bind(std::shared_ptr<zero::UnitBinding> binding);
  bool bound() const { return binding_ != nullptr; }
  // Internal: fullyShard's record of what this rank kept, until the binding takes it (null
  // otherwise).
  const std::shared_ptr<zero::BuiltUnit>& built() const { return built_; }
  void setBuilt(std::shared_ptr<zero::BuiltUnit> built) { built_ = std::move(built); }

 private:
  void refuseUnbuilt(const char* what) const;

  torch::nn::AnyModule module_;
  ShardedUnitOptions options_;
  std::shared_ptr<zero::UnitBinding> binding_;
  std::shared_ptr<zero::BuiltUnit> built_;
};
TORCH_MODULE(ShardedUnit);

// Where fullyShard keeps a unit's part: this rank's place among the ranks of the group that will
// train it, and the device of that group (a ProcessGroup converts).
struct ShardPlacement {
  ShardPlacement(int rank, int ranks, c10::Device device = c10::kCPU);
  ShardPlacement(const ProcessGroup& group);  // NOLINT(google-explicit-constructor)
  int rank;
  int ranks;
  c10::Device device;
};

// Wraps `module` in a ShardedUnit and shards it now, as PyTorch FSDP2's fully_shard does: of
// its parameters, trained and frozen apart (those of units inside it that were sharded when built
// aside), this rank keeps its 1/N -- the block of the flat buffer a stage-3 ShardedOptimizer
// would own -- on `where.device`, and the parameters' own memory is freed. Build the units one
// after another and the most a rank holds in full is one unit (with its construction's
// temporaries), whatever the model's size.
// - Every rank must build the same values: seed alike (torch::manual_seed) and build in the same
//   order; then the model equals a one-process model built from that seed. The stage-3
//   ShardedOptimizer compares a checksum of each unit's values as built across ranks and fails
//   every rank naming the first unit that differs (DistributedDataParallel cannot broadcast rank
//   0's values: no rank has them).
// - Until that optimizer binds it, the unit cannot run or be read (its parameters have no
//   memory); DistributedDataParallel takes such a model without copying rank 0's values over
//   the shards. Its buffers stay whole (moved to where.device).
// - Convert the module's dtype, and build on its device, first: to() of a unit sharded as built
//   is refused.
// Not collective: no rank waits for another here.
ShardedUnit fullyShard(torch::nn::AnyModule module, const ShardPlacement& where,
                       ShardedUnitOptions options = {});
template <typename Impl>
ShardedUnit fullyShard(const torch::nn::ModuleHolder<Impl>& module, const ShardPlacement& where,
                       ShardedUnitOptions options = {}) {
  return fullyShard(torch::nn::AnyModule(module), where, options);
}

// The policy of "one unit per layer": a Sequential whose every child is `sequential`'s child
// wrapped in a ShardedUnit, under the same name (parameter names unchanged). The modules are
// shared, not copied.
torch::nn::Sequential shardEveryChild(const torch::nn::Sequential& sequential,
                                      ShardedUnitOptions options = {});

// Every parameter `optimizer` holds, full and copied (name, tensor), in unit order: the trained
// ones, then (stage 3) the frozen ones of marked modules; stage 3 gathers each unit and frees it
// again. Frozen parameters of no marked module are not listed: they are whole on every rank
// already, under the same names in the model. What a test compares, or an export saves.
// Collective.
std::vector<std::pair<std::string, at::Tensor>> gatherFullParameters(ShardedOptimizer& optimizer);
// The same parameters, in the same order, handed to `visit` full but not copied, one unit held at
// a time (stage 3 gathers a unit, visits its parameters and frees it before the next): what a
// program that reads the whole model once (a hash, a norm, a write) needs, in the memory of one
// unit instead of the whole model. The tensor is valid during the call only. Collective.
void visitFullParameters(ShardedOptimizer& optimizer,
                         const std::function<void(const std::string&, const at::Tensor&)>& visit);

}  // namespace dtrain
