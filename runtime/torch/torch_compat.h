#pragma once
// Every difference between the libtorch versions dtrain supports (2.11 - 2.14: docs/building.md,
// "Which libtorch") that the torch layer touches, in one place. Code elsewhere calls these helpers
// and never tests versions itself.
//
// What is here and why:
//   - NodePtr: how libtorch hands out a node of the autograd graph (a parameter's gradient
//     accumulator): std::shared_ptr up to 2.13, c10::intrusive_ptr from 2.14.
//   - PostHook: a gradient-accumulator post-hook from a std::function. libtorch's LambdaPostHook
//     changed its constructor (and grew compiled-autograd callbacks) in 2.x; the FunctionPostHook
//     interface we derive from kept operator()(outputs, inputs) in both.
//   - PreHook: the same before the accumulator adds the gradient (libtorch has no del_pre_hook).
//   - queueEngineCallback: the autograd engine's end-of-backward callback.
//   - currentStream: the caller's CUDA stream, only in CUDA builds of libtorch.
//   - autocastEnabled / setAutocastEnabled / autocastDtype / setAutocastDtype: autocast's switch
//     and dtype for one device type.
//   - optimizerStateKey: the key of a parameter's entry in Optimizer::state() (its TensorImpl's
//     address).
//   - schedulerStepCount: LRScheduler's position (a protected member in every version; no
//     accessor exists), for checkpoints.

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include <ATen/autocast_mode.h>
#include <c10/core/Device.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/version.h>

#include "dtrain/config.h"

#if DTRAIN_WITH_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#if TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 11)
#error "dtrain needs libtorch 2.11 or newer (docs/building.md, Which libtorch)"
#endif

namespace dtrain::compat {

using torch::autograd::variable_list;

using NodePtr =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

class PostHook : public torch::autograd::FunctionPostHook {
 public:
  using Fn = std::function<void()>;
  explicit PostHook(Fn fn) : fn_(std::move(fn)) {}
  variable_list operator()(const variable_list& outputs, const variable_list& /*inputs*/) override {
    fn_();
    return outputs;
  }

 private:
  Fn fn_;
};

// Adds `fn` as a post-hook of a parameter's gradient accumulator; returns the key that removes it.
inline uintptr_t addAccumulatorPostHook(const NodePtr& accumulator, PostHook::Fn fn) {
  return accumulator->add_post_hook(std::make_unique<PostHook>(std::move(fn)));
}

inline void removeAccumulatorPostHook(const NodePtr& accumulator, uintptr_t key) {
  accumulator->del_post_hook(key);
}

class PreHook : public torch::autograd::FunctionPreHook {
 public:
  using Fn = std::function<void()>;
  explicit PreHook(Fn fn) : fn_(std::move(fn)) {}
  variable_list operator()(const variable_list& grads) override {
    fn_();
    return grads;
  }

 private:
  Fn fn_;
};

// Adds `fn` as a pre-hook of a parameter's gradient accumulator: it runs before the incoming
// gradient is added into .grad. Returns the key that removes it (Node has no del_pre_hook: the
// hook is found by its address).
inline uintptr_t addAccumulatorPreHook(const NodePtr& accumulator, PreHook::Fn fn) {
  auto hook = std::make_unique<PreHook>(std::move(fn));
  const auto key = reinterpret_cast<uintptr_t>(hook.get());
  accumulator->add_pre_hook(std::move(hook));
  return key;
}

inline void removeAccumulatorPreHook(const NodePtr& accumulator, uintptr_t key) {
  auto& hooks = accumulator->pre_hooks();
  for (auto it = hooks.begin(); it != hooks.end(); ++it) {
    if (reinterpret_cast<uintptr_t>(it->get()) == key) {
      hooks.erase(it);
      return;
    }
  }
}

// Runs `fn` once the running backward pass has finished; call it only from inside that pass
// (a hook), since the engine attaches callbacks to the current graph task.
inline void queueEngineCallback(std::function<void()> fn) {
  torch::autograd::Engine::get_default_engine().queue_callback(std::move(fn));
}

// The cudaStream_t that work on `device` is ordered on, for comm::CallOptions::stream; nullptr on
// the CPU and in CPU-only builds of libtorch.
inline void* currentStream(const c10::Device& device) {
#if DTRAIN_WITH_TORCH_CUDA
  if (device.is_cuda()) return c10::cuda::getCurrentCUDAStream(device.index()).stream();
#endif
  (void)device;
  return nullptr;
}

// Autocast's thread-local switch and lower-precision dtype for CPU or CUDA.
inline bool autocastEnabled(c10::DeviceType type) {
  return at::autocast::is_autocast_enabled(type);
}
inline void setAutocastEnabled(c10::DeviceType type, bool enabled) {
  at::autocast::set_autocast_enabled(type, enabled);
}
inline c10::ScalarType autocastDtype(c10::DeviceType type) {
  return at::autocast::get_autocast_dtype(type);
}
inline void setAutocastDtype(c10::DeviceType type, c10::ScalarType dtype) {
  at::autocast::set_autocast_dtype(type, dtype);
}

// The key of `param`'s state in `optimizer.state()`.
inline void* optimizerStateKey(const at::Tensor& param) { return param.unsafeGetTensorImpl(); }

// LRScheduler::step_count_, reached through a derived class (the standard way to name a
// protected member of another object).
struct SchedulerAccess : torch::optim::LRScheduler {
  static unsigned& stepCount(torch::optim::LRScheduler& scheduler) {
    return scheduler.*(&SchedulerAccess::step_count_);
  }
};
inline unsigned& schedulerStepCount(torch::optim::LRScheduler& scheduler) {
  return SchedulerAccess::stepCount(scheduler);
}

}  // namespace dtrain::compat
