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
#include <mutex>
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
#include "membership.h"

namespace dtrain::testing::node_loss_checkpoint_test {
namespace {

constexpr int kNodes = 3;
constexpr int kPerNode = 2;
constexpr int kSteps = 6;
constexpr int kLoss = 3;
constexpr int64_t kGlobalBatch = 12;
constexpr size_t kSamples = 120;

at::Tensor input(size_t i) {
  return torch::sin(torch::arange(8, torch::kFloat) * 0.37 + static_cast<double>(i) * 0.11);
}
at::Tensor target(size_t i) { return torch::cos(torch::arange(2, torch::kFloat) + i * 0.05); }

torch::nn::Sequential makeNet() {
  // The seed and the draws under one lock: the ranks are threads, and libtorch's default
  // generator is one for the process -- unguarded, their draws would interleave and rank 0's
  // model (which DDP broadcasts) would differ from the reference's.
  static std::mutex generator;
  std::lock_guard<std::mutex> lock(generator);
  torch::manual_seed(7);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                               torch::nn::Linear(16, 2));
}

void stepOn(torch::nn::Sequential& net, DistributedDataParallel<torch::nn::Sequential>* ddp,
            const std::vector<size_t>& indices) {
  std::vector<at::Tensor> xs, ys;
  for (size_t i : indices) {
    xs.push_back(input(i));
    ys.push_back(target(i));
  }
  auto out = ddp ? (*ddp)(torch::stack(xs)) : net->forward(torch::stack(xs));
  torch::mse_loss(out, torch::stack(ys)).backward();
}

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
      InitOptions o;
      o.backend = "gloo";
      o.sharedMemory = false;
      o.rank = rank;
      o.worldSize = kNodes * kPerNode;
      o.localRank = rank % kPerNode;
      o.store = store;
      o.node = "node" + std::to_string(node);
      o.reformOnNodeLoss = true;
      o.nodeId = std::to_string(node);
      o.hostMemoryCache = false;
      o.timeout = std::chrono::seconds(60);
      auto group = init(o);
      auto net = makeNet();
      DistributedDataParallel<torch::nn::Sequential> ddp(net, group);
      torch::optim::SGD sgd(ddp.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
      DistributedSampler sampler(kSamples, group->size(), group->rank());
      auto state = std::make_shared<TrainingState>(group);
      state->addModule("net", net);
      state->addOptimizer("sgd", sgd);
      state->addSampler("data", sampler);
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
          stepOn(net, &ddp, *sampler.next(static_cast<size_t>(kGlobalBatch / group->size())));
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
  membership::Epoch e;
  e.epoch = 1;
  e.worldSize = 4;
  e.nodes = {{"0", 0, 2}, {"1", 2, 2}};
  e.why = "node 2 (test) went silent";
  epochWrittenNs = std::chrono::steady_clock::now().time_since_epoch().count();
  store->set(membership::epochKey(), store::toBytes(membership::encodeEpoch(e)));
  for (auto& t : threads) t.join();
  lostCkpt.clear();
  for (auto& g : lost) {
    if (g) g->shutdown();
  }

  auto reference = makeNet();
  torch::optim::SGD sgd(reference->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  DistributedSampler all(kSamples, 1, 0);
  for (int step = 0; step < kSteps; ++step) {
    sgd.zero_grad();
    stepOn(reference, nullptr, *all.next(static_cast<size_t>(kGlobalBatch)));
    sgd.step();
  }
  const auto expected = reference->parameters();
  for (int rank = 0; rank < 4; ++rank) {
    const RankResult& r = results[static_cast<size_t>(rank)];
    EXPECT_EQ(r.finalSize, 4);
    EXPECT_EQ(r.discarded, 1) << "rank " << rank;
    EXPECT_GE(r.abortedAfterEpochMs, 0);
    EXPECT_LT(r.abortedAfterEpochMs, 1000) << "rank " << rank << " left the agreement late";
    EXPECT_EQ(r.restoredStep, kSteps - 1) << "rank " << rank;
    EXPECT_EQ(r.restoredWorld, 4) << "rank " << rank;
    ASSERT_EQ(r.params.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      const double err = (r.params[i] - expected[i]).abs().max().item<double>() /
                         std::max(1e-12, expected[i].abs().max().item<double>());
      EXPECT_LE(err, 1e-5) << "rank " << rank << " parameter " << i;
      EXPECT_TRUE(torch::equal(r.params[i], results[0].params[i])) << "rank " << rank;
    }
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
