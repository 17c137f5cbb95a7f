#include "dtrain/torch/grad_scaler.h"

#include <atomic>
#include <cmath>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/optim/optimizer.h>

#include "dtrain/base/error.h"
#include "dtrain/torch/process_group.h"

// Note [Agreeing on overflow]
// PyTorch's GradScaler relies on DDP's allreduce to spread an inf: a NaN in one rank's gradient
// becomes a NaN in the average on every rank, so every rank skips. That holds only while the
// poisoned value goes through the allreduce. An overflow that appears after it -- in unscaling,
// in a rank-local gradient (a parameter outside DDP, a clipping hook) or from a faulty device --
// makes one rank skip while the others step, and the replicas silently drift apart. So, like
// PyTorch's ShardedGradScaler, unscale() combines found_inf over the ranks with a MAX allreduce
// of one float: every rank skips the same steps. Cost: one tiny collective per optimizer step.

namespace dtrain {

namespace {

// found |= any non-finite in p[0..n); p *= inv, in float (double for double), as ATen's kernel.
template <typename T, typename Math>
bool unscaleSpan(T* p, int64_t n, Math inv) {
  std::atomic<bool> bad{false};
  at::parallel_for(0, n, 1 << 15, [&](int64_t begin, int64_t end) {
    bool localBad = false;
    for (int64_t i = begin; i < end; ++i) {
      Math v = static_cast<Math>(p[i]);
      localBad |= !std::isfinite(v);
      p[i] = static_cast<T>(v * inv);
    }
    if (localBad) bad = true;
  });
  return bad;
}

// The CPU's unscale and inf/NaN check: a portable loop over the gradient's elements.
bool unscaleCpu(at::Tensor& grad, float inv) {
  if (grad.is_contiguous()) {
    switch (grad.scalar_type()) {
      case at::kFloat: return unscaleSpan(grad.data_ptr<float>(), grad.numel(), inv);
      case at::kDouble:
        return unscaleSpan(grad.data_ptr<double>(), grad.numel(), static_cast<double>(inv));
      case at::kHalf: return unscaleSpan(grad.data_ptr<at::Half>(), grad.numel(), inv);
      case at::kBFloat16: return unscaleSpan(grad.data_ptr<at::BFloat16>(), grad.numel(), inv);
      default: break;
    }
  }
  bool bad = !at::isfinite(grad).all().item<bool>();
  grad.mul_(inv);
  return bad;
}

}  // namespace

bool GradScalerState::operator==(const GradScalerState& o) const {
  return scale == o.scale && growthFactor == o.growthFactor && backoffFactor == o.backoffFactor &&
         growthInterval == o.growthInterval && growthTracker == o.growthTracker;
}

GradScaler::GradScaler(std::shared_ptr<ProcessGroup> group, GradScalerOptions options)
    : group_(std::move(group)), options_(options), initScale_(options.initScale) {
  DTRAIN_CHECK_ARG(options_.initScale > 0 && std::isfinite(options_.initScale),
                   "GradScaler: initScale {} must be positive and finite", options_.initScale);
  DTRAIN_CHECK_ARG(options_.growthFactor > 1.0, "GradScaler: growthFactor {} must be > 1",
                   options_.growthFactor);
  DTRAIN_CHECK_ARG(options_.backoffFactor > 0 && options_.backoffFactor < 1.0,
                   "GradScaler: backoffFactor {} must be in (0, 1)", options_.backoffFactor);
  DTRAIN_CHECK_ARG(options_.growthInterval >= 1, "GradScaler: growthInterval {} must be >= 1",
                   options_.growthInterval);
}

GradScaler::~GradScaler() = default;

void GradScaler::ensureScale(const at::Device& device) {
  if (!scale_.defined()) {
    auto opts = at::TensorOptions().device(device);
    scale_ = at::full({}, initScale_, opts.dtype(at::kFloat));
    growthTracker_ = at::zeros({}, opts.dtype(at::kInt));
  } else if (scale_.device() != device) {
    scale_ = scale_.to(device);
    growthTracker_ = growthTracker_.to(device);
  }
}

at::Tensor GradScaler::scale(const at::Tensor& loss) {
  if (!options_.enabled) return loss;
  ensureScale(scale_.defined() ? scale_.device() : loss.device());
  return loss * scale_.to(loss.device(), /*non_blocking=*/true);
}

GradScaler::PerOptimizer& GradScaler::stateOf(torch::optim::Optimizer& optimizer) {
  return perOptimizer_[&optimizer];
}

void GradScaler::unscale(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  PerOptimizer& st = stateOf(optimizer);
  DTRAIN_CHECK(st.stage != Stage::Unscaled,
               "GradScaler: unscale() has already been called on this optimizer since the last "
               "update(). HINT: call unscale() at most once per optimizer and iteration");
  DTRAIN_CHECK(st.stage != Stage::Stepped,
               "GradScaler: unscale() is being called after step(). HINT: unscale(), step(), then "
               "update()");
  std::vector<at::Tensor> grads;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      const at::Tensor& g = p.grad();
      if (!g.defined()) continue;
      DTRAIN_CHECK_ARG(!g.is_sparse(), "GradScaler: sparse gradients are not supported");
      DTRAIN_CHECK_ARG(at::isFloatingType(g.scalar_type()),
                       "GradScaler: a gradient of type {} is not floating point",
                       c10::toString(g.scalar_type()));
      grads.push_back(g);
    }
  }
  at::Device device = group_ ? group_->device()
                             : (grads.empty() ? at::Device(at::kCPU) : grads[0].device());
  ensureScale(scale_.defined() ? scale_.device() : device);
  at::NoGradGuard noGrad;
  // ATen's convention: the reciprocal in double, then rounded to float.
  at::Tensor invScale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  at::Tensor found = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
  bool foundOnCpu = false;
  std::vector<at::Tensor> cuda;
  float invCpu = invScale.item<float>();
  for (auto& g : grads) {
    if (g.is_cuda()) {
      cuda.push_back(g);
    } else {
      foundOnCpu |= unscaleCpu(g, invCpu);
    }
  }
  if (!cuda.empty()) {
    // One fused launch per device and dtype, as PyTorch groups them.
    std::map<std::pair<int, int>, std::vector<at::Tensor>> byDeviceType;
    for (auto& g : cuda)
      byDeviceType[{g.device().index(), static_cast<int>(g.scalar_type())}].push_back(g);
    for (auto& [key, list] : byDeviceType) {
      at::Tensor foundHere = at::zeros({1}, list[0].options().dtype(at::kFloat));
      at::_amp_foreach_non_finite_check_and_unscale_(list, foundHere,
                                                     invScale.to(list[0].device()));
      found.add_(foundHere.to(device));
    }
  }
  if (foundOnCpu) found.add_(1.0);
  // See Note [Agreeing on overflow].
  if (group_ && group_->size() > 1) group_->allreduce(found, ReduceOp::Max);
  st.foundInf = found;
  st.stage = Stage::Unscaled;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  PerOptimizer& st = stateOf(optimizer);
  DTRAIN_CHECK(st.stage != Stage::Stepped,
               "GradScaler: step() has already been called since the last update(). HINT: call "
               "update() once per iteration, after the steps");
  if (st.stage == Stage::Ready) unscale(optimizer);
  bool overflow = st.foundInf.item<float>() > 0;
  if (!overflow) optimizer.step();
  st.stage = Stage::Stepped;
  lastSkipped_ = overflow;
  if (overflow) ++skipped_;
  return !overflow;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  at::Tensor found;
  for (auto& [opt, st] : perOptimizer_) {
    if (st.stage == Stage::Ready || !st.foundInf.defined()) continue;
    found = found.defined() ? found + st.foundInf : st.foundInf.clone();
  }
  DTRAIN_CHECK(found.defined(),
               "GradScaler: no inf checks were recorded prior to update(). HINT: call step() (or "
               "unscale()) for the optimizer before update()");
  perOptimizer_.clear();
  at::NoGradGuard noGrad;
  if (scale_.is_cuda()) {
    at::_amp_update_scale_(scale_, growthTracker_, found.to(scale_.device()), options_.growthFactor,
                           options_.backoffFactor, options_.growthInterval);
    return;
  }
  // The same arithmetic as ATen's _amp_update_scale_ kernel (float scale, int32 tracker).
  float scale = scale_.item<float>();
  int32_t tracker = growthTracker_.item<int32_t>();
  if (found.item<float>() > 0) {
    scale = static_cast<float>(scale * options_.backoffFactor);
    tracker = 0;
  } else if (tracker + 1 == options_.growthInterval) {
    float grown = static_cast<float>(scale * options_.growthFactor);
    if (std::isfinite(grown)) scale = grown;
    tracker = 0;
  } else {
    ++tracker;
  }
  scale_.fill_(scale);
  growthTracker_.fill_(tracker);
}

