// dtrain::clipGradNorm (dtrain/torch/zero.h): gradient clipping by the norm over every rank's
// shards -- the norm of the whole model's averaged gradient, what torch::nn::utils::
// clip_grad_norm_ computes over a full model -- with one allreduce of one number.
#include <ATen/ATen.h>

#include "collectives.h"
#include "dtrain/base/error.h"
#include "dtrain/torch/zero.h"
#include "shard_group.h"

namespace dtrain {

double clipGradNorm(ShardedOptimizer& optimizer, double maxNorm, double normType) {
  DTRAIN_CHECK_ARG(normType > 0, "clipGradNorm: normType {} must be positive (or infinity)",
                   normType);
  std::vector<at::Tensor> grads;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      if (p.grad().defined()) grads.push_back(p.grad());
    }
  }
  zero::ShardGroup& shards = optimizer.shards();
  const double norm = zero::globalNorm(shards.group().communicator(), grads, normType,
                                       shards.group().device(), optimizer.options().timeout);
  const double coef = maxNorm / (norm + 1e-6);  // torch::nn::utils::clip_grad_norm_'s
  if (coef < 1) {
    at::NoGradGuard noGrad;
    for (auto& g : grads) g.mul_(coef);
  }
  return norm;
}

}  // namespace dtrain
