#pragma once
// DdpCore: everything of DistributedDataParallel that does not depend on the module's type. The
// template in dtrain/torch/ddp.h only forwards calls to the module and reports to this class, so the
// machinery is compiled once, in the library.

#include <memory>
#include <string>
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
class Reducer;
class CoalescedBroadcast;
}  // namespace ddp

class DdpCore {
 public:
  // Checks that every rank has the same parameters and buffers, broadcasts them from rank 0 and
  // installs the gradient hooks. Collective: every rank constructs it.
  DdpCore(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ProcessGroup> group,
          DdpOptions options);
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

  ProcessGroup& group() { return *group_; }
  const std::shared_ptr<ProcessGroup>& groupPtr() const { return group_; }
  const DdpOptions& options() const { return options_; }
  const DdpIterationStats& lastIteration() const;
  // The parameters' names, bucket by bucket in launch order.
  std::vector<std::vector<std::string>> bucketNames() const;

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  DdpOptions options_;
  bool syncEnabled_ = true;
  std::unique_ptr<ddp::Reducer> reducer_;
  std::unique_ptr<ddp::CoalescedBroadcast> buffers_;
};

}  // namespace dtrain
