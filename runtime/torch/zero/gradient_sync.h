#pragma once
// ShardedGradientSync: the backward side of ZeRO, installed in DDP in place of its Reducer
// (ddp::GradientSync, runtime/torch/ddp_gradient_sync.h). Hooks on the parameters' gradient
// accumulators hand each finished gradient to its unit; a unit whose last gradient arrived
// starts its reduce-scatter at once, units strictly in order on every rank; the end-of-backward
// callback launches what is left, waits for every unit and reports parameters that got no
// gradient, as DDP's reducer does (Note [DDP backward]). See Note [Sharded backward].

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../backward_pass.h"
#include "../ddp_gradient_sync.h"
#include "dtrain/torch/ddp_options.h"
#include "shard_group.h"

namespace torch::autograd {
struct Node;
}

namespace dtrain::zero {

class ShardedGradientSync : public ddp::GradientSync {
 public:
  ShardedGradientSync(std::shared_ptr<ShardGroup> shards, const DdpOptions& ddpOptions);
  ~ShardedGradientSync() override;
  ShardedGradientSync(const ShardedGradientSync&) = delete;
  ShardedGradientSync& operator=(const ShardedGradientSync&) = delete;

  // Waits for the all-gathers the last step left running (Note [Deferred all-gathers]).
  void beforeForward() override { shards_->settleGathers(); }
  void arm(const std::vector<at::Tensor>& outputs) override;
  void disarm() override;
  const DdpIterationStats& lastIteration() const override { return stats_; }
  std::vector<std::vector<std::string>> bucketNames() const override;

  // Stage 2: bytes of the module's gradients held outside the units (noSync() accumulation).
  size_t looseGradientBytes() const;

 private:
  enum class State { Idle, Armed, Local };
  struct Param {
    size_t unit = 0;
    size_t slot = 0;  // index within the unit
  };

  void installHooks();
  void onGradientArriving();
  void onGradientReady(size_t index);
  // Stage 3 under noSync(): counts the gradient so that its unit is resharded once all are in
  // (Note [Sharded backward]); the pass's end reshards the rest and resets it.
  void localGradientLocked(size_t index);
  void finishLocalPass();
  void markReadyLocked(size_t index, bool hookFired);
  void launchReadyUnitsLocked();
  void finalizeBackward();
  void finalizeLocked(std::vector<size_t>& missing);
  void resetPassLocked();
  const std::string& nameOf(size_t index) const;
  const at::Tensor& tensorOf(size_t index) const;

  std::shared_ptr<ShardGroup> shards_;
  const DdpOptions ddpOptions_;
  std::vector<Param> params_;  // every unit's parameters, unit by unit
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> postKeys_;
  std::vector<uintptr_t> preKeys_;  // stage 1 only
  // Stage 1: an accumulation is open (Note [Accumulating into the shard]). Read without the
  // lock by the pre-hooks' fast path.
  std::atomic<bool> open_{false};

  mutable std::mutex mutex_;  // guards everything below: hooks may run on autograd's threads
  State state_ = State::Idle;
  bool callbackQueued_ = false;
  bool warnedUnexpected_ = false;
  bool poisonedThisPass_ = false;
  std::vector<char> ready_;
  std::vector<size_t> pending_;  // per unit: gradients not yet ready this pass
  size_t nextUnit_ = 0;          // next unit to launch: launches are in unit order
  ddp::UnusedSearch unused_;     // findUnusedParameters: unreachable from this pass's outputs
  DdpIterationStats stats_;
};

}  // namespace dtrain::zero
