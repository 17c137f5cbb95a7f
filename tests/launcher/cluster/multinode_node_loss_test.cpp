// `launch --on-node-loss continue` on a simulated cluster of 3 nodes x 2 workers (Note [Node
// loss] in launcher/cluster/master/node_loss.h): a lost node's workers are left behind and the
// survivors go on in the next membership epoch -- or, in the fallback cases, today's restart.
// The workers are the test worker with --await-epoch: each waits for the epoch key as the
// runtime would, prints it and adds to its formed counter, so the launcher's side is tested
// without the runtime. docs/reliability.md N-rows "node loss".
#include <gtest/gtest.h>
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <thread>

#include "multinode_support.h"
#include "test_support.h"

namespace dtrain::testing::multinode_node_loss_test {
namespace {

double monotonicNow() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// The job: every worker passes barrier "start", then waits (at most 20 s) for the next epoch.
std::vector<std::string> continueJob(const Cluster& c, const std::vector<std::string>& extra,
                                     const std::vector<std::string>& workerFlags = {}) {
  std::vector<std::string> args = fanOut(
      c, cat(cat({"--on-node-loss", "continue", "--nproc-per-node", "2"}, extra),
             {workerPath(), "--steps", "1", "--await-epoch", "20000", "--barrier-timeout-ms",
              "20000"}));
  return cat(args, workerFlags);
}

// The workers of host k (not its agent, whose command line names the program too).
std::vector<pid_t> workersOn(const Cluster& c, int k) {
  std::vector<pid_t> workers = pidsOn(c, k, workerPath());
  for (pid_t a : pidsOn(c, k, "--agent")) {
    workers.erase(std::remove(workers.begin(), workers.end(), a), workers.end());
  }
  return workers;
}

void killWorkersOn(const Cluster& c, int k) {
  const std::vector<pid_t> workers = workersOn(c, k);
  ASSERT_EQ(workers.size(), 2u) << "host " << k;
  for (pid_t p : workers) ::kill(p, SIGKILL);
}

bool waitForLines(LaunchProcess& p, const std::string& needle, int n, double seconds) {
  const double until = p.elapsed() + seconds;
  while (countLines(p.out(), needle) < n) {
    if (p.elapsed() > until) return false;
    p.pump(100);
  }
  return true;
}

// The worker's "t=" on its epoch line: CLOCK_MONOTONIC, one clock for every namespace.
double epochSeenAt(const std::string& out) {
  const size_t at = out.find("epoch 1 world_size");
  if (at == std::string::npos) return -1;
  return std::stod(out.substr(out.find(" t=", at) + 3));
}

// The "at t=" (CLOCK_MONOTONIC seconds) on the first line of `text` holding `needle`; -1 if none.
double timeOnLine(const std::string& text, const std::string& needle) {
  const size_t at = text.find(needle);
  if (at == std::string::npos) return -1;
  const size_t t = text.find("at t=", at);
  if (t == std::string::npos || t > text.find('\n', at)) return -1;
  return std::stod(text.substr(t + 5));
}

// (1) Node 2's workers SIGKILLed: epoch 1 without it, the survivors exit 0, launch exits 0.
TEST(MultiNodeNodeLoss, KilledWorkersLeaveTheirNodeBehindAndTheJobEndsZero) {
  DTRAIN_CLUSTER_OR_SKIP(c, 3);
  LaunchProcess p(continueJob(*c, {"--nnodes", "2:3"}));
  ASSERT_TRUE(waitForLines(p, "awaiting epoch", 6, 20)) << p.out() << p.err();
  killWorkersOn(*c, 2);
  LaunchResult r = p.wait(20);
  EXPECT_EQ(r.exitCode, 0) << r.all();
  const std::string node2 = "node 2 (" + c->hosts()[2] + ")";
  EXPECT_EQ(
      countLines(r.err, "launch: round 0 goes on without " + node2 + ": lost its workers: rank "),
      1)
      << r.err;
  EXPECT_NE(r.err.find("was killed by SIGKILL (signal 9); epoch 1: 2 nodes, 4 ranks"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(countLines(r.out, "epoch 1 world_size 4"), 4) << r.out;
  EXPECT_EQ(countLines(r.out, ": done"), 4) << r.out;
  // The report names the node, the epoch and the cause.
  EXPECT_NE(r.err.find("launch: " + node2 + " was lost: lost its workers: rank"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("the job went on without it in epoch 1 of round 0"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("stopping round 0"), std::string::npos) << r.err;
  EXPECT_LT(r.seconds, 25) << r.err;
  // Row N25's bound: epoch 1 is written within one store round trip (milliseconds) of node 2's
  // agent reporting node_lost; both lines carry the same clock's t=.
  const double reportedAt = timeOnLine(r.err, "round 0: reporting node_lost at t=");
  const double writtenAt = timeOnLine(r.err, "launch: round 0 goes on without " + node2);
  ASSERT_GT(reportedAt, 0) << r.err;
  ASSERT_GT(writtenAt, 0) << r.err;
  const double toEpoch = writtenAt - reportedAt;
  EXPECT_GE(toEpoch, 0) << r.err;
  EXPECT_LT(toEpoch, 1 + kMargin) << r.err;
  std::printf("node_lost reported -> epoch 1 written: %.3f ms\n", toEpoch * 1e3);
}

// (2) Node 2 cut off: epoch 1 reaches the survivors within --heartbeat-timeout + 1 s.
TEST(MultiNodeNodeLoss, SilentNodeIsLeftOutWithinTheHeartbeatBound) {
  DTRAIN_CLUSTER_OR_SKIP(c, 3);
  LaunchProcess p(continueJob(*c, {"--nnodes", "2:3"}));
  ASSERT_TRUE(waitForLines(p, "awaiting epoch", 6, 20)) << p.out() << p.err();
  c->link(2, false);
  const double cutAt = monotonicNow();
  const bool epoch = waitForLines(p, "epoch 1 world_size 4", 4, kHeartbeatTimeout + 10);
  LaunchResult r = p.wait(20);
  c->link(2, true);
  ASSERT_TRUE(epoch) << r.all();
  EXPECT_EQ(r.exitCode, 0) << r.all();
  const double detected = epochSeenAt(r.out) - cutAt;
  EXPECT_LT(detected, kHeartbeatTimeout + 1) << r.err;
  std::printf("cut -> epoch 1 at the survivors: %.2f s (--heartbeat-timeout %g)\n", detected,
              kHeartbeatTimeout);
  // Either sign of a cut-off node may come first: its heartbeat's silence, or the master's ssh
  // session to it ending (ssh's keep-alives give up at about the same time).
  const std::string goesOn = "goes on without node 2 (" + c->hosts()[2] + "): ";
  EXPECT_TRUE(r.err.find(goesOn + "on " + c->hosts()[2] + " went silent") != std::string::npos ||
              r.err.find(goesOn + "lost its agent: its ssh session exited") != std::string::npos)
      << r.err;
  // Fencing: the cut-off agent lost the store and ended its workers by itself.
  for (int i = 0; i < 100 && !workersOn(*c, 2).empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(workersOn(*c, 2).empty()) << "the silent node's workers outlived its agent";
}

// (3) A worker exits 3: a program error, not a lost node -- today's restart.
TEST(MultiNodeNodeLoss, NonZeroExitTakesTheRestartPath) {
  DTRAIN_CLUSTER_OR_SKIP(c, 3);
  LaunchResult r = runLaunch(continueJob(*c, {"--nnodes", "2:3", "--max-restarts", "1"}),
                             {"DTRAIN_FAULT=exit:3@rank=5,attempt=0"}, 40);
  EXPECT_EQ(r.exitCode, 0) << r.all();
  EXPECT_NE(r.err.find("exited with code 3 (not a lost node: --on-node-loss continue falls back "
                       "to the restart path)"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("goes on without"), std::string::npos) << r.err;
  EXPECT_EQ(countLines(r.out, "attempt=1 "), 6) << r.out;
  EXPECT_LT(r.seconds, 25) << r.err;
}

// (4) A second node lost while the survivors still re-form (they never add to formed): restart,
// saying why in one line.
TEST(MultiNodeNodeLoss, SecondLossDuringTheReformRestarts) {
  DTRAIN_CLUSTER_OR_SKIP(c, 3);
  LaunchProcess p(continueJob(*c, {"--nnodes", "1:3", "--max-restarts", "1"}, {"--no-formed"}));
  ASSERT_TRUE(waitForLines(p, "awaiting epoch", 6, 20)) << p.out() << p.err();
  killWorkersOn(*c, 2);
  ASSERT_TRUE(waitForLines(p, "epoch 1 world_size 4", 4, 10)) << p.out() << p.err();
  killWorkersOn(*c, 1);
  LaunchResult r = p.wait(30);
  EXPECT_EQ(r.exitCode, 0) << r.all();
  EXPECT_EQ(countLines(r.err, "launch: round 0 cannot go on without node 1 (" + c->hosts()[1] +
                                  ") (lost its workers: rank"),
            1)
      << r.err;
  EXPECT_NE(r.err.find("a node was lost while the survivors were still re-forming after the "
                       "last loss; falling back to the restart path (--max-restarts 1)"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(countLines(r.out, "attempt=1 "), 6) << "the restart runs every node again\n" << r.out;
  EXPECT_LT(r.seconds, 28) << r.err;
}

}  // namespace
}  // namespace dtrain::testing::multinode_node_loss_test
