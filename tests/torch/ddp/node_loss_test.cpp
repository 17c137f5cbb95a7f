// Surviving a lost node in memory (issue: membership epochs, abortable collectives, steps as
// transactions), with ranks as threads over real Gloo communicators and the test as the
// launcher's master: it writes the membership epoch (runtime/base/membership.h) into the store.
// 3 nodes x 2 ranks train under DDP; node 2 goes silent at step kLoss (its ranks stop: the
// survivors hang in their gradient sync until the epoch aborts it); the survivors discard that
// step, re-form among 4 ranks and train on. The result must equal one process that trains every
// step on the whole global batch, and the survivors must be bitwise equal.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <set>
#include <thread>
#include <tuple>

#include <torch/torch.h>

#include "dtrain/base/error.h"
#include "dtrain/base/store.h"
#include "dtrain/comm/world.h"
#include "dtrain/torch/checkpoint.h"
#include "dtrain/torch/ddp.h"
#include "dtrain/torch/distributed_sampler.h"
#include "dtrain/torch/init.h"
#include "dtrain/torch/training_state.h"
#include "dtrain/torch/zero.h"
#include "node_loss_support.h"
#include "test_support.h"

namespace dtrain::testing::node_loss_test {
namespace {

constexpr int kNodes = 3;
constexpr int kPerNode = 2;
constexpr int kSteps = 6;
constexpr int kLoss = 3;              // node 2's ranks do not take part in step kLoss
constexpr int64_t kGlobalBatch = 12;  // 2 per rank of 6, 3 per rank of 4
constexpr size_t kSamples = 120;

struct RankResult {
  std::vector<at::Tensor> params;
  int finalRank = -1;
  int finalSize = 0;
  int discarded = 0;
  double abortedAfterEpochMs = -1;
};

// Waits, 30 s at most, until `done()`; a test failure naming `what` when it never is.
void awaitFor(const std::function<bool()>& done, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_TRUE(done()) << what;
}

// A member at a step boundary until its watcher holds a join ready (30 s at most): its next
// tryStep re-forms there (Note [Joins at step boundaries] in runtime/comm/world_reform.cpp).
void awaitJoinReady(const ProcessGroup& group) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!group.joinReady() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// The end of a rank's thread: its parameters, final rank and size; its group shut down.
void finishRank(RankResult& r, torch::nn::Module& net, ProcessGroup& group) {
  for (const auto& p : net.parameters()) r.params.push_back(p.detach().clone());
  r.finalRank = group.rank();
  r.finalSize = group.size();
  group.shutdown();
}

TEST(NodeLoss, SurvivorsReformAndMatchOneProcessOnTheGlobalBatch) {
  auto store = std::make_shared<store::HashStore>();
  std::vector<RankResult> results(kNodes * kPerNode);
  std::atomic<int> blockedInLoss{0};
  std::atomic<int64_t> epochWrittenNs{0};
  // The lost ranks' groups stay open until the end: their peers see no closed connection, only
  // silence, as from a node whose traffic is dropped.
  std::vector<std::shared_ptr<ProcessGroup>> lost(kNodes * kPerNode);
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
      RankResult& r = results[static_cast<size_t>(rank)];
      for (int64_t step = 0; step < kSteps;) {
        state->beginStep(step);
        if (node == 2 && step == kLoss) {
          // "Lost": its ranks never join the step's collectives again.
          lost[static_cast<size_t>(rank)] = group;
          return;
        }
        const bool done = state->tryStep([&] {
          sgd.zero_grad();
          auto batch = sampler.next(static_cast<size_t>(kGlobalBatch / group->size()));
          if (step == kLoss) blockedInLoss.fetch_add(1);
          nodeLossStep(net, &ddp, *batch);
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
      for (const auto& p : net->parameters()) r.params.push_back(p.detach().clone());
      r.finalRank = group->rank();
      r.finalSize = group->size();
      group->shutdown();
    });
  }
  // The master: once the survivors are inside step kLoss, node 2 is declared lost.
  while (blockedInLoss.load() < 4) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  epochWrittenNs = std::chrono::steady_clock::now().time_since_epoch().count();
  publishEpoch(*store, 1, {{"0", 0, 2}, {"1", 2, 2}}, "node 2 (test) went silent");
  for (auto& t : threads) t.join();
  for (auto& g : lost) {
    if (g) g->shutdown();
  }

  EXPECT_EQ(store->add(membership::formedKey(1), 0), 4) << "every survivor re-formed once";
  const auto expected = oneProcessParameters(kSamples, kSteps, kGlobalBatch);
  for (int rank = 0; rank < 4; ++rank) {
    const RankResult& r = results[static_cast<size_t>(rank)];
    EXPECT_EQ(r.finalRank, rank);
    EXPECT_EQ(r.finalSize, 4);
    EXPECT_EQ(r.discarded, 1) << "rank " << rank << " discarded the step of the loss once";
    EXPECT_GE(r.abortedAfterEpochMs, 0);
    EXPECT_LT(r.abortedAfterEpochMs, 1000) << "rank " << rank << " left its allreduce late";
    expectParametersMatch(r.params, expected, results[0].params, rank);
  }
}

// The disagreement a step can leave (Note [Settling after a re-form]): rank 0 finishes step
// kLoss and applies it while rank 1's step fails (here: rank 1 waits in a barrier rank 0 never
// joins, until an epoch of the same two nodes aborts it). Rank 0 then fails in step kLoss + 1,
// both re-form, and rank 0 -- a step ahead -- hands its parameters, momentum, schedule and
// sampler position over. Both end bitwise equal, and equal to one process that never lost a step.
TEST(NodeLoss, AMemberOneStepAheadHandsItsStateOver) {
  auto store = std::make_shared<store::HashStore>();
  std::vector<RankResult> results(2);
  std::atomic<bool> rank1Waits{false};
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      auto group = nodeLossRank(store, rank, 2, 0, rank);
      auto net = makeNodeLossNet();
      DistributedDataParallel<torch::nn::Sequential> ddp(net, group);
      torch::optim::SGD sgd(ddp.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
      torch::optim::StepLR schedule(sgd, /*step_size=*/2, /*gamma=*/0.5);
      DistributedSampler sampler(kSamples, group->size(), group->rank());
      auto state = std::make_shared<TrainingState>(group);
      state->addModule("net", net);
      state->addOptimizer("sgd", sgd);
      state->addScheduler("lr", schedule);
      state->addSampler("data", sampler);
      RankResult& r = results[static_cast<size_t>(rank)];
      for (int64_t step = 0; step < kSteps;) {
        state->beginStep(step);
        const bool done = state->tryStep([&] {
          sgd.zero_grad();
          auto batch = sampler.next(static_cast<size_t>(kGlobalBatch / group->size()));
          nodeLossStep(net, &ddp, *batch);
          if (rank == 1 && step == kLoss && group->epoch() == 0) {
            rank1Waits = true;
            group->barrier();  // rank 0 never comes: only the epoch ends it
          }
        });
        if (!done) {
          ++r.discarded;
          step = state->currentStep();
          continue;
        }
        sgd.step();
        schedule.step();
        ++step;
      }
      for (const auto& p : net->parameters()) r.params.push_back(p.detach().clone());
      r.finalRank = group->rank();
      r.finalSize = group->size();
      group->shutdown();
    });
  }
  while (!rank1Waits.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  publishEpoch(*store, 1, {{"0", 0, 1}, {"1", 1, 1}}, "a test's epoch of the same nodes");
  for (auto& t : threads) t.join();

  auto reference = makeNodeLossNet();
  torch::optim::SGD sgd(reference->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::StepLR schedule(sgd, /*step_size=*/2, /*gamma=*/0.5);
  DistributedSampler all(kSamples, 1, 0);
  for (int step = 0; step < kSteps; ++step) {
    sgd.zero_grad();
    nodeLossStep(reference, nullptr, *all.next(static_cast<size_t>(kGlobalBatch)));
    sgd.step();
    schedule.step();
  }
  const auto expected = reference->parameters();
  EXPECT_EQ(results[0].discarded, 1) << "rank 0 discards step kLoss + 1";
  EXPECT_EQ(results[1].discarded, 1) << "rank 1 discards step kLoss";
  for (int rank = 0; rank < 2; ++rank) {
    const RankResult& r = results[static_cast<size_t>(rank)];
    expectParametersMatch(r.params, expected, results[0].params, rank);
  }
}

// The program's subgroups under the mode (Communicator::abortWithGroups, TrainingState's
// membershipChanged). 4 nodes x 1 rank; nodes 2 and 3 are lost after step 0. Rank 0 waits in a
// subgroup with silent rank 3 -- only the epoch's abort of the world's groups ends it (before,
// the subgroup's timeout); rank 1's subgroup with rank 2 fails first, rank 2 having closed it --
// a subgroup failed with the world healthy, a loss still (before, rethrown: a program error that
// restarts the job). Both discard the step and re-form. The stale subgroups, used after the
// re-form, fail at once naming what to do (not after DTRAIN_NODE_LOSS_WAIT); one made from the
// re-formed group works.
TEST(NodeLoss, SubgroupsAreAbortedWithTheWorldAndAStaleOneIsNamed) {
  auto store = std::make_shared<store::HashStore>();
  constexpr int kRanks = 4;
  std::vector<std::shared_ptr<ProcessGroup>> groups(kRanks);
  std::vector<std::shared_ptr<ProcessGroup>> pairs(kRanks);
  std::atomic<int> firstStepDone{0};
  std::atomic<bool> rank0Blocked{false};
  std::atomic<bool> rank1SawItFail{false};
  std::atomic<bool> lostMayGo{false};
  struct Survivor {
    bool discarded = false;
    double leftMs = -1;  // from the epoch's publication
    int size = 0;
    std::string stale;
    double staleMs = -1;
    float fresh = 0;
    std::string unexpected;
  };
  std::vector<Survivor> survivors(2);
  std::atomic<int64_t> publishedNs{0};
  auto sinceEpochMs = [&] {
    return (std::chrono::steady_clock::now().time_since_epoch().count() - publishedNs.load()) / 1e6;
  };
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      auto group = nodeLossRank(store, rank, kRanks, 0, rank);
      groups[rank] = group;
      // {0, 3} and {1, 2}: each survivor paired with a node to be lost.
      auto a = group->newGroup({0, 3});
      auto b = group->newGroup({1, 2});
      pairs[rank] = a ? a : b;
      TrainingState state(group);
      auto one = [&] {
        at::Tensor x = at::ones({4});
        pairs[rank]->allreduce(x);
        return x[0].item<float>();
      };
      state.beginStep(0);
      EXPECT_TRUE(state.tryStep([&] { EXPECT_EQ(one(), 2.0f); }));
      ++firstStepDone;
      if (rank >= 2) {
        // Lost: rank 3 goes silent, rank 2 closes its subgroup as a killed process's sockets
        // close; both keep the rest open until the survivors are done.
        if (rank == 2) pairs[rank]->shutdown();
        while (!lostMayGo.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return;
      }
      Survivor& me = survivors[static_cast<size_t>(rank)];
      try {
        while (firstStepDone.load() < kRanks) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        state.beginStep(1);
        me.discarded = !state.tryStep([&] {
          if (rank == 0) rank0Blocked = true;
          try {
            one();
          } catch (const NetworkError&) {
            if (rank == 1) rank1SawItFail = true;
            throw;
          }
        });
        me.leftMs = sinceEpochMs();
        me.size = group->size();
        state.beginStep(state.currentStep());
        const auto start = std::chrono::steady_clock::now();
        try {
          state.tryStep([&] { one(); });
          me.stale = "(returned)";
        } catch (const InvalidArgument& e) {
          me.stale = e.what();
        }
        me.staleMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                               start)
                         .count();
        auto fresh = group->newGroup({0, 1});
        at::Tensor x = at::full({4}, static_cast<float>(group->rank() + 1));
        fresh->allreduce(x);
        me.fresh = x[0].item<float>();
        fresh->shutdown();
      } catch (const std::exception& e) {
        me.unexpected = e.what();
      }
    });
  }
  auto waitFor = [](const std::atomic<bool>& flag) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!flag.load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return flag.load();
  };
  EXPECT_TRUE(waitFor(rank0Blocked));
  EXPECT_TRUE(waitFor(rank1SawItFail)) << "rank 1's subgroup did not fail from rank 2's close";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 0 in its wait
  publishedNs = std::chrono::steady_clock::now().time_since_epoch().count();
  publishEpoch(*store, 1, {{"0", 0, 1}, {"1", 1, 1}}, "nodes 2 and 3 lost (a test's epoch)");
  threads[0].join();
  threads[1].join();
  lostMayGo = true;
  threads[2].join();
  threads[3].join();
  for (int rank = 0; rank < 2; ++rank) {
    const Survivor& me = survivors[static_cast<size_t>(rank)];
    EXPECT_EQ(me.unexpected, "") << "rank " << rank;
    EXPECT_TRUE(me.discarded) << "rank " << rank;
    EXPECT_GE(me.leftMs, 0) << "rank " << rank << " left its step before the epoch";
    EXPECT_LT(me.leftMs, 5000) << "rank " << rank << ": out of the subgroup's wait by the epoch";
    EXPECT_EQ(me.size, 2) << "rank " << rank;
    EXPECT_NE(me.stale.find("the group has re-formed since (membership epoch 1)"),
              std::string::npos)
        << me.stale;
    EXPECT_NE(me.stale.find("subgroups (split/newGroup) are not re-formed: make them again"),
              std::string::npos)
        << me.stale;
    EXPECT_LT(me.staleMs, 2000) << "rank " << rank << ": named at once, not after a wait";
    EXPECT_EQ(me.fresh, 3.0f) << "rank " << rank << ": a group made after the re-form";
  }
  for (int rank = 0; rank < kRanks; ++rank) {
    if (pairs[rank]) pairs[rank]->shutdown();
    groups[rank]->shutdown();
  }
}

