// ZeRO's sharded state surviving a lost node in memory (Note [Shard mirrors] in
// runtime/torch/zero/shard_mirror.cpp), with ranks as threads over real Gloo communicators and
// the test as the launcher's master (node_loss_support.h). 3 nodes x 2 ranks train with Adam
// under ZeRO stage 1, 2 or 3 (every layer a unit; also with a frozen parameter, sharded in a
// unit of its own), mirroring every kInterval steps; node 2 stops; the survivors roll back
// to the newest generation whose blocks all survived, re-shard them for 4 ranks, run the lost
// steps again and must end equal to one process that trained every step on the whole global
// batch, the ranks bitwise equal.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "dtrain/base/error.h"
#include "dtrain/base/store.h"
#include "dtrain/torch/ddp.h"
#include "dtrain/torch/distributed_sampler.h"
#include "dtrain/torch/fully_shard.h"
#include "dtrain/torch/init.h"
#include "dtrain/torch/training_state.h"
#include "dtrain/torch/zero.h"
#include "node_loss_support.h"

namespace dtrain::testing::node_loss_zero_test {
namespace {

constexpr int kNodes = 3;
constexpr int kPerNode = 2;
constexpr int kSteps = 7;
constexpr int kInterval = 2;  // mirrored at the start of steps 0, 2, 4, ...
constexpr int64_t kGlobalBatch = 12;
constexpr size_t kSamples = 120;

torch::optim::AdamOptions adam() { return torch::optim::AdamOptions(0.01); }

// A stage, and whether the first layer's bias is frozen (at stage 3: a frozen unit).
struct Mode {
  int stage = 2;
  bool frozen = false;
};

torch::nn::Sequential makeNet(const Mode& mode) {
  torch::nn::Sequential net = makeNodeLossNet();
  if (mode.frozen) net->named_parameters()["0.bias"].set_requires_grad(false);
  return mode.stage == 3 ? shardEveryChild(net) : net;
}

// One rank: the 6-rank tests' model under DDP and a ShardedOptimizer with Adam, in units small
// enough that the model is several of them and their blocks end unevenly.
struct ZeroTrainer {
  ZeroTrainer(std::shared_ptr<ProcessGroup> g, const Mode& mode)
      : group(std::move(g)),
        net(makeNet(mode)),
        ddp(net, group),
        optimizer(ddp, optimizerFactory<torch::optim::Adam>(adam()), options(mode.stage)),
        sampler(kSamples, group->size(), group->rank()),
        state(std::make_shared<TrainingState>(group)) {
    state->addModule("net", net);
    state->addOptimizer("adam", optimizer);
    state->addSampler("data", sampler);
    state->setMirrorInterval(kInterval);
  }
  static ZeroOptions options(int stage) {
    ZeroOptions o;
    o.stage = stage;
    o.firstUnitBytes = 200;
    o.unitBytes = 300;
    return o;
  }

