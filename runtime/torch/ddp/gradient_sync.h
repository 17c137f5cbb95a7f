#pragma once
// GradientSync: what DdpCore drives around each forward through the wrapper. DDP's own Reducer
// (allreduce; reducer.h) is one; a ShardedOptimizer that took the module over installs the
// sharded gradient path (runtime/torch/zero/) in its place. The one seam between DDP and ZeRO:
// DdpCore keeps the forward (buffers, noSync(), whether a backward synchronises), the sync decides
// what the backward does with the gradients.

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dtrain/torch/ddp_stats.h"

namespace dtrain::ddp {

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  // Before every forward through the wrapper, before the module runs.
  virtual void beforeForward() {}
  // After a forward whose backward is to be synchronised. `outputs`: the forward's tensors (only
  // with findUnusedParameters).
  virtual void arm(const std::vector<at::Tensor>& outputs) = 0;
  // After a forward inside noSync(): its backward accumulates locally.
  virtual void disarm() = 0;
  // Whether a backward inside noSync() is to be armed as well (ZeRO's reduce-scattered
  // accumulation): the sync then accumulates into what it reduces to. Such a forward calls
  // armAccumulating() instead of disarm().
  virtual bool armsUnderNoSync() const { return false; }
  virtual void armAccumulating(const std::vector<at::Tensor>& outputs) { arm(outputs); }
  virtual const DdpIterationStats& lastIteration() const = 0;
  // The parameters' names, in the groups that travel together, in launch order.
  virtual std::vector<std::vector<std::string>> bucketNames() const = 0;
};

}  // namespace dtrain::ddp