// Outside the mode, tryStep is work() and true, and a failure propagates untouched.
TEST(NodeLoss, WithoutTheModeTryStepIsTheWorkItself) {
  auto store = std::make_shared<store::HashStore>();
  auto group = nodeLossRank(store, 0, 1, 0, 0, /*reform=*/false);
  EXPECT_FALSE(group->reformsOnNodeLoss());
  TrainingState state(group);
  int ran = 0;
  EXPECT_TRUE(state.tryStep([&] { ++ran; }));
  EXPECT_EQ(ran, 1);
  EXPECT_THROW(state.tryStep([] { throw NetworkError("peer gone"); }), NetworkError);
  EXPECT_TRUE(state.tryCollective([&] { ++ran; }));
  EXPECT_EQ(ran, 2);
  EXPECT_THROW(state.tryCollective([] { throw NetworkError("peer gone"); }), NetworkError);
  group->shutdown();
}

// The environment's waits (docs/design.md, "Node loss"; `launch` sets DTRAIN_NODE_LOSS_WAIT, a user
// may set DTRAIN_JOIN_WAIT): a value that is not a number of seconds is refused when the world is
// made, naming the variable and its value -- never read as 0 or as the default.
TEST(NodeLoss, AWaitThatIsNoNumberOfSecondsIsRefusedNamingIt) {
  const std::vector<std::tuple<const char*, const char*, const char*>> cases = {
      {"DTRAIN_JOIN_WAIT", "-1", "DTRAIN_JOIN_WAIT=\"-1\" is not a number of seconds (0 or more)"},
      {"DTRAIN_JOIN_WAIT", "20s", "DTRAIN_JOIN_WAIT=\"20s\" is not a number of seconds"},
      {"DTRAIN_NODE_LOSS_WAIT", "0",
       "DTRAIN_NODE_LOSS_WAIT=\"0\" is not a positive number of seconds"}};
  for (const auto& [name, value, expected] : cases) {
    ::setenv(name, value, 1);
    try {
      nodeLossRank(std::make_shared<store::HashStore>(), 0, 1, 0, 0)->shutdown();
      ADD_FAILURE() << name << "=" << value << " was taken";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
    ::unsetenv(name);
  }
  ::setenv("DTRAIN_JOIN_WAIT", "0", 1);  // 0: a join cuts the step in flight short at once
  nodeLossRank(std::make_shared<store::HashStore>(), 0, 1, 0, 0)->shutdown();
  ::unsetenv("DTRAIN_JOIN_WAIT");
}

// Note [Joining a running round]: a rank started in a running round (DTRAIN_JOIN_EPOCH, as
// `launch --on-node-join live` sets it) builds its world in that epoch and makes no collective
// before its first tryStep: neither DistributedDataParallel's construction nor a Checkpointer's
// (whose restore() gives nothing). That tryStep settles with the members -- here none but itself
// -- and returns false without running the work, at their step; the next runs the step, DDP
// making its core then. A rank whose sharded optimizer is not mirrored refuses the join in one
// error.
TEST(NodeJoin, ANewcomersFirstTryStepSettlesAndNothingBeforeItIsCollective) {
  TempDir dir;
  {
    // A checkpoint in the directory already, which a newcomer must not read.
    auto earlier = nodeLossRank(std::make_shared<store::HashStore>(), 0, 1, 0, 0);
    torch::nn::Linear saved(4, 2);
    auto savedState = std::make_shared<TrainingState>(earlier);
    savedState->addModule("model", saved.ptr());
    CheckpointOptions co(dir.path());
    co.handlePreemption = false;
    Checkpointer(savedState, co).save(0);
    earlier->shutdown();
  }
  ::setenv("DTRAIN_JOIN_EPOCH", "3", 1);
  auto store = std::make_shared<store::HashStore>();
  auto group = nodeLossRank(store, 0, 1, 0, 0);
  ::unsetenv("DTRAIN_JOIN_EPOCH");
  EXPECT_EQ(group->epoch(), 3);
  EXPECT_TRUE(group->joinPending());
  // Note [Admission when ready]: nothing connected, nothing counted, until its first tryStep.
  const auto counters = [&] {
    return store->tryMultiGet({"launch/epoch3/ready", "launch/epoch3/formed"});
  };
  EXPECT_FALSE(counters()[0].has_value()) << "ready before its first step";
  EXPECT_FALSE(counters()[1].has_value()) << "formed before its first step";
  try {
    group->barrier();
    ADD_FAILURE() << "a collective before the first step";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("barrier on rank 0/1 before its first step"),
              std::string::npos)
        << e.what();
  }
  torch::manual_seed(1);
  torch::nn::Linear net(4, 2);
  DistributedDataParallel<torch::nn::Linear> ddp(net, group);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  auto state = std::make_shared<TrainingState>(group);
  state->addModule("model", net.ptr());
  state->addOptimizer("sgd", sgd);
  CheckpointOptions co(dir.path());
  co.handlePreemption = false;
  Checkpointer ckpt(state, co);
  EXPECT_FALSE(ckpt.restore().has_value());
  bool reported = false;
  EXPECT_FALSE(state->tryCollective([&] { reported = true; }));
  EXPECT_FALSE(reported) << "a collective between steps before the settling";
  EXPECT_EQ(group->communicator().sequenceNumber(), 0u) << "a collective before the settling";
  state->beginStep(0);
  int ran = 0;
  auto work = [&] {
    ++ran;
    sgd.zero_grad();
    ddp(torch::ones({3, 4})).sum().backward();
  };
  EXPECT_FALSE(state->tryStep(work));
  EXPECT_EQ(ran, 0);
  EXPECT_FALSE(group->joinPending());
  EXPECT_EQ(store::toString(*counters()[0]), "1");
  EXPECT_EQ(store::toString(*counters()[1]), "1");
  EXPECT_EQ(state->currentStep(), 0);
  state->beginStep(0);
  EXPECT_TRUE(state->tryStep(work));
  EXPECT_EQ(ran, 1);
  EXPECT_TRUE(net->weight.grad().defined());
  ckpt.save(0);
  EXPECT_EQ(ckpt.restore()->step, 0);
  EXPECT_TRUE(state->tryCollective([&] { group->barrier(); }));
  // A membership change cuts a collective between steps short: false, for the next tryStep to
  // re-form; a program's own error propagates.
  EXPECT_THROW(state->tryCollective([] { throw InvalidArgument("the program's own"); }),
               InvalidArgument);
  group->communicator().abort("epoch 4: a test's join");
  EXPECT_FALSE(state->tryCollective([&] { group->barrier(); }));
  group->shutdown();

  // Under ZeRO the members hand a newcomer its shards from their mirrors (node_loss_zero_test's
  // ZeroNodeJoin); an optimizer that is not mirrored -- here built over a DdpCore, not through
  // the wrapper -- cannot be, and the newcomer refuses the join in one error.
  auto zeroGroup = nodeLossRank(std::make_shared<store::HashStore>(), 0, 1, 0, 0,
                                /*reform=*/true, /*joinEpoch=*/1);
  EXPECT_TRUE(zeroGroup->joinPending());
  torch::nn::Linear zeroNet(4, 2);
  DdpCore core(zeroNet.ptr(), zeroGroup, DdpOptions{});
  ShardedOptimizer adam(core, {torch::optim::OptimizerParamGroup(zeroNet->parameters())},
                        optimizerFactory<torch::optim::Adam>(torch::optim::AdamOptions()),
                        ZeroOptions{});
  TrainingState zeroState(zeroGroup);
  zeroState.addModule("model", zeroNet.ptr());
  zeroState.addOptimizer("adam", adam);
  try {
    zeroState.tryStep([] {});
    ADD_FAILURE() << "a ZeRO rank joined without mirrors";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer \"adam\" is not mirrored (it was built over "
                                         "a DdpCore"),
              std::string::npos)
        << e.what();
  }
  zeroGroup->shutdown();
}