  std::shared_ptr<ProcessGroup> group;
  torch::nn::Sequential net;
  DistributedDataParallel<torch::nn::Sequential> ddp;
  ShardedOptimizer optimizer;
  DistributedSampler sampler;
  std::shared_ptr<TrainingState> state;
};

struct RankResult {
  std::vector<at::Tensor> params;
  int finalSize = 0;
  int discarded = 0;
  int64_t rolledBackTo = -1;
  std::string thrown;
  size_t mirrorBytes = 0;           // at the end
  size_t mirrorBytesRestored = 0;   // right after the restore, before the next refresh
  int64_t owned = 0;                // elements of this rank's blocks
  double abortedAfterEpochMs = -1;  // its first discarded step ended, after the epoch's write
  uint64_t restoreSent = 0;         // TrainingState::lastShardRestore().bytesSent, at the end
  // (param, begin, end, fields: the master and the state's) of its shard records: as built in
  // the world of 6, and at the end.
  struct Range {
    std::string param;
    int64_t begin = 0, end = 0;
    size_t fields = 0;
  };
  std::vector<Range> built, last;
};

std::vector<RankResult::Range> rangesOf(ShardedOptimizer& optimizer) {
  std::vector<RankResult::Range> out;
  for (const auto& record : optimizer.shardRecords()) {
    out.push_back({record.param, record.begin, record.end, 1 + record.state.size()});
  }
  return out;
}

// The re-shard's traffic (issue 44's "bytes moved on a loss"): every element of every field goes
// once to its new owner, from the rank that provides it, and nothing else moves. So what the
// ranks sent (TrainingState::lastShardRestore()), summed over `ranks`, is the float32 bytes of
// the elements each rank's records hold at the end and it did not provide itself -- those of the
// old ranks `provides(rank)` names, as built -- from the records' ranges alone.
void expectReshardBytes(const std::vector<RankResult>& results, int ranks,
                        const std::function<std::vector<int>(int)>& provides) {
  uint64_t expectedBytes = 0, sentBytes = 0;
  for (int rank = 0; rank < ranks; ++rank) {
    const RankResult& r = results[static_cast<size_t>(rank)];
    sentBytes += r.restoreSent;
    for (const auto& now : r.last) {
      int64_t own = 0;  // elements of `now` this rank provided itself
      for (int old : provides(rank)) {
        for (const auto& was : results[static_cast<size_t>(old)].built) {
          if (was.param != now.param) continue;
          own += std::max<int64_t>(0, std::min(was.end, now.end) - std::max(was.begin, now.begin));
        }
      }
      expectedBytes += static_cast<uint64_t>(now.end - now.begin - own) * now.fields * 4;
    }
  }
  EXPECT_GT(expectedBytes, 0u);
  EXPECT_EQ(sentBytes, expectedBytes) << "summed over " << ranks << " ranks";
}

// Trains `t` from step `first` to kSteps through tryStep, filling `r`; `atStart(step)` runs after
// each beginStep and ends the rank when it returns false ("lost": it never joins a collective
// again, and its group stays open, so the survivors see silence, as from a node whose traffic is
// dropped). Then `r` takes the final parameters in the reference's order.
void train(ZeroTrainer& t, RankResult& r, int64_t first, const std::atomic<int64_t>& epochWrittenNs,
           const std::function<bool(int64_t)>& atStart,
           const std::function<void(int64_t)>& beforeOptimizerStep = nullptr) {
  ProcessGroup& group = *t.group;
  try {
    for (int64_t step = first; step < kSteps;) {
      t.state->beginStep(step);
      if (!atStart(step)) return;
      const bool done = t.state->tryStep([&] {
        // libtorch's own zero_grad, as a program holding a torch::optim::Optimizer& calls it
        // (train_gpt): it unsets the shards' gradients, not the parameters' placeholders.
        static_cast<torch::optim::Optimizer&>(t.optimizer).zero_grad();
        auto batch = t.sampler.next(static_cast<size_t>(kGlobalBatch / group.size()));
        nodeLossStep(t.net, &t.ddp, *batch);
        if (beforeOptimizerStep) beforeOptimizerStep(step);
        t.optimizer.step();
      });
      if (!done) {
        if (r.discarded == 0) {
          const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
          r.abortedAfterEpochMs = static_cast<double>(now - epochWrittenNs.load()) / 1e6;
        }
        r.mirrorBytesRestored = t.optimizer.mirrorBytes();
        ++r.discarded;
        r.rolledBackTo = t.state->currentStep();
        step = t.state->currentStep();
        continue;
      }
      ++step;
    }
  } catch (const std::exception& e) {
    r.thrown = e.what();
    r.finalSize = group.size();
    return;  // its group is not the optimizer's world any more
  }
  // In the reference's order (stage 3 frees the parameters: gathered, by name).
  std::map<std::string, at::Tensor> full;
  for (auto& [name, tensor] : gatherFullParameters(t.optimizer)) full[name] = tensor;
  for (const auto& p : t.net->named_parameters()) {
    if (!full.count(p.key())) full[p.key()] = p.value().detach().clone();  // frozen, whole
  }
  for (const auto& p : makeNodeLossNet()->named_parameters()) r.params.push_back(full.at(p.key()));
  r.finalSize = group.size();
  r.mirrorBytes = t.optimizer.mirrorBytes();
  r.owned = t.optimizer.stats().owned;
  r.restoreSent = t.state->lastShardRestore().bytesSent;
  r.last = rangesOf(t.optimizer);
}

// Runs 6 ranks; the ranks of the nodes in `lostNodes` stop at the start of step `lossStep`
// (before its mirror refresh, when it has one); once the survivors wait in that step, the test
// publishes the epoch of `survivors` (node ids). Returns every rank's result.
std::vector<RankResult> runSix(const Mode& mode, int lossStep, const std::vector<int>& lostNodes,
                               const std::vector<membership::EpochNode>& survivors,
                               size_t survivorRanks) {
  auto store = std::make_shared<store::HashStore>();
  std::vector<RankResult> results(kNodes * kPerNode);
  std::vector<std::unique_ptr<ZeroTrainer>> trainers(kNodes * kPerNode);
  std::atomic<int> waiting{0};
  std::atomic<int64_t> epochWrittenNs{0};
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kNodes * kPerNode; ++rank) {
    threads.emplace_back([&, rank] {
      const int node = rank / kPerNode;
      const bool lost = std::find(lostNodes.begin(), lostNodes.end(), node) != lostNodes.end();
      auto group = nodeLossRank(store, rank, kNodes * kPerNode, rank % kPerNode, node);
      auto& t = trainers[static_cast<size_t>(rank)];
      t = std::make_unique<ZeroTrainer>(group, mode);
      results[static_cast<size_t>(rank)].built = rangesOf(t->optimizer);
      train(*t, results[static_cast<size_t>(rank)], 0, epochWrittenNs, [&](int64_t step) {
        if (lost && step == lossStep) return false;
        if (step == lossStep && group->epoch() == 0) waiting.fetch_add(1);
        return true;
      });
    });
  }
  while (waiting.load() < static_cast<int>(survivorRanks)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  epochWrittenNs = std::chrono::steady_clock::now().time_since_epoch().count();
  publishEpoch(*store, 1, survivors, "the test's lost node(s)");
  for (auto& t : threads) t.join();
  for (auto& t : trainers) {
    if (t) t->group->shutdown();
  }
  return results;
}

// One process with Adam on the whole global batch, step by step; from step 1 at learning rate
// `laterLr` when it is set (as a scheduler would change it).
std::vector<at::Tensor> reference(const Mode& mode, double laterLr = 0) {
  auto net = makeNodeLossNet();
  if (mode.frozen) net->named_parameters()["0.bias"].set_requires_grad(false);
  std::vector<at::Tensor> trained;
  for (const auto& p : net->parameters()) {
    if (p.requires_grad()) trained.push_back(p);
  }
  torch::optim::Adam opt(trained, adam());
  DistributedSampler all(kSamples, 1, 0);
  for (int step = 0; step < kSteps; ++step) {
    if (step == 1 && laterLr > 0) opt.param_groups()[0].options().set_lr(laterLr);
    opt.zero_grad();
    nodeLossStep(net, nullptr, *all.next(static_cast<size_t>(kGlobalBatch)));
    opt.step();
  }
  std::vector<at::Tensor> out;
  for (const auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

class ZeroNodeLoss : public ::testing::TestWithParam<Mode> {};

// Node 2 lost at step 3: generation 2 (mirrored at the start of step 2) is complete -- ranks 4
// and 5's blocks on node 0 -- so steps 2 and 3 run again on 4 ranks.
TEST_P(ZeroNodeLoss, SurvivorsRollBackToTheMirrorAndMatchOneProcess) {
  const auto results = runSix(GetParam(), 3, {2}, {{"0", 0, 2}, {"1", 2, 2}}, 4);
  const auto expected = reference(GetParam());
  for (int rank = 0; rank < 4; ++rank) {
    const RankResult& r = results[static_cast<size_t>(rank)];
    EXPECT_EQ(r.thrown, "") << "rank " << rank;
    EXPECT_EQ(r.finalSize, 4) << "rank " << rank;
    EXPECT_EQ(r.discarded, 1) << "rank " << rank;
    EXPECT_EQ(r.rolledBackTo, 2) << "rank " << rank;
    expectParametersMatch(r.params, expected, results[0].params, rank);
    // Mirrored again in the new world: its own blocks and two copies of another rank's, each
    // the master and Adam's two moments in float32 (and a frozen unit's block, no moments).
    // Right after the restore the mirrors keep the new world's blocks it assembled, the memory
    // the next refresh packs the own copy into (Note [Memory of a restore]).
    if (!GetParam().frozen) {
      EXPECT_EQ(r.mirrorBytes, static_cast<size_t>(3 * 3 * 4 * r.owned)) << "rank " << rank;
      EXPECT_EQ(r.mirrorBytesRestored, static_cast<size_t>(3 * 4 * r.owned)) << "rank " << rank;
    }
  }
  // Each survivor provides its own old blocks; node 2's ranks 4 and 5 come from their mirrors on
  // node 0's ranks 0 and 1.
  expectReshardBytes(results, 4, [](int rank) {
    return rank < 2 ? std::vector<int>{rank, rank + 4} : std::vector<int>{rank};
  });
}

// Node 2 lost at the start of step 4, whose refresh is then in flight on the survivors: its
// blocks of generation 4 never came, so generation 2 is the newest complete one. The pair
// broadcasts the survivors wait in are aborted with the group's communicator: each survivor's
// step ends (discarded, re-formed, rolled back) < 1 s after the epoch.
TEST_P(ZeroNodeLoss, ALossDuringAMirrorRefreshRollsBackToTheGenerationBefore) {
  const auto results = runSix(GetParam(), 4, {2}, {{"0", 0, 2}, {"1", 2, 2}}, 4);
  const auto expected = reference(GetParam());
  for (int rank = 0; rank < 4; ++rank) {
    const RankResult& r = results[static_cast<size_t>(rank)];
    EXPECT_EQ(r.thrown, "") << "rank " << rank;
    EXPECT_EQ(r.rolledBackTo, 2) << "rank " << rank;
    EXPECT_GE(r.abortedAfterEpochMs, 0) << "rank " << rank;
    EXPECT_LT(r.abortedAfterEpochMs, 1000) << "rank " << rank << " left the refresh late";
    expectParametersMatch(r.params, expected, results[0].params, rank);
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroNodeLoss,
                         ::testing::Values(Mode{1, false}, Mode{2, false}, Mode{3, false},
                                           Mode{3, true}),
                         [](const auto& info) {
                           return "Stage" + std::to_string(info.param.stage) +
                                  (info.param.frozen ? "Frozen" : "");
                         });

// A node joins the running round under ZeRO (Note [Joining a running round] in
// launcher/cluster/master/node_loss.h): 2 nodes x 2 ranks train; at the start of step 3 the test
// publishes epoch 1 with a third node, whose 2 ranks start then, taken in; the members wait in
// step 3 until the newcomers' first tryStep makes the epoch take effect. The members' step 3
// fails in its gradient sync (the epoch aborted their communicator), before the optimizer changed
// anything: their blocks as they are are those of step 3's start (ShardMirror::keepLive), a
// generation no rank lost, so they re-shard it for 6 ranks -- not the mirror of step 2 -- the
// newcomers receiving their blocks from them and the replicated state from rank 0; the newcomers'
// first tryStep returns false at step 3 too. All 6 run steps 3..6 and end equal to one process on
// the whole global batch, bitwise equal, mirrored again in the 6-rank world. The
// members changed the learning rate at step 1, as a scheduler would: the newcomers' comes with
// the replicated state. A newcomer makes no collective before its first tryStep: its optimizer is
// built alone.
constexpr int kJoin = 3;
constexpr int kMembers = 4;
constexpr double kLaterLr = 0.02;
constexpr int kWorld = kNodes * kPerNode;

struct JoinResult {
  std::vector<RankResult> ranks;
  std::vector<uint64_t> collectivesBeforeTryStep;
};

// The members wait for the join's epoch at the boundary of step kJoin, where they re-form with
// the newcomers (Note [Joins at step boundaries]), or, `inOptimizerStep`, once its backward is
// done, before its optimizer step, for the epoch to abort their communicator: a join that cuts a
// step short (DTRAIN_JOIN_WAIT=0 here; a step longer than it, or a rank past the boundary).
JoinResult runJoin(const Mode& mode, bool inOptimizerStep) {
  if (inOptimizerStep) ::setenv("DTRAIN_JOIN_WAIT", "0", 1);
  auto store = std::make_shared<store::HashStore>();
  JoinResult out;
  out.ranks.resize(kWorld);
  out.collectivesBeforeTryStep.assign(kWorld, 0);
  std::vector<std::unique_ptr<ZeroTrainer>> trainers(kWorld);
  std::atomic<int> waiting{0};
  std::atomic<int64_t> epochWrittenNs{0};
  std::vector<std::thread> threads;
  auto start = [&](int rank, int world, int joinEpoch) {
    threads.emplace_back([&, rank, world, joinEpoch] {
      auto group = nodeLossRank(store, rank, world, rank % kPerNode, rank / kPerNode,
                                /*reform=*/true, joinEpoch);
      auto& t = trainers[static_cast<size_t>(rank)];
      t = std::make_unique<ZeroTrainer>(group, mode);
      out.collectivesBeforeTryStep[static_cast<size_t>(rank)] =
          group->communicator().sequenceNumber();
      out.ranks[static_cast<size_t>(rank)].built = rangesOf(t->optimizer);
      auto waitForTheEpoch = [&] {
        waiting.fetch_add(1);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while ((inOptimizerStep ? group->communicator().error() == nullptr : !group->joinReady()) &&
               std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      };
      train(
          *t, out.ranks[static_cast<size_t>(rank)], 0, epochWrittenNs,
          [&](int64_t step) {
            if (step == 1 && group->epoch() == 0) {
              t->optimizer.param_groups()[0].options().set_lr(kLaterLr);
            }
            if (step == kJoin && group->epoch() == 0 && !inOptimizerStep) waitForTheEpoch();
            return true;
          },
          [&](int64_t step) {
            if (step == kJoin && group->epoch() == 0 && inOptimizerStep) waitForTheEpoch();
          });
    });
  };
  for (int rank = 0; rank < kMembers; ++rank) start(rank, kMembers, 0);
  while (waiting.load() < kMembers) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  epochWrittenNs = std::chrono::steady_clock::now().time_since_epoch().count();
  publishEpoch(*store, 1, {{"0", 0, 2}, {"1", 2, 2}, {"2", 4, 2}}, "the test's joining node",
               /*joining=*/2);
  for (int rank = kMembers; rank < kWorld; ++rank) start(rank, kWorld, 1);
  for (auto& t : threads) t.join();
  for (auto& t : trainers) {
    if (t) t->group->shutdown();
  }
  ::unsetenv("DTRAIN_JOIN_WAIT");
  return out;
}

// Every rank ends as one process on the whole batch, having run again from step `rolledBackTo`.
void expectJoined(const JoinResult& out, const Mode& mode, int64_t rolledBackTo) {
  const auto expected = reference(mode, kLaterLr);
  for (int rank = 0; rank < kWorld; ++rank) {
    const RankResult& r = out.ranks[static_cast<size_t>(rank)];
    EXPECT_EQ(r.thrown, "") << "rank " << rank;
    EXPECT_EQ(r.finalSize, kWorld) << "rank " << rank;
    EXPECT_EQ(r.discarded, 1) << "rank " << rank;
    EXPECT_EQ(r.rolledBackTo, rolledBackTo) << "rank " << rank;
    expectParametersMatch(r.params, expected, out.ranks[0].params, rank);
    if (!mode.frozen) {
      EXPECT_EQ(r.mirrorBytes, static_cast<size_t>(3 * 3 * 4 * r.owned)) << "rank " << rank;
    }
    if (rank >= kMembers) {
      EXPECT_EQ(out.collectivesBeforeTryStep[static_cast<size_t>(rank)], 0u)
          << "newcomer " << rank << " made a collective before its first tryStep";
    }
  }
  // Each member provides its own blocks (no block was lost); the newcomers send nothing.
  for (int rank = kMembers; rank < kWorld; ++rank) {
    EXPECT_EQ(out.ranks[static_cast<size_t>(rank)].restoreSent, 0u) << "newcomer " << rank;
  }
  expectReshardBytes(out.ranks, kWorld, [](int rank) {
    return rank < kMembers ? std::vector<int>{rank} : std::vector<int>{};
  });
}

class ZeroNodeJoin : public ::testing::TestWithParam<Mode> {};

TEST_P(ZeroNodeJoin, NewcomersReceiveTheirShardsAndAllMatchOneProcess) {
  expectJoined(runJoin(GetParam(), /*inOptimizerStep=*/false), GetParam(), kJoin);
}

// The join's epoch comes while the members are in their optimizer step (stages 1 and 2: its
// all-gathers fail after the first unit stepped): their blocks are no longer the step's start,
// so they keep none, and the newest generation is the mirror of step 2.
TEST_P(ZeroNodeJoin, AJoinInTheOptimizerStepRestoresTheMirror) {
  if (GetParam().stage == 3) GTEST_SKIP() << "stage 3's step makes no collective";
  expectJoined(runJoin(GetParam(), /*inOptimizerStep=*/true), GetParam(), 2);
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroNodeJoin,
                         ::testing::Values(Mode{1, false}, Mode{2, false}, Mode{3, false},
                                           Mode{3, true}),
                         [](const auto& info) {
                           return "Stage" + std::to_string(info.param.stage) +
                                  (info.param.frozen ? "Frozen" : "");
                         });

// Nodes 1 and 2 lost together: node 1's blocks were mirrored on node 2, so ranks 2 and 3's
// blocks are nowhere. The survivors re-form, find no complete generation and take the restart
// path: tryStep throws, naming the ranks.
TEST(ZeroNodeLossLimits, LosingARankAndItsMirrorTakesTheRestartPath) {
  const auto results = runSix(Mode{2, false}, 3, {1, 2}, {{"0", 0, 2}}, 2);
  for (int rank = 0; rank < 2; ++rank) {
    const RankResult& r = results[static_cast<size_t>(rank)];
    EXPECT_NE(r.thrown.find("rank(s) 2, 3 of the old world"), std::string::npos)
        << "rank " << rank << ": " << r.thrown;
    EXPECT_EQ(r.finalSize, 2) << "rank " << rank;
    EXPECT_EQ(r.discarded, 0) << "rank " << rank;
  }
}

}  // namespace
}  // namespace dtrain::testing::node_loss_zero_test
