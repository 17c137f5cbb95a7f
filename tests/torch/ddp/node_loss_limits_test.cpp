// What surviving a lost node costs and where it stops (docs/training.md, "Surviving a lost node"):
// with the mode on, a step without a failure issues the same collectives and sends the same bytes
// as with it off (the commit rides on the step's own gradient sync); and under ZeRO, whose sharded
// state does not re-form yet, tryStep lets the failure through to the restart path. Ranks are
// threads over real Gloo communicators; the test writes the membership epoch as the master would.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <torch/torch.h>

#include "dtrain/base/error.h"
#include "dtrain/base/store.h"
#include "dtrain/torch/ddp.h"
#include "dtrain/torch/distributed_sampler.h"
#include "dtrain/torch/init.h"
#include "dtrain/torch/training_state.h"
#include "dtrain/torch/zero.h"
#include "node_loss_support.h"

namespace dtrain::testing::node_loss_limits_test {
namespace {

torch::nn::Sequential makeNet() {
  return seeded(3, [] {
    return torch::nn::Sequential(torch::nn::Linear(8, 32), torch::nn::ReLU(),
                                 torch::nn::Linear(32, 4));
  });
}

struct Counts {
  uint64_t collectives = 0;
  uint64_t bytes = 0;
};

// Five steps of DDP on two ranks with tryStep; rank 0's collectives and payload bytes after them.
Counts countSteps(bool reform) {
  auto store = std::make_shared<store::HashStore>();
  std::vector<Counts> counts(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      auto group = nodeLossRank(store, rank, 2, 0, rank, reform);
      EXPECT_EQ(group->reformsOnNodeLoss(), reform);
      auto net = makeNet();
      DistributedDataParallel<torch::nn::Sequential> ddp(net, group);
      torch::optim::SGD sgd(ddp.parameters(), torch::optim::SGDOptions(0.1));
      DistributedSampler sampler(64, 2, rank);
      auto state = std::make_shared<TrainingState>(group);
      state->addModule("net", net);
      state->addOptimizer("sgd", sgd);
      state->addSampler("data", sampler);
      const uint64_t before = group->communicator().sequenceNumber();
      const uint64_t bytesBefore = group->communicator().payloadBytes();
      for (int64_t step = 0; step < 5; ++step) {
        state->beginStep(step);
        ASSERT_TRUE(state->tryStep([&] {
          sgd.zero_grad();
          auto x = torch::randn({4, 8});
          torch::mse_loss(ddp(x), torch::zeros({4, 4})).backward();
        }));
        sgd.step();
      }
      counts[static_cast<size_t>(rank)] = {group->communicator().sequenceNumber() - before,
                                           group->communicator().payloadBytes() - bytesBefore};
      group->shutdown();
    });
  }
  for (auto& t : threads) t.join();
  return counts[0];
}

TEST(NodeLossLimits, AStepWithoutAFailureSendsNothingMore) {
  const Counts off = countSteps(false);
  const Counts on = countSteps(true);
  EXPECT_GT(off.collectives, 0u);
  EXPECT_EQ(on.collectives, off.collectives) << "collectives in 5 steps, mode on vs off";
  EXPECT_EQ(on.bytes, off.bytes) << "payload bytes in 5 steps, mode on vs off";
}

// Under ZeRO the survivors restore the sharded state from its mirrors (node_loss_zero_test.cpp).
// Without one, a failure takes the restart path: a program that names no step (beginStep()),
// whose state is never mirrored, or an optimizer built over a DdpCore rather than the wrapper,
// which cannot build its units again (the program names its steps; nothing is mirrored).
void expectRestartPathUnderZero(bool overCore) {
  auto store = std::make_shared<store::HashStore>();
  std::atomic<bool> rank1Waits{false};
  std::vector<std::string> thrown(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      auto group = nodeLossRank(store, rank, 2, 0, rank);
      auto net = makeNet();
      DistributedDataParallel<torch::nn::Sequential> ddp(net, group);
      ZeroOptions zo;
      zo.stage = 1;
      auto factory = optimizerFactory<torch::optim::SGD>(torch::optim::SGDOptions(0.1));
      auto sgd = overCore ? std::make_unique<ShardedOptimizer>(
                                ddp.core(), std::vector<torch::optim::OptimizerParamGroup>{},
                                factory, zo)
                          : std::make_unique<ShardedOptimizer>(ddp, factory, zo);
      EXPECT_EQ(sgd->whyNotMirrored().empty(), !overCore);
      auto state = std::make_shared<TrainingState>(group);
      state->addModule("net", net);
      state->addOptimizer("sgd", *sgd);
      try {
        for (int64_t step = 0; step < 4; ++step) {
          if (overCore) state->beginStep(step);
          state->tryStep([&] {
            sgd->zero_grad();
            torch::mse_loss(ddp(torch::ones({2, 8})), torch::zeros({2, 4})).backward();
            if (rank == 1 && step == 2) {
              rank1Waits = true;
              group->barrier();  // rank 0 never comes: only the epoch ends it
            }
          });
          sgd->step();
        }
        ADD_FAILURE() << "rank " << rank << " went on under ZeRO after its group was aborted";
      } catch (const MembershipChanged& e) {
        thrown[static_cast<size_t>(rank)] = e.what();
      }
      EXPECT_EQ(group->epoch(), 0) << "rank " << rank << " re-formed under ZeRO";
    });
  }
  while (!rank1Waits.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  publishEpoch(*store, 1, {{"0", 0, 1}, {"1", 1, 1}}, "a test's epoch");
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NE(thrown[static_cast<size_t>(rank)].find("membership changed: epoch 1"),
              std::string::npos)
        << "rank " << rank << ": " << thrown[static_cast<size_t>(rank)];
  }
}

TEST(NodeLossLimits, UnderZeroAFailureBeforeTheFirstMirrorGoesToTheRestartPath) {
  expectRestartPathUnderZero(/*overCore=*/false);
}

TEST(NodeLossLimits, UnderZeroAnOptimizerWithoutItsWrapperGoesToTheRestartPath) {
  expectRestartPathUnderZero(/*overCore=*/true);
}

}  // namespace
}  // namespace dtrain::testing::node_loss_limits_test