// Note [Admission when ready] (runtime/comm/world_reform.cpp): 2 nodes x 2 ranks train under
// DDP; after their step kPublished the test publishes epoch 1 taking a third node's 2 ranks in.
// The newcomers "start up" until the members have committed step kReady: the members must train
// on meanwhile (the epoch takes effect only when both newcomers reached their first tryStep).
// Note [Joins at step boundaries]: then no member's step is cut short -- they wait at the
// boundary of step kHold for the join to be ready (else they might end before it), re-form
// there with the newcomers at 6 ranks, run no step twice, and all end bitwise equal and equal to
// one process on the whole global batch.
TEST(NodeJoin, TheMembersTrainOnUntilTheNewcomersAreReadyAndLoseNoStep) {
  constexpr int kMembers = 4;
  constexpr int kWorld = 6;
  constexpr int64_t kJoinSteps = 16;
  constexpr int64_t kPublished = 2;
  constexpr int64_t kReady = 8;
  constexpr int64_t kHold = kReady + 1;
  constexpr size_t kJoinSamples = kJoinSteps * kGlobalBatch;
  auto store = std::make_shared<store::HashStore>();
  std::vector<RankResult> results(kWorld);
  std::vector<int64_t> reformedAt(kWorld, -1);
  std::vector<int> ranTwice(kWorld, 0);
  std::atomic<int64_t> committed{-1};  // rank 0's last committed step
  std::vector<std::thread> threads;
  auto start = [&](int rank, int world, int joinEpoch) {
    threads.emplace_back([&, rank, world, joinEpoch] {
      auto group = nodeLossRank(store, rank, world, rank % 2, rank / 2, /*reform=*/true, joinEpoch);
      NodeLossTrainer t(group, kJoinSamples);
      if (joinEpoch > 0) {
        // The newcomer's start-up: its process, model and data, while the members train (they
        // would wait for it in the re-form, were they told at once: then 20 s at most).
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (committed.load() < kReady && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
      RankResult& r = results[static_cast<size_t>(rank)];
      std::set<int64_t> ran;
      for (int64_t step = 0; step < kJoinSteps;) {
        t.state->beginStep(step);
        if (step == kHold && group->size() == kMembers) {
          awaitJoinReady(*group);
        }
        const bool done = t.state->tryStep([&] {
          if (!ran.insert(step).second) ++ranTwice[static_cast<size_t>(rank)];
          t.sgd.zero_grad();
          auto batch = t.sampler.next(static_cast<size_t>(kGlobalBatch / group->size()));
          nodeLossStep(t.net, &t.ddp, *batch);
        });
        if (!done) {
          if (r.discarded++ == 0) reformedAt[static_cast<size_t>(rank)] = step;
          step = t.state->currentStep();
          continue;
        }
        t.sgd.step();
        if (rank == 0) committed = step;
        ++step;
      }
      finishRank(r, *t.net, *group);
    });
  };
  for (int rank = 0; rank < kMembers; ++rank) start(rank, kMembers, 0);
  while (committed.load() < kPublished) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  publishEpoch(*store, 1, {{"0", 0, 2}, {"1", 2, 2}, {"2", 4, 2}}, "the test's joining node",
               /*joining=*/2);
  for (int rank = kMembers; rank < kWorld; ++rank) start(rank, kWorld, 1);
  for (auto& t : threads) t.join();

  EXPECT_EQ(store->add(membership::readyKey(1), 0), 2) << "each newcomer said it was ready once";
  EXPECT_EQ(store->add(membership::formedKey(1), 0), kWorld) << "every rank formed epoch 1 once";
  const auto expected = oneProcessParameters(kJoinSamples, kJoinSteps, kGlobalBatch);
  for (int rank = 0; rank < kWorld; ++rank) {
    const RankResult& r = results[static_cast<size_t>(rank)];
    EXPECT_EQ(r.finalRank, rank);
    EXPECT_EQ(r.finalSize, kWorld);
    // One tryStep returned false on each rank: the newcomer's first, the members' at kHold.
    EXPECT_EQ(r.discarded, 1) << "rank " << rank;
    EXPECT_EQ(ranTwice[static_cast<size_t>(rank)], 0) << "rank " << rank << " ran a step twice";
    if (rank < kMembers) {
      EXPECT_EQ(reformedAt[static_cast<size_t>(rank)], kHold)
          << "member " << rank << " re-formed elsewhere than at the boundary of step " << kHold;
    }
    expectParametersMatch(r.params, expected, results[0].params, rank);
  }
}

// Note [Joins at step boundaries]: a member that began its next step before its watcher saw the
// join ready (here rank 3, let into step kHold while the others wait at its boundary) blocks in
// that step's first collective with members that never come. The others re-form at the
// boundary, aborting their old communicators, which fails rank 3's collective at once -- not
// after DTRAIN_JOIN_WAIT (45 s here) or the collective timeout (60 s): it discards the step no
// member applied and re-forms too. All 6 end bitwise equal and equal to one process.
TEST(NodeJoin, AMemberPastTheStepBoundaryIsCutShortWhenTheOthersReForm) {
  constexpr int kMembers = 4;
  constexpr int kWorld = 6;
  constexpr int64_t kJoinSteps = 12;
  constexpr int64_t kHold = 5;
  constexpr size_t kJoinSamples = kJoinSteps * kGlobalBatch;
  ::setenv("DTRAIN_JOIN_WAIT", "45", 1);
  auto store = std::make_shared<store::HashStore>();
  std::vector<RankResult> results(kWorld);
  std::vector<int> ranTwice(kWorld, 0);
  std::atomic<int> atHold{0};
  std::atomic<bool> inStep{false};        // rank 3 is in step kHold's work at 4 ranks
  std::atomic<int64_t> readyNs{0};        // when the test saw the join ready
  std::atomic<int64_t> rank3FailedNs{0};  // when rank 3's tryStep of kHold came back
  const auto nowNs = [] { return std::chrono::steady_clock::now().time_since_epoch().count(); };
  std::vector<std::thread> threads;
  auto start = [&](int rank, int world, int joinEpoch) {
    threads.emplace_back([&, rank, world, joinEpoch] {
      auto group = nodeLossRank(store, rank, world, rank % 2, rank / 2, /*reform=*/true, joinEpoch);
      NodeLossTrainer t(group, kJoinSamples);
      RankResult& r = results[static_cast<size_t>(rank)];
      std::set<int64_t> ran;
      for (int64_t step = 0; step < kJoinSteps;) {
        t.state->beginStep(step);
        const bool held = step == kHold && group->size() == kMembers;
        if (held) atHold.fetch_add(1);
        if (held && rank != 3) {
          awaitJoinReady(*group);
        }
        const bool done = t.state->tryStep([&] {
          if (!ran.insert(step).second) ++ranTwice[static_cast<size_t>(rank)];
          if (held && rank == 3) inStep = true;
          t.sgd.zero_grad();
          auto batch = t.sampler.next(static_cast<size_t>(kGlobalBatch / group->size()));
          nodeLossStep(t.net, &t.ddp, *batch);
        });
        if (held && rank == 3) rank3FailedNs = nowNs();
        if (!done) {
          ++r.discarded;
          step = t.state->currentStep();
          continue;
        }
        t.sgd.step();
        ++step;
      }
      finishRank(r, *t.net, *group);
    });
  };
  for (int rank = 0; rank < kMembers; ++rank) start(rank, kMembers, 0);
  awaitFor([&] { return atHold.load() == kMembers && inStep.load(); },
           "the members at step 5, rank 3 in its work");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // rank 3 in its allreduce
  publishEpoch(*store, 1, {{"0", 0, 2}, {"1", 2, 2}, {"2", 4, 2}}, "the test's joining node",
               /*joining=*/2);
  for (int rank = kMembers; rank < kWorld; ++rank) start(rank, kWorld, 1);
  awaitFor([&] { return store->add(membership::readyKey(1), 0) >= 2; }, "the newcomers ready");
  readyNs = nowNs();
  for (auto& t : threads) t.join();
  ::unsetenv("DTRAIN_JOIN_WAIT");

  EXPECT_EQ(store->add(membership::formedKey(1), 0), kWorld) << "every rank formed epoch 1 once";
  const double leftS = static_cast<double>(rank3FailedNs.load() - readyNs.load()) / 1e9;
  EXPECT_LT(leftS, 10.0) << "rank 3 left its step " << leftS << " s after the join was ready";
  std::printf("rank 3 left its step %.3f s after the join was ready\n", leftS);
  const auto expected = oneProcessParameters(kJoinSamples, kJoinSteps, kGlobalBatch);
  for (int rank = 0; rank < kWorld; ++rank) {
    const RankResult& r = results[static_cast<size_t>(rank)];
    EXPECT_EQ(r.finalSize, kWorld) << "rank " << rank;
    EXPECT_EQ(r.discarded, 1) << "rank " << rank;
    EXPECT_EQ(ranTwice[static_cast<size_t>(rank)], rank == 3 ? 1 : 0) << "rank " << rank;
    expectParametersMatch(r.params, expected, results[0].params, rank);
  }
}

// Note [Joining a running round] (launcher/cluster/master/node_loss.h): a member node lost while
// a join is pending, the test as the master. Nodes 0 and 1 (2 ranks each) train; epoch 1 takes
// node 2 in (its 2 ranks planned as ranks 4 and 5 of 6). One newcomer rank reaches its first
// step and counts itself ready (1 of 2); then node 1 goes silent. The master calls the join off
// (its ready counter far below 0), writes epoch 2 without node 1 (node 0 alone) and, once node 0
// trains in it, epoch 3 taking node 2 in again after it -- as ranks 2 and 3 of 4. The newcomer rank
// that had counted waits through the cancel; the other reaches its first step only after epoch
// 3 and finds its place there. All 4 end at world 4 in epoch 3, bitwise equal and equal to one
// process on the whole batch.
TEST(NodeJoin, ANewcomerFollowsACancelledJoinToTheEpochThatTakesItInAgain) {
  constexpr int64_t kJoinSteps = 16;
  constexpr size_t kJoinSamples = kJoinSteps * kGlobalBatch;
  auto store = std::make_shared<store::HashStore>();
  std::vector<RankResult> results(6);
  std::vector<std::shared_ptr<ProcessGroup>> lost(6);
  std::atomic<int64_t> committed{-1};  // rank 0's last committed step
  std::atomic<int> committedAtTwo{0};  // steps node 0's ranks committed in epoch 2
  constexpr int64_t kHold = 3;         // the members wait here for lossStep
  constexpr int64_t kJoined = 9;       // node 0 alone waits before this step for epoch 3
  constexpr int64_t kNever = 1 << 30;
  std::atomic<int64_t> lossStep{kNever};  // node 1's ranks leave before this step
  std::atomic<bool> secondMayStart{false};
  std::atomic<int> inTheLostStep{0};
  std::vector<std::thread> threads;
  auto start = [&](int rank, int world, int joinEpoch) {
    threads.emplace_back([&, rank, world, joinEpoch] {
      const int node = rank / 2;
      auto group = nodeLossRank(store, rank, world, rank % 2, node, /*reform=*/true, joinEpoch);
      NodeLossTrainer t(group, kJoinSamples);
      if (rank == 5) {
        while (!secondMayStart.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      RankResult& r = results[static_cast<size_t>(rank)];
      for (int64_t step = 0; step < kJoinSteps;) {
        t.state->beginStep(step);
        // The members wait at step kHold for the test to pick the step node 1 leaves before.
        while (step == kHold && lossStep.load() == kNever) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        if (node == 1 && step == lossStep.load()) {
          lost[static_cast<size_t>(rank)] = group;  // silent: its groups stay open
          return;
        }
        if (step == kJoined && group->size() == 2) {
          // Node 0 alone: at this boundary until epoch 3 takes effect (the newcomers ready).
          awaitJoinReady(*group);
        }
        const bool done = t.state->tryStep([&] {
          t.sgd.zero_grad();
          auto batch = t.sampler.next(static_cast<size_t>(kGlobalBatch / group->size()));
          if (step == lossStep.load() && group->size() == 4) inTheLostStep.fetch_add(1);
          nodeLossStep(t.net, &t.ddp, *batch);
        });
        if (!done) {
          ++r.discarded;
          step = t.state->currentStep();
          continue;
        }
        t.sgd.step();
        if (rank == 0) committed = step;
        if (group->size() == 2) committedAtTwo.fetch_add(1);
        ++step;
      }
      finishRank(r, *t.net, *group);
    });
  };
  const auto counter = [&](const std::string& key) { return store->add(key, 0); };
  for (int rank = 0; rank < 4; ++rank) start(rank, 4, 0);
  awaitFor([&] { return committed.load() >= 2; }, "the members trained 3 steps");
  publishEpoch(*store, 1, {{"0", 0, 2}, {"1", 2, 2}, {"2", 4, 2}}, "node 2 (test) joined",
               /*joining=*/2);
  for (int rank = 4; rank < 6; ++rank) start(rank, 6, 1);
  awaitFor([&] { return counter(membership::readyKey(1)) == 1; }, "newcomer rank 4 counted ready");
  lossStep = kHold + 1;  // every member waits before step kHold
  awaitFor([&] { return inTheLostStep.load() >= 2; }, "node 0's ranks in the step node 1 left");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const int64_t before = store->add(membership::readyKey(1), -membership::kJoinCancelled) +
                         membership::kJoinCancelled;
  EXPECT_EQ(before, 1) << "one of the join's 2 ranks was ready when it was called off";
  publishEpoch(*store, 2, {{"0", 0, 2}}, "node 1 (test) went silent");
  // Once node 0 trains at 2 ranks: epoch 3 then takes effect at a step boundary, not in its
  // settling.
  awaitFor([&] { return committedAtTwo.load() >= 2; }, "node 0 trained in epoch 2");
  publishEpoch(*store, 3, {{"0", 0, 2}, {"2", 2, 2}}, "node 2 (test) joined", /*joining=*/2);
  secondMayStart = true;
  for (auto& t : threads) t.join();
  for (auto& g : lost) {
    if (g) g->shutdown();
  }

  EXPECT_LT(counter(membership::readyKey(1)), 0) << "epoch 1 never took effect";
  EXPECT_EQ(counter(membership::readyKey(3)), 2) << "each newcomer rank ready once in epoch 3";
  EXPECT_EQ(counter(membership::formedKey(3)), 4) << "every rank formed epoch 3 once";
  EXPECT_FALSE(store->check({membership::formedKey(1)})) << "nobody formed epoch 1";
  const auto expected = oneProcessParameters(kJoinSamples, kJoinSteps, kGlobalBatch);
  for (int rank : {0, 1, 4, 5}) {
    const RankResult& r = results[static_cast<size_t>(rank)];
    EXPECT_EQ(r.finalRank, rank < 2 ? rank : rank - 2) << "rank " << rank;
    EXPECT_EQ(r.finalSize, 4) << "rank " << rank;
    expectParametersMatch(r.params, expected, results[0].params, rank);
  }
}

}  // namespace
}  // namespace dtrain::testing::node_loss_test
