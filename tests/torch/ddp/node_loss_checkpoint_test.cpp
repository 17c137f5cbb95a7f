// A Checkpointer across a re-form (Note [A Checkpointer follows its group's epoch] in
// runtime/torch/checkpoint/checkpointer.cpp), with ranks as threads over real Gloo and the test
// as the launcher's master, as node_loss_test.cpp: 3 nodes x 2 ranks save asynchronously at the
// start of every step, inside tryStep's work. Node 2's ranks vanish at step kLoss before its save
// call, so the survivors wait in that save's agreement on the store (the previous save's outcome)
// for ranks that never come, until the epoch aborts the group (Note [Agreements a lost node
// cannot hold up]). They discard the step, re-form as 4 ranks, agree on the pending save among
// themselves, save at world size 4 and restore the last step at world size 4.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <torch/torch.h>

#include "dtrain/base/error.h"
#include "dtrain/base/store.h"
#include "dtrain/torch/checkpoint.h"
#include "dtrain/torch/ddp.h"
#include "dtrain/torch/distributed_sampler.h"
#include "dtrain/torch/init.h"
#include "dtrain/torch/training_state.h"
#include "node_loss_support.h"

namespace dtrain::testing::node_loss_checkpoint_test {
namespace {

constexpr int kNodes = 3;
constexpr int kPerNode = 2;
constexpr int kSteps = 6;
constexpr int kLoss = 3;
constexpr int64_t kGlobalBatch = 12;
constexpr size_t kSamples = 120;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct RankResult {
  std::vector<at::Tensor> params;
  int finalSize = 0;
  int discarded = 0;
  double abortedAfterEpochMs = -1;
  int64_t restoredStep = -1;
  int restoredWorld = 0;
};

TEST(NodeLossCheckpoint, SurvivorsAgreeOnThePendingSaveAndSaveAtTheNewWorldSize) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / fmt::format("dtrain-nlck-{}", ::getpid())).string();
  std::filesystem::remove_all(dir);
  auto store = std::make_shared<store::HashStore>();
  std::vector<RankResult> results(kNodes * kPerNode);
  std::atomic<int> inLossSave{0};
  std::atomic<int64_t> epochWrittenNs{0};
  std::vector<std::shared_ptr<ProcessGroup>> lost(kNodes * kPerNode);
  std::vector<std::unique_ptr<Checkpointer>> lostCkpt(kNodes * kPerNode);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kNodes * kPerNode; ++rank) {
    threads.emplace_back([&, rank] {
      const int node = rank / kPerNode;
      auto group = nodeLossRank(store, rank, kNodes * kPerNode, rank % kPerNode, node);
      NodeLossTrainer t(group, kSamples);
      auto& net = t.net;
      auto& ddp = t.ddp;
      auto& sgd = t.sgd;
      auto& sampler = t.sampler;
      auto& state = t.state;
      CheckpointOptions co(dir);
      co.nodeId = node;
      co.localRank = rank % kPerNode;
      co.handlePreemption = false;
      co.timeout = std::chrono::seconds(30);
      co.keepLast = 10;
      auto ckpt = std::make_unique<Checkpointer>(state, co);
      RankResult& r = results[static_cast<size_t>(rank)];
      for (int64_t step = 0; step < kSteps;) {
        state->beginStep(step);
        if (node == 2 && step == kLoss) {
          // "Lost": never in a collective or an agreement again (its writer finishes the save
          // of step kLoss - 2 on its own).
          lost[static_cast<size_t>(rank)] = group;
          lostCkpt[static_cast<size_t>(rank)] = std::move(ckpt);
          return;
        }
        const bool done = state->tryStep([&] {
          if (step > 0) {
            if (step == kLoss && group->epoch() == 0) inLossSave.fetch_add(1);
            ckpt->saveAsync(step - 1);  // agrees on the save of step - 2 first
          }
          sgd.zero_grad();
          nodeLossStep(net, &ddp, *sampler.next(static_cast<size_t>(kGlobalBatch / group->size())));
        });
        if (!done) {
          if (r.discarded++ == 0) {
            r.abortedAfterEpochMs = (std::chrono::steady_clock::now().time_since_epoch().count() -
                                     epochWrittenNs.load()) /
                                    1e6;
          }
          step = state->currentStep();
          continue;
        }
        sgd.step();
        ++step;
      }
      ckpt->save(kSteps - 1);
      auto restored = ckpt->restore();
      if (restored) {
        r.restoredStep = restored->step;
        r.restoredWorld = restored->savedWorldSize;
      }
      for (const auto& p : net->parameters()) r.params.push_back(p.detach().clone());
      r.finalSize = group->size();
      ckpt.reset();
      group->shutdown();
    });
  }
  while (inLossSave.load() < 4) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  epochWrittenNs = std::chrono::steady_clock::now().time_since_epoch().count();
  publishEpoch(*store, 1, {{"0", 0, 2}, {"1", 2, 2}}, "node 2 (test) went silent");
  for (auto& t : threads) t.join();
  lostCkpt.clear();
  for (auto& g : lost) {
    if (g) g->shutdown();
  }

  const auto expected = oneProcessParameters(kSamples, kSteps, kGlobalBatch);
  for (int rank = 0; rank < 4; ++rank) {
    const RankResult& r = results[static_cast<size_t>(rank)];
    EXPECT_EQ(r.finalSize, 4);
    EXPECT_EQ(r.discarded, 1) << "rank " << rank;
    EXPECT_GE(r.abortedAfterEpochMs, 0);
    EXPECT_LT(r.abortedAfterEpochMs, 1000) << "rank " << rank << " left the agreement late";
    EXPECT_EQ(r.restoredStep, kSteps - 1) << "rank " << rank;
    EXPECT_EQ(r.restoredWorld, 4) << "rank " << rank;
    expectParametersMatch(r.params, expected, results[0].params, rank);
  }
  // The survivors' nodes: the step pending at the loss agreed and kept, the last at world 4.
  for (int node = 0; node < 2; ++node) {
    const std::string d = fmt::format("{}/node{}", dir, node);
    EXPECT_EQ(slurp(d + "/LATEST"), fmt::format("step-{:08d}\n", kSteps - 1)) << d;
    EXPECT_TRUE(std::filesystem::exists(fmt::format("{}/step-{:08d}", d, kLoss - 2))) << d;
  }
  EXPECT_EQ(slurp(dir + "/node2/LATEST"), fmt::format("step-{:08d}\n", kLoss - 2));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dtrain::testing::node_loss_checkpoint_test
