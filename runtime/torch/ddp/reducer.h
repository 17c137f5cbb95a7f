#pragma once
// Reducer: the gradient side of DistributedDataParallel. Owns the buckets, the post-hooks on the
// parameters' gradient accumulators and the end-of-backward callback; see Note [DDP backward].
// Private to the torch layer; programs use dtrain::DistributedDataParallel.

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include <ATen/core/Tensor.h>

#include "backward_pass.h"
#include "dtrain/comm/communicator.h"
#include "dtrain/torch/ddp_options.h"
#include "dtrain/torch/ddp_stats.h"
#include "dtrain/torch/detail/bucket_assignment.h"
#include "dtrain/torch/process_group.h"
#include "gradient_sync.h"

namespace torch::autograd {
struct Node;
}

namespace dtrain::ddp {

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};

class Reducer : public GradientSync {
 public:
  // `params`: the parameters that take part (requiring grad, no duplicates), in registration order.
  Reducer(std::shared_ptr<ProcessGroup> group, std::vector<NamedTensor> params,
          const DdpOptions& options);
  ~Reducer() override;
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // After a forward whose backward is to be synchronised. `outputs`: the forward's tensors (used
  // only with findUnusedParameters).
  void arm(const std::vector<at::Tensor>& outputs) override;
  // After a forward inside noSync(): its backward accumulates locally.
  void disarm() override;

  const DdpIterationStats& lastIteration() const override { return stats_; }
  std::vector<std::vector<std::string>> bucketNames() const override;

 private:
  enum class State { Idle, Armed, Local };

  struct Bucket {
    std::vector<size_t> params;  // indices into params_, in launch order
    at::ScalarType dtype = at::kFloat;
    int64_t numel = 0;
    std::shared_ptr<comm::Buffer> memory;
    at::Tensor flat;                // over memory
    std::vector<at::Tensor> views;  // per entry of params: its gradient's place in flat
    // Compression: the 16-bit copy that travels; undefined when uncompressed.
    std::shared_ptr<comm::Buffer> wireMemory;
    at::Tensor wire;
    bool averagedByAllreduce = false;  // Note [Averaging]: ReduceOp::Avg, no division before
    size_t pending = 0;                // gradients not yet ready this pass
    std::shared_ptr<comm::Work> work;
  };
  struct Slot {
    size_t bucket = 0;
    size_t entry = 0;
  };

  // Buckets as `assignment` groups the parameters (lists of indices into params_, launch order).
  void buildBuckets(const std::vector<std::vector<size_t>>& assignment);
  std::vector<BucketInput> bucketInputs() const;
  // Note [Bucket rebuild]: once, at the end of the first synchronised backward.
  void rebuildBucketsLocked();
  void installHooks();
  void onGradientReady(size_t index);
  void markReadyLocked(size_t index, bool hookFired);
  void launchReadyBucketsLocked();
  void finalizeBackward();
  void finalizeLocked(std::vector<size_t>& missing);
  void writeBackLocked(size_t index, const at::Tensor& view);
  void resetPassLocked();
  at::Tensor& viewOf(size_t index) {
    return buckets_[slots_[index].bucket].views[slots_[index].entry];
  }

  std::shared_ptr<ProcessGroup> group_;
  comm::Communicator& comm_;
  DdpOptions options_;
  std::vector<NamedTensor> params_;
  std::vector<compat::NodePtr> accumulators_;  // keep the hooks alive
  std::vector<uintptr_t> hookKeys_;
  std::vector<Bucket> buckets_;
  std::vector<Slot> slots_;
  at::Tensor divisor_;  // 1 / world size, 0-dim

  mutable std::mutex mutex_;  // guards everything below: hooks may run on autograd device threads
  State state_ = State::Idle;
  bool callbackQueued_ = false;
  bool warnedUnexpected_ = false;
  bool poisonedThisPass_ = false;  // DTRAIN_FAULT=nan-grad: one gradient per pass
  std::vector<char> ready_;        // per parameter, this pass
  std::vector<char> usedLocally_;  // per parameter, since the last synchronised pass
  UnusedSearch unused_;            // findUnusedParameters: unreachable from this pass's outputs
  size_t nextBucket_ = 0;          // next bucket to launch: launches are in bucket order
  std::vector<size_t> arrival_;    // until the rebuild: parameters in the order gradients came
  bool rebuilt_ = false;           // the buckets were rebuilt (or will not be)
  std::shared_ptr<comm::Buffer> usedMemory_;  // findUnusedParameters: per parameter, int32
  at::Tensor usedMap_;
  std::shared_ptr<comm::Work> usedWork_;
  DdpIterationStats stats_;
};

// The autograd nodes reachable from `outputs` (their grad_fns, or the gradient accumulators of
// outputs that are leaves), for findUnusedParameters.
std::unordered_set<const torch::autograd::Node*> reachableNodes(
    const std::vector<at::Tensor>& outputs);

}  // namespace dtrain::ddp
