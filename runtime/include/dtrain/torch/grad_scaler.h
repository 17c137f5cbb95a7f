#pragma once
// GradScaler: dynamic loss scaling for mixed-precision (fp16) training, with the semantics and
// defaults of PyTorch's torch.amp.GradScaler, plus one thing a data-parallel job needs: whether a
// gradient overflowed is agreed across the ranks, so every rank skips the same steps and the
// ranks stay bitwise identical even when only one of them saw an inf or NaN.
//
//   dtrain::GradScaler scaler(group);               // init scale 2^16, growth 2, backoff 0.5
//   for (...) {
//     optimizer.zero_grad();
//     auto loss = ...;                              // forward, under autocast on CUDA
//     scaler.scale(loss).backward();                // gradients come out multiplied by the scale
//     scaler.unscale(optimizer);                    // optional: to clip the true gradients
//     scaler.step(optimizer);                       // skipped when any rank's gradients overflowed
//     scaler.update();                              // backoff after an overflow, growth after
//   }                                               // growthInterval clean steps
//
// unscale() divides the optimizer's gradients by the scale and checks them for inf/NaN (ATen's
// fused _amp_* kernels on CUDA; a portable loop on the CPU); the
// result is combined over the ranks with one MAX allreduce of a single value per step (a
// collective: every rank calls unscale()/step() for the same optimizers in the same order). Under
// DistributedDataParallel's noSync() accumulation, call it once per optimizer step as usual,
// after the synchronising backward.

#include <cstdint>
#include <map>
#include <memory>

#include <ATen/core/Tensor.h>

namespace torch::optim {
class Optimizer;
}

namespace dtrain {

class ProcessGroup;

constexpr double kDefaultInitScale = 65536.0;  // 2^16
constexpr double kDefaultGrowthFactor = 2.0;
constexpr double kDefaultBackoffFactor = 0.5;
constexpr int64_t kDefaultGrowthInterval = 2000;

struct GradScalerOptions {
  double initScale = kDefaultInitScale;
  double growthFactor = kDefaultGrowthFactor;       // > 1
  double backoffFactor = kDefaultBackoffFactor;     // in (0, 1)
  int64_t growthInterval = kDefaultGrowthInterval;  // >= 1
  // Disabled: scale() returns its input, step() just steps, update() does nothing.
  bool enabled = true;
};

// What a checkpoint keeps of a GradScaler (PyTorch's state_dict: scale, growth factor, backoff
// factor, growth interval, growth tracker).
struct GradScalerState {
  double scale = kDefaultInitScale;
  double growthFactor = kDefaultGrowthFactor;
  double backoffFactor = kDefaultBackoffFactor;
  int64_t growthInterval = kDefaultGrowthInterval;
  int64_t growthTracker = 0;  // clean steps since the last growth or backoff
  bool operator==(const GradScalerState& other) const;
};

class GradScaler {
 public:
  // `group` may be null (one process); then nothing is agreed with anyone. Throws
  // InvalidArgument for options PyTorch refuses too.
  explicit GradScaler(std::shared_ptr<ProcessGroup> group = nullptr,
                      GradScalerOptions options = {});
  ~GradScaler();
  GradScaler(const GradScaler&) = delete;
  GradScaler& operator=(const GradScaler&) = delete;

  // `loss` times the current scale (the scale lives on loss's device; no host synchronisation).
  at::Tensor scale(const at::Tensor& loss);

  // Divides `optimizer`'s gradients by the scale in place and records, agreed over all ranks,
  // whether any was inf or NaN. At most once per optimizer between update()s: a second call
  // throws, as PyTorch's unscale_ does. Collective.
  void unscale(torch::optim::Optimizer& optimizer);

  // Unscales (when unscale() was not called), then calls optimizer.step() unless an overflow was
  // found on any rank. Returns whether the optimizer stepped. Collective (through unscale).
  bool step(torch::optim::Optimizer& optimizer);

  // After the step(s) of this iteration: the scale backs off after an overflow and grows after
  // growthInterval clean steps in a row. Throws when no step() was recorded since the last one.
  void update();
  // Sets the scale outright (PyTorch's update(new_scale)), resetting the growth tracker.
  void update(double newScale);

  double getScale() const;
  bool isEnabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }
  // Steps step() skipped since construction (or since the state was loaded).
  int64_t skippedSteps() const { return skipped_; }
  // Whether the last step() skipped the optimizer's step.
  bool lastStepSkipped() const { return lastSkipped_; }

  GradScalerState state() const;
  // Throws InvalidArgument for a state that PyTorch would refuse (non-positive scale, ...).
  void loadState(const GradScalerState& state);

 private:
  enum class Stage { Ready, Unscaled, Stepped };
  struct PerOptimizer {
    Stage stage = Stage::Ready;
    at::Tensor foundInf;  // float32 [1] on the gradients' device: agreed across ranks
  };

  PerOptimizer& stateOf(torch::optim::Optimizer& optimizer);
  void ensureScale(const at::Device& device);

  std::shared_ptr<ProcessGroup> group_;
  GradScalerOptions options_;
  at::Tensor scale_;          // float32 0-dim on the training device, created lazily
  at::Tensor growthTracker_;  // int32 0-dim, beside scale_
  double initScale_;
  std::map<const torch::optim::Optimizer*, PerOptimizer> perOptimizer_;
  int64_t skipped_ = 0;
  bool lastSkipped_ = false;
};

}  // namespace dtrain
