// A lost node that leaves a world which does not divide the global batch: 5 ranks (one per node)
// train 10 samples a step, 2 each; node 4 is lost at step 2 and the 4 survivors split the same 10
// as 3, 3, 2, 2 (DistributedSampler::nextShare), each loss weighted by sampleWeight() so that
// DDP's mean over ranks is the mean over samples. The survivors must end bitwise equal and within
// 1e-5 of one process that trained every step on all 10. Ranks are threads over real Gloo; the
// test writes the membership epoch as the master would.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <torch/torch.h>

#include "dtrain/base/store.h"
#include "dtrain/torch/ddp.h"
#include "dtrain/torch/distributed_sampler.h"
#include "dtrain/torch/init.h"
#include "dtrain/torch/training_state.h"
#include "node_loss_support.h"

namespace dtrain::testing::node_loss_uneven_test {
namespace {

constexpr int kRanks = 5;
constexpr int kSteps = 6;
constexpr int kLoss = 2;
constexpr size_t kGlobalBatch = 10;
constexpr size_t kSamples = 100;

at::Tensor input(size_t i) {
  return torch::cos(torch::arange(6, torch::kFloat) * 0.29 + static_cast<double>(i) * 0.17);
}
at::Tensor target(size_t i) { return torch::sin(torch::arange(3, torch::kFloat) * 0.5 + i * 0.07); }

torch::nn::Sequential makeNet() {
  return seeded(11, [] {
    return torch::nn::Sequential(torch::nn::Linear(6, 12), torch::nn::Tanh(),
                                 torch::nn::Linear(12, 3));
  });
}

at::Tensor lossOf(torch::nn::Sequential& net, DistributedDataParallel<torch::nn::Sequential>* ddp,
                  const std::vector<size_t>& indices) {
  std::vector<at::Tensor> xs, ys;
  for (size_t i : indices) {
    xs.push_back(input(i));
    ys.push_back(target(i));
  }
  auto out = ddp ? (*ddp)(torch::stack(xs)) : net->forward(torch::stack(xs));
  return torch::mse_loss(out, torch::stack(ys));
}

TEST(NodeLossUneven, SurvivorsSplitTheGlobalBatchUnevenlyAndAverageBySamples) {
  auto store = std::make_shared<store::HashStore>();
  std::vector<std::vector<at::Tensor>> params(kRanks);
  std::vector<std::vector<size_t>> sharesAfter(kRanks);
  std::vector<std::shared_ptr<ProcessGroup>> lost(kRanks);
  std::atomic<int> inLossStep{0};
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      auto group = nodeLossRank(store, rank, kRanks, 0, rank);
      auto net = makeNet();
      DistributedDataParallel<torch::nn::Sequential> ddp(net, group);
      torch::optim::Adam adam(ddp.parameters(), torch::optim::AdamOptions(0.01));
      DistributedSampler sampler(kSamples, group->size(), group->rank());
      auto state = std::make_shared<TrainingState>(group);
      state->addModule("net", net);
      state->addOptimizer("adam", adam);
      state->addSampler("data", sampler);
      for (int64_t step = 0; step < kSteps;) {
        state->beginStep(step);
        if (rank == 4 && step == kLoss) {
          lost[static_cast<size_t>(rank)] = group;
          return;
        }
        const bool done = state->tryStep([&] {
          adam.zero_grad();
          auto share = *sampler.nextShare(kGlobalBatch);
          if (step == kLoss) inLossStep.fetch_add(1);
          if (group->size() == 4) sharesAfter[static_cast<size_t>(rank)].push_back(share.size());
          auto loss = lossOf(net, &ddp, share) *
                      sampleWeight(share.size(), kGlobalBatch, group->size());
          loss.backward();
        });
        if (!done) {
          step = state->currentStep();
          continue;
        }
        adam.step();
        ++step;
      }
      for (const auto& p : net->parameters())
        params[static_cast<size_t>(rank)].push_back(p.detach().clone());
      group->shutdown();
    });
  }
  while (inLossStep.load() < 4) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  publishEpoch(*store, 1, {{"0", 0, 1}, {"1", 1, 1}, {"2", 2, 1}, {"3", 3, 1}},
               "node 4 (test) went silent");
  for (auto& t : threads) t.join();
  for (auto& g : lost) {
    if (g) g->shutdown();
  }

  auto reference = makeNet();
  torch::optim::Adam adam(reference->parameters(), torch::optim::AdamOptions(0.01));
  DistributedSampler all(kSamples, 1, 0);
  for (int step = 0; step < kSteps; ++step) {
    adam.zero_grad();
    lossOf(reference, nullptr, *all.nextShare(kGlobalBatch)).backward();
    adam.step();
  }
  const auto expected = reference->parameters();
  for (int rank = 0; rank < 4; ++rank) {
    // Steps kLoss..kSteps-1 among 4: shares of 3, 3, 2, 2.
    const std::vector<size_t> want(kSteps - kLoss, rank < 2 ? 3 : 2);
    EXPECT_EQ(sharesAfter[static_cast<size_t>(rank)], want) << "rank " << rank;
    expectParametersMatch(params[static_cast<size_t>(rank)], expected, params[0], rank);
  }
}

}  // namespace
}  // namespace dtrain::testing::node_loss_uneven_test
