#pragma once
// Helpers of the thread-based DDP tests: running the same training on N ranks (ProcessGroups of
// process_group_support.h) and on one process with the whole batch.

#include <functional>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "../process_group_support.h"
#include "ddp_models.h"
#include "dtrain/base/error.h"
#include "dtrain/torch/ddp.h"

namespace dtrain::testing {

constexpr double kLr = 0.05;
constexpr double kMomentum = 0.9;

inline torch::optim::SGD makeSgd(const std::vector<torch::Tensor>& params) {
  return torch::optim::SGD(params, torch::optim::SGDOptions(kLr).momentum(kMomentum));
}

// One batch of the whole (all ranks') data per step.
struct Batches {
  std::vector<torch::Tensor> inputs;
  std::vector<torch::Tensor> targets;
};

using LossFn =
    std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& target)>;

inline torch::Tensor mseLoss(const torch::Tensor& out, const torch::Tensor& target) {
  return torch::mse_loss(out, target);
}
inline torch::Tensor crossEntropy(const torch::Tensor& out, const torch::Tensor& target) {
  return torch::nn::functional::cross_entropy(out, target);
}

// Trains `net` on whole batches, one SGD-momentum step per batch.
template <typename Net>
void trainSingle(Net& net, const Batches& data, const LossFn& loss) {
  auto sgd = makeSgd(net->parameters());
  for (size_t s = 0; s < data.inputs.size(); ++s) {
    sgd.zero_grad();
    loss(net->forward(data.inputs[s]), data.targets[s]).backward();
    sgd.step();
  }
}

// Rank `rank`'s share of a whole batch.
inline torch::Tensor shard(const torch::Tensor& whole, int rank, int world) {
  int64_t per = whole.size(0) / world;
  return whole.narrow(0, rank * per, per);
}

// Models for ranks 0..world-1: rank 0's equal to `reference`, the others randomly different (DDP's
// construction must broadcast rank 0's).
template <typename Net>
std::vector<Net> rankModels(Net& reference, int world, const std::function<Net()>& make) {
  std::vector<Net> nets;
  for (int r = 0; r < world; ++r) {
    nets.push_back(make());
    if (r == 0) copyState(*reference, *nets.back());
  }
  return nets;
}

}  // namespace dtrain::testing
