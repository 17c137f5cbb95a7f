#pragma once
// ShardedGradientSync: the backward side of ZeRO, installed in DDP in place of its Reducer
// (ddp::GradientSync, runtime/torch/ddp/gradient_sync.h). Hooks on the parameters' gradient
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

#include "../ddp/backward_pass.h"
#include "../ddp/gradient_sync.h"
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
  // A noSync() backward that reduce-scatters: not a synchronising one for the iteration count
  // (what DTRAIN_FAULT's step= and the stats count), as under DDP.
  void armAccumulating(const std::vector<at::Tensor>& outputs) override;
  // Stages 2 and 3 with ZeroOptions::Accumulation::ReduceScatter.
  bool armsUnderNoSync() const override {
    return shards_->stage() != 1 &&
           shards_->options().accumulation == ZeroOptions::Accumulation::ReduceScatter;
  }
  const DdpIterationStats& lastIteration() const override { return stats_; }
  std::vector<std::vector<std::string>> bucketNames() const override;

  // Stage 2: bytes of the module's gradients held outside the units (noSync() accumulation).
  size_t looseGradientBytes() const;

  // ShardedOptimizer::zero_grad(): drops every gradient accumulated so far -- the shards', the
  // units' (stage 1) and the parameters' own (noSync(), stages 2 and 3). Note [Zeroed gradients].
  void zeroGradients();

 private:
  enum class State { Idle, Armed, Local };
  struct Param {
    size_t unit = 0;
    size_t slot = 0;  // index within the unit
  };

  void installHooks();
  // Every gradient's pre-hook; the first of a pass starts it (startPassLocked).
  void onGradientArriving();
  // Note [Zeroed gradients]: drops what the program zeroed since the last pass; stage 1 opens the
  // accumulation; stages 2 and 3 take the placeholders off.
  void startPassLocked();
  // The end of every pass: placeholders on the gradients stages 2 and 3 left undefined, and what
  // the next pass compares with.
  void markGradientsLocked();
  void dropAccumulatedLocked();
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
  std::vector<compat::NodePtr> accumulators_;
  std::vector<uintptr_t> postKeys_;
  std::vector<uintptr_t> preKeys_;
  // The next gradient to arrive is a pass's first. Read without the lock by the pre-hooks' fast
  // path.
  std::atomic<bool> starting_{true};
  // Stages 2 and 3, per parameter: a zero of its shape over one element, its .grad between passes
  // where it would be undefined (Note [Zeroed gradients]).
  std::vector<at::Tensor> placeholders_;

  mutable std::mutex mutex_;  // guards everything below: hooks may run on autograd's threads
  State state_ = State::Idle;
  // Stage 1: an accumulation is open (Note [Accumulating into the shard]).
  bool open_ = false;
  // What each parameter's .grad and each unit's shard gradient were when the last pass ended (the
  // TensorImpl; null: undefined). Note [Zeroed gradients].
  std::vector<const void*> gradMarks_;
  std::vector<const void*> shardMarks_;
  bool callbackQueued_ = false;
  bool warnedUnexpected_ = false;
  bool poisonedThisPass_ = false;
  bool accumulatingPass_ = false;  // armed by armAccumulating(): a noSync() micro-batch
  std::vector<char> ready_;
  std::vector<size_t> pending_;  // per unit: gradients not yet ready this pass
  size_t nextUnit_ = 0;          // next unit to launch: launches are in unit order
  ddp::UnusedSearch unused_;     // findUnusedParameters: unreachable from this pass's outputs
  DdpIterationStats stats_;
};

}  // namespace dtrain::zero