void GradScaler::update(double newScale) {
  if (!options_.enabled) return;
  DTRAIN_CHECK_ARG(newScale > 0 && std::isfinite(newScale),
                   "GradScaler: update({}): the new scale must be positive and finite", newScale);
  perOptimizer_.clear();
  ensureScale(scale_.defined() ? scale_.device()
                               : (group_ ? group_->device() : at::Device(at::kCPU)));
  scale_.fill_(newScale);
  growthTracker_.fill_(0);
}

double GradScaler::getScale() const {
  if (!options_.enabled) return 1.0;
  return scale_.defined() ? scale_.item<float>() : initScale_;
}

GradScalerState GradScaler::state() const {
  GradScalerState s;
  s.scale = getScale();
  s.growthFactor = options_.growthFactor;
  s.backoffFactor = options_.backoffFactor;
  s.growthInterval = options_.growthInterval;
  s.growthTracker = growthTracker_.defined() ? growthTracker_.item<int32_t>() : 0;
  return s;
}

void GradScaler::loadState(const GradScalerState& s) {
  DTRAIN_CHECK_ARG(s.scale > 0 && std::isfinite(s.scale),
                   "GradScaler: a saved scale of {} is not positive and finite", s.scale);
  DTRAIN_CHECK_ARG(s.growthFactor > 1.0 && s.backoffFactor > 0 && s.backoffFactor < 1.0 &&
                       s.growthInterval >= 1 && s.growthTracker >= 0 &&
                       s.growthTracker < s.growthInterval,
                   "GradScaler: a saved state with growth {}, backoff {}, interval {}, tracker {} "
                   "is not valid",
                   s.growthFactor, s.backoffFactor, s.growthInterval, s.growthTracker);
  options_.growthFactor = s.growthFactor;
  options_.backoffFactor = s.backoffFactor;
  options_.growthInterval = s.growthInterval;
  initScale_ = s.scale;
  ensureScale(scale_.defined() ? scale_.device()
                               : (group_ ? group_->device() : at::Device(at::kCPU)));
  scale_.fill_(s.scale);
  growthTracker_.fill_(s.growthTracker);
  perOptimizer_.clear();
  skipped_ = 0;
  lastSkipped_ = false;
}

}  // namespace dtrain
