#pragma once
// The sample trainers' learning-rate schedule: a linear warm-up, then half a cosine down to zero.

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <torch/optim/optimizer.h>

namespace examples {

// Linear from ~0 to `peak` over `warmup` steps, then half a cosine to 0 at step `total`.
inline double learningRate(double peak, int64_t step, int64_t warmup, int64_t total) {
  if (step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const double progress = static_cast<double>(step - warmup) /
                          static_cast<double>(std::max<int64_t>(1, total - warmup));
  return 0.5 * peak * (1.0 + std::cos(M_PI * std::min(1.0, progress)));
}

// Sets every group's rate, whatever the optimizer (a ShardedOptimizer included).
inline void setLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace examples
