#pragma once
// Not API (detail/): an internal that dtrain/torch/ddp.h's template needs.
// It may change in any release; programs include <dtrain/dtrain.h>.
// DdpCore: everything of DistributedDataParallel that does not depend on the module's type. The
// template in dtrain/torch/ddp.h only forwards calls to the module and reports to this
// class, so the
// machinery is compiled once, in the library.

#include <functional>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dtrain/torch/ddp_options.h"
#include "dtrain/torch/ddp_stats.h"
#include "dtrain/torch/process_group.h"

namespace torch::nn {
class Module;
}

namespace dtrain {

namespace ddp {
class GradientSync;
class CoalescedBroadcast;
}  // namespace ddp

class DdpCore {
 public:
  // Checks that every rank has the same parameters and buffers, broadcasts them from rank 0 and
  // installs the gradient hooks. Collective: every rank constructs it. `loadedLater`: parameters
  // (their TensorImpl) not broadcast, because the caller writes them on every rank next (a
  // ShardedOptimizer's after a re-form, from the restored blocks).
  DdpCore(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ProcessGroup> group,
          DdpOptions options, const std::unordered_set<const void*>& loadedLater = {});
  ~DdpCore();
  DdpCore(const DdpCore&) = delete;
  DdpCore& operator=(const DdpCore&) = delete;

  // Around every forward of the wrapper.
  void beforeForward();
  // Whether afterForward() needs the forward's output tensors.
  bool wantsOutputs() const;
  void afterForward(const std::vector<at::Tensor>& outputs, bool outputsSearchable);

  // The noSync() guard's switch: false while inside one.
  bool syncEnabled() const { return syncEnabled_; }
  void setSyncEnabled(bool enabled) { syncEnabled_ = enabled; }

  // Broadcasts the buffers from rank 0 now (collective).
  void syncBuffers();

  // The group re-formed (another membership epoch) since this core was made: its buckets are for
  // another world (DistributedDataParallel::reform()).
  bool stale() const;

  ProcessGroup& group() { return *group_; }
  const std::shared_ptr<ProcessGroup>& groupPtr() const { return group_; }
  const DdpOptions& options() const { return options_; }
  const DdpIterationStats& lastIteration() const;
  // The parameters' names, bucket by bucket in launch order.
  std::vector<std::vector<std::string>> bucketNames() const;

  // For what builds on DDP (dtrain::ShardedOptimizer, dtrain/torch/zero.h): the module, and the
  // parameters that take part -- requiring grad, a tied one once under its first name -- in
  // registration order.
  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }
  const std::vector<std::pair<std::string, at::Tensor>>& trainedParameters() const {
    return trained_;
  }
  // Hands what a backward does with the gradients to the GradientSync `make` builds: DDP's
  // reducer is removed first, its hooks and buckets freed, so that `make` can reuse the memory.
  // When `make` throws, DDP's own reducer is rebuilt and the error rethrown. Not while a backward
  // runs. Once only.
  void replaceGradientSync(const std::function<std::shared_ptr<ddp::GradientSync>()>& make);
  bool gradientSyncReplaced() const { return replaced_; }

 private:
  std::shared_ptr<ddp::GradientSync> makeReducer() const;
  // DDP's Reducer is made when first needed (the first forward, or a question about its
  // buckets), not by the constructor: a ShardedOptimizer built before any forward replaces it
  // without its full-size buckets ever being allocated.
  ddp::GradientSync& sync() const;

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  int epoch_ = 0;  // group_'s membership epoch when this core was made
  DdpOptions options_;
  bool syncEnabled_ = true;
  std::vector<std::pair<std::string, at::Tensor>> trained_;
  mutable std::shared_ptr<ddp::GradientSync> sync_;  // DDP's Reducer, or what replaced it
  bool replaced_ = false;
  std::unique_ptr<ddp::CoalescedBroadcast> buffers_;
};

}  // namespace dtrain
