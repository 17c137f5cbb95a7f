// launch --on-node-loss continue (Note [Node loss] in launcher/cluster/master/node_loss.h): the
// options, the worker environment, the decision to go on or fall back, the epoch without a node.
#include <gtest/gtest.h>

#include <ostream>

#include "dtrain/base/error.h"
#include "env_contract.h"
#include "launcher/cluster/master/node_loss.h"
#include "launcher/cluster/protocol/rendezvous.h"
#include "launcher/config/launch_args.h"
#include "launcher/node/worker_env.h"
#include "membership.h"

namespace dtrain::launcher::launcher_node_loss_test {
namespace {

TEST(OnNodeLossOptions, DefaultIsTodaysRestart) {
  const LaunchConfig c = parseLaunchArgs({"x"}, {}).config;
  EXPECT_EQ(c.onNodeLoss, OnNodeLoss::Restart);
  EXPECT_EQ(c.maxReforms, 3);
  EXPECT_EQ(c.reformWindow, 3600);
}

TEST(OnNodeLossOptions, CommandLineAndEnvironment) {
  LaunchConfig c = parseLaunchArgs({"--on-node-loss", "continue", "--max-reforms", "5",
                                    "--reform-window=60", "x"},
                                   {})
                       .config;
  EXPECT_EQ(c.onNodeLoss, OnNodeLoss::Continue);
  EXPECT_EQ(c.maxReforms, 5);
  EXPECT_EQ(c.reformWindow, 60);
  c = parseLaunchArgs(
          {"x"}, {{"DTRAIN_LAUNCH_ON_NODE_LOSS", "continue"}, {"DTRAIN_LAUNCH_MAX_REFORMS", "0"}})
          .config;
  EXPECT_EQ(c.onNodeLoss, OnNodeLoss::Continue);
  EXPECT_EQ(c.maxReforms, 0);
  // The command line wins; the agents get the option from the master.
  c = parseLaunchArgs({"--on-node-loss=restart", "x"}, {{"DTRAIN_LAUNCH_ON_NODE_LOSS", "continue"}})
          .config;
  EXPECT_EQ(c.onNodeLoss, OnNodeLoss::Restart);
  EXPECT_EQ(c.appliedOptions.back(),
            std::make_pair(std::string("on-node-loss"), std::string("restart")));
}

TEST(OnNodeLossOptions, BadValuesNameTheOptionAndTheChoices) {
  for (const char* bad : {"", "Continue", "keep", "restart,continue"}) {
    try {
      parseLaunchArgs({std::string("--on-node-loss=") + bad, "x"}, {});
      FAIL() << "accepted " << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("--on-node-loss"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("use restart"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(parseLaunchArgs({"--max-reforms", "-1", "x"}, {}), InvalidArgument);
  EXPECT_THROW(parseLaunchArgs({"--max-reforms", "two", "x"}, {}), InvalidArgument);
  EXPECT_THROW(parseLaunchArgs({"--reform-window", "0", "x"}, {}), InvalidArgument);
  EXPECT_THROW(parseLaunchArgs({"--env", "DTRAIN_ON_NODE_LOSS=continue", "x"}, {}), InvalidArgument)
      << "launch sets it";
}

TEST(OnNodeLossWorkerEnv, SetOnlyInContinueMode) {
  LaunchConfig c;
  c.heartbeatTimeout = 3;
  NodeContext node;
  node.localWorldSize = 2;
  node.worldSize = 6;
  EnvMap env = workerEnv(c, node, 0, 0);
  EXPECT_EQ(env.count(env::kOnNodeLoss), 0u);
  EXPECT_EQ(env.count(env::kNodeLossWait), 0u);
  c.onNodeLoss = OnNodeLoss::Continue;
  env = workerEnv(c, node, 1, 0);
  EXPECT_EQ(env[env::kOnNodeLoss], "continue");
  EXPECT_EQ(env[env::kNodeLossWait], "8");  // --heartbeat-timeout + 5
  EXPECT_EQ(env.count(env::kJoinEpoch), 0u);
  // A node taken into a running round (Note [Joining a running round]): its epoch too.
  node.joinEpoch = 2;
  env = workerEnv(c, node, 1, 0);
  EXPECT_EQ(env[env::kJoinEpoch], "2");
  EXPECT_THROW(parseLaunchArgs({"--env", "DTRAIN_JOIN_EPOCH=1", "x"}, {}), InvalidArgument)
      << "launch sets it";
}

NodeLossFacts goodFacts() {
  NodeLossFacts f;
  f.kind = LossKind::Silent;
  f.nodesLeft = 2;
  f.minNodes = 2;
  f.maxReforms = 3;
  f.reformWindow = 3600;
  return f;
}

struct DecisionCase {
  const char* name;
  OnNodeLoss mode;
  void (*change)(NodeLossFacts&);
  bool goOn;
  const char* why;  // part of the one line, when it falls back
};

// By name: gtest's default prints the struct's bytes (pointers among them), and CTest's test
// names would change with every build.
void PrintTo(const DecisionCase& c, std::ostream* os) { *os << c.name; }

class NodeLossDecisionTest : public ::testing::TestWithParam<DecisionCase> {};

TEST_P(NodeLossDecisionTest, GoesOnOrSaysWhyNot) {
  const DecisionCase& c = GetParam();
  NodeLossFacts f = goodFacts();
  c.change(f);
  const NodeLossDecision d = decideNodeLoss(c.mode, f);
  EXPECT_EQ(d.goOn, c.goOn);
  EXPECT_NE(d.why.find(c.why), std::string::npos) << d.why;
  if (d.goOn) {
    EXPECT_TRUE(d.why.empty()) << d.why;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table, NodeLossDecisionTest,
    ::testing::Values(
        DecisionCase{"Silent", OnNodeLoss::Continue, [](NodeLossFacts&) {}, true, ""},
        DecisionCase{"AgentGone", OnNodeLoss::Continue,
                     [](NodeLossFacts& f) { f.kind = LossKind::AgentGone; }, true, ""},
        DecisionCase{"WorkersSignaled", OnNodeLoss::Continue,
                     [](NodeLossFacts& f) { f.kind = LossKind::WorkersSignaled; }, true, ""},
        DecisionCase{"RestartModeNeverGoesOn", OnNodeLoss::Restart, [](NodeLossFacts&) {}, false,
                     ""},
        DecisionCase{"NonZeroExit", OnNodeLoss::Continue,
                     [](NodeLossFacts& f) { f.kind = LossKind::WorkerExited; }, false,
                     "non-zero code of its own"},
        DecisionCase{"BelowMin", OnNodeLoss::Continue, [](NodeLossFacts& f) { f.nodesLeft = 1; },
                     false, "1 node would remain, fewer than the minimum 2 (--nnodes)"},
        DecisionCase{"DuringAReform", OnNodeLoss::Continue,
                     [](NodeLossFacts& f) { f.reformInProgress = true; }, false,
                     "still re-forming"},
        DecisionCase{"OverKInTheWindow", OnNodeLoss::Continue,
                     [](NodeLossFacts& f) { f.reformsInWindow = 3; }, false,
                     "3 re-forms within 3600 s already (--max-reforms 3"},
        DecisionCase{"UnderKInTheWindow", OnNodeLoss::Continue,
                     [](NodeLossFacts& f) { f.reformsInWindow = 2; }, true, ""},
        DecisionCase{"NoReformsAllowed", OnNodeLoss::Continue,
                     [](NodeLossFacts& f) { f.maxReforms = 0; }, false, "--max-reforms 0"},
        DecisionCase{"StoreHost", OnNodeLoss::Continue,
                     [](NodeLossFacts& f) { f.hostsStore = true; }, false, "hosts the store"}),
    [](const ::testing::TestParamInfo<DecisionCase>& info) { return info.param.name; });

RoundPlan threeNodePlan() {
  RoundPlan p;
  p.round = 2;
  p.worldSize = 5;
  p.nodes = {{"0", 0, 0, 2, "h1", "h1", "10.0.0.1"},
             {"2", 1, 2, 1, "h3", "h3", "10.0.0.3"},
             {"1", 2, 3, 2, "h2", "h2", "10.0.0.2"}};
  return p;
}

TEST(EpochWithout, KeepsThePlansOrderAndRenumbersTheRanks) {
  const membership::Epoch e0 = epochOfPlan(threeNodePlan());
  EXPECT_EQ(e0.epoch, 0);
  EXPECT_EQ(e0.worldSize, 5);
  const membership::Epoch e1 = epochWithout(e0, {"2"}, "node 2 (h3) went silent");
  EXPECT_EQ(e1.epoch, 1);
  EXPECT_EQ(e1.worldSize, 4);
  ASSERT_EQ(e1.nodes.size(), 2u);
  EXPECT_EQ(e1.nodes[0].node, "0");
  EXPECT_EQ(e1.nodes[0].rankOffset, 0);
  EXPECT_EQ(e1.nodes[1].node, "1");
  EXPECT_EQ(e1.nodes[1].rankOffset, 2);  // was 3
  EXPECT_EQ(e1.rankOf("1", 1), 3);
  EXPECT_EQ(e1.rankOf("2", 0), -1);
  EXPECT_EQ(e1.why, "node 2 (h3) went silent");
  // What the master writes, every survivor reads back.
  const membership::Epoch back = membership::decodeEpoch(membership::encodeEpoch(e1));
  EXPECT_EQ(back.worldSize, 4);
  EXPECT_EQ(back.nodes[1].rankOffset, 2);
  const membership::Epoch e2 = epochWithout(e1, {"0"}, "node 0 (h1) lost its workers");
  EXPECT_EQ(e2.epoch, 2);
  EXPECT_EQ(e2.worldSize, 2);
  EXPECT_EQ(e2.rankOf("1", 0), 0);
  EXPECT_EQ(epochStoreKey(2), "round2/launch/epoch");
  EXPECT_EQ(formedStoreKey(2, 1), "round2/launch/epoch1/formed");
}

// Note [Joining a running round]: newcomers come after the members, so no member's rank moves;
// the state's plan is the round as that epoch sees it (lost nodes gone, hosts kept).
TEST(EpochWith, AppendsTheNewcomersAndThePlanFollowsTheEpoch) {
  const RoundPlan plan = threeNodePlan();
  const membership::Epoch e1 = epochWithout(epochOfPlan(plan), {"2"}, "node 2 (h3) went silent");
  const membership::Epoch e2 = epochWith(e1, {{"3", 4}, {"2", 1}},
                                         "node 3 (h4), node 2 (h3) joined");
  EXPECT_EQ(e2.epoch, 2);
  EXPECT_EQ(e2.worldSize, 9);
  EXPECT_EQ(e2.rankOf("0", 1), 1);
  EXPECT_EQ(e2.rankOf("1", 0), 2);  // as in epoch 1
  EXPECT_EQ(e2.rankOf("3", 0), 4);
  EXPECT_EQ(e2.rankOf("2", 0), 8);
  EXPECT_EQ(e2.why, "node 3 (h4), node 2 (h3) joined");
  // It takes effect once the newcomers' 5 ranks are ready (Note [Membership epochs]); the
  // members read that number back, and an epoch after it (a loss) joins nobody.
  EXPECT_EQ(e2.joining, 5);
  EXPECT_EQ(membership::decodeEpoch(membership::encodeEpoch(e2)).joining, 5);
  EXPECT_EQ(e1.joining, 0);
  EXPECT_EQ(epochWithout(e2, {"3"}, "node 3 (h4) went silent").joining, 0);
  EXPECT_EQ(epochWith(e2, {{"4", 2}}, "node 4 (h5) joined").joining, 2);
  EXPECT_EQ(readyStoreKey(2, 2), "round2/launch/epoch2/ready");
  // Malformed: more joining ranks than the epoch's members could hand their state to.
  membership::Epoch bad = e2;
  bad.joining = 9;
  EXPECT_THROW(membership::decodeEpoch(membership::encodeEpoch(bad)), InvalidArgument);
  const RoundPlan seen = planOfEpoch(plan, e2);
  EXPECT_EQ(seen.epoch, 2);
  EXPECT_EQ(seen.round, 2);
  EXPECT_EQ(seen.worldSize, 9);
  ASSERT_EQ(seen.nodes.size(), 4u);
  EXPECT_EQ(seen.nodes[1].node, "1");
  EXPECT_EQ(seen.nodes[1].nodeRank, 1);
  EXPECT_EQ(seen.nodes[1].rankOffset, 2);
  EXPECT_EQ(seen.nodes[1].address, "10.0.0.2");
  EXPECT_EQ(seen.nodes[2].node, "3");
  EXPECT_EQ(seen.nodes[2].localWorldSize, 4);
  EXPECT_EQ(seen.nodes[3].node, "2");
  EXPECT_EQ(seen.nodes[3].rankOffset, 8);
  EXPECT_EQ(seen.nodes[3].label, "h3");  // a node id that came back keeps its plan's host
}

TEST(ReformsWithin, CountsOnlyTheWindow) {
  using Clock = std::chrono::steady_clock;
  const auto now = Clock::now();
  const std::vector<Clock::time_point> times = {now - std::chrono::seconds(100),
                                                now - std::chrono::seconds(10), now};
  EXPECT_EQ(reformsWithin(times, now, 3600), 3);
  EXPECT_EQ(reformsWithin(times, now, 60), 2);
  EXPECT_EQ(reformsWithin({}, now, 60), 0);
}

TEST(NodeLostResult, TravelsAndLeftBehindWorkersAreNoRootCause) {
  AttemptResult r;
  WorkerOutcome w;
  w.rank = 4;
  w.state = WorkerOutcome::State::Signaled;
  w.signal = 9;
  r.workers.push_back(w);
  r.nodeLost = "rank 4 (pid 7) on h3 was killed by SIGKILL";
  const AttemptResult back = decodeResult(encodeResult(r));
  EXPECT_EQ(back.nodeLost, r.nodeLost);
  EXPECT_EQ(decodeResult(encodeResult(AttemptResult{})).nodeLost, "");
  EXPECT_EQ(encodeResult(AttemptResult{}).find("node_lost"), std::string::npos)
      << "absent unless set";
  AttemptResult all;
  w.state = WorkerOutcome::State::Lost;
  w.leftBehind = true;
  all.workers = {w};
  WorkerOutcome ok;
  ok.state = WorkerOutcome::State::Exited;
  all.workers.push_back(ok);
  EXPECT_EQ(rootCauseIndex(all.workers), -1);
  EXPECT_EQ(launcherExitCode(all), 0) << "the survivors exited 0";
  all.workers[0].leftBehind = false;
  EXPECT_EQ(launcherExitCode(all), 125);
}

}  // namespace
}  // namespace dtrain::launcher::launcher_node_loss_test
