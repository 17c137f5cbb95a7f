// Manual multi-node jobs on this machine: one `launch --nnodes ... --node-rank R` per simulated
// node, all on loopback (node rank 0 hosts the store), as real processes. What the agent <->
// master protocol does when nodes come and go (docs/design.md#multi-node): a duplicate
// --node-rank, a node whose launch is killed and started again, an elastic job that grows when a
// node joins late (node ids stay, group ranks change), and the resume after it, exact to the
// sample. Timing-bound: RUN_SERIAL.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "dtrain/config.h"
#include "launcher_support.h"
#include "test_support.h"

namespace dtrain::testing::launcher_multinode_test {
namespace {

// Heartbeat every 0.5 s, dead after 2 s: the bounds below are in these terms.
constexpr double kBeat = 0.5;
constexpr double kSilent = 2;

std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// `launch` options of node `rank` of a manual job on loopback at `port`.
std::vector<std::string> nodeArgs(int port, const std::string& nnodes, int rank) {
  return {"--nnodes",
          nnodes,
          "--node-rank",
          std::to_string(rank),
          "--rdzv-endpoint",
          fmt::format("127.0.0.1:{}", port),
          "--nproc-per-node",
          "1",
          "--heartbeat-interval",
          fmt::format("{:g}", kBeat),
          "--heartbeat-timeout",
          fmt::format("{:g}", kSilent),
          "--grace-period",
          "5"};
}

// Values of "rank R: env NAME=VALUE" lines, in order.
std::vector<std::string> envValues(const std::string& out, const std::string& name) {
  std::vector<std::string> values;
  std::regex re(": env " + name + "=([^\n]*)");
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) {
    values.push_back((*it)[1]);
  }
  return values;
}

// Issue 19 item 11: the join is no longer last-writer-wins; the second launch of a node rank
// finds the first one's claim alive and exits 2 naming the node rank and both hosts, within a
// heartbeat interval, while the job goes on.
TEST(ManualMultiNode, ADuplicateNodeRankExits2NamingBothHostsAndTheJobGoesOn) {
  const int port = freeLoopbackPort();
  const std::vector<std::string> worker{workerPath(), "--no-store", "--steps",
                                        "30",         "--step-ms",  "100"};
  LaunchProcess node0(cat(nodeArgs(port, "2", 0), worker));
  LaunchProcess node1(cat(nodeArgs(port, "2", 1), worker));
  ASSERT_TRUE(waitForWorkers(node1, 1, 20)) << node1.out() << node1.err();
  LaunchResult twin = runLaunch(cat(nodeArgs(port, "2", 1), worker), {}, 20);
  EXPECT_EQ(twin.exitCode, 2) << twin.all();
  EXPECT_LT(twin.seconds, kBeat + 2 * kMargin) << twin.all();
  const std::string host = readFile("/proc/sys/kernel/hostname").substr(0, 64);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(twin.err, m,
                                std::regex("--node-rank 1 is held by another launch, "
                                           "alive on host (\\S+) \\(pid ([0-9]+): its "
                                           "heartbeat moves\\); this launch on (\\S+) "
                                           "\\(pid ([0-9]+)\\) was given the same "
                                           "one")))
      << twin.err;
  EXPECT_EQ(std::stoi(m[2]), node1.pid());
  EXPECT_NE(m[4], std::to_string(node1.pid()));
  EXPECT_EQ(twin.out.find("worker rank="), std::string::npos) << "the twin started workers";
  LaunchResult r0 = node0.wait(60);
  LaunchResult r1 = node1.wait(60);
  EXPECT_EQ(r0.exitCode, 0) << r0.all();
  EXPECT_EQ(r1.exitCode, 0) << r1.all();
  EXPECT_EQ(countLines(r1.out, "worker rank="), 1) << r1.all();
}

// Issue 19 item 9: node 1's launch is SIGKILLed mid-round (its workers die with it) and started
// again at once. The new agent takes node 1's claim over once the old one's heartbeat is silent,
// joins the round after the one in progress -- never the finished round 0 with its stale ranks --
// and the job restarts (--max-restarts 1) and ends 0 on both nodes.
TEST(ManualMultiNode, ANodeStartedAgainJoinsTheNextRoundNotAFinishedOne) {
  const int port = freeLoopbackPort();
  const std::vector<std::string> worker{
      workerPath(),           "--steps", "20", "--step-ms", "100", "--barrier-every-step",
      "--barrier-timeout-ms", "60000"};
  const std::vector<std::string> restarts{"--max-restarts", "1"};
  LaunchProcess node0(cat(cat(nodeArgs(port, "2", 0), restarts), worker));
  auto node1 = std::make_unique<LaunchProcess>(cat(cat(nodeArgs(port, "2", 1), restarts), worker));
  ASSERT_TRUE(waitForWorkers(*node1, 1, 20)) << node1->out() << node1->err();
  ASSERT_TRUE(node1->waitForOutput("rank 1: step 3", 20)) << node1->out();
  node1->signal(SIGKILL);
  const double killedAt = node0.elapsed();  // times on node 0's clock from here
  node1->wait(10);
  const double againAt = node0.elapsed();
  LaunchProcess again(cat(cat(nodeArgs(port, "2", 1), restarts), worker));
  ASSERT_TRUE(again.waitForOutput("worker rank=", 30)) << again.out() << again.err();
  LaunchResult r1 = again.wait(60);
  LaunchResult r0 = node0.wait(60);
  // N20's bound: the new agent's workers run within the heartbeat timeout (the old claim's
  // silence), one heartbeat read and one rendezvous of the kill.
  const double rejoined = againAt + again.firstSeen("worker rank=") - killedAt;
  EXPECT_LT(rejoined, kSilent + 1 + 2 * kMargin) << r0.err << r1.err;
  EXPECT_EQ(r0.exitCode, 0) << r0.all();
  EXPECT_EQ(r1.exitCode, 0) << r1.all();
  EXPECT_NE(r1.err.find("took node 1 over from a silent launch"), std::string::npos) << r1.err;
  // Its only workers are of round 1.
  EXPECT_EQ(countLines(r1.out, "worker rank="), 1) << r1.all();
  EXPECT_EQ(countLines(r1.out, "worker rank=1 local_rank=0 world_size=2 attempt=1"), 1) << r1.all();
  EXPECT_EQ(r1.out.find("attempt=0"), std::string::npos) << r1.all();
  // Named when its heartbeat went silent, or when the new agent's join came first.
  EXPECT_NE(r0.err.find("launch: stopping round 0 on every node: node 1 ("), std::string::npos)
      << r0.err;
  EXPECT_EQ(countLines(r0.out, "rank 0: done"), 1) << r0.all();
}

// Issue 19 items 10 and 4: an elastic job (--nnodes 2:3) started on nodes 0 and 2 goes on with
// them; node 1 joins late, and the round is stopped through the workers' preemption path (SIGTERM,
// exit 75) to grow the job to 3 nodes -- not counted against --max-restarts (0 here). Node 2's
// GROUP_RANK changes from 1 to 2; its DTRAIN_NODE_ID stays 2.
TEST(ManualMultiNode, AnElasticJobGrowsWhenANodeJoinsAndNodeIdsStay) {
  const int port = freeLoopbackPort();
  const std::vector<std::string> options{"--rdzv-timeout", "3", "--max-restarts", "0"};
  const std::vector<std::string> worker{workerPath(), "--no-store", "--print-env",  "--steps", "60",
                                        "--step-ms",  "100",        "--on-sigterm", "75"};
  LaunchProcess node0(cat(cat(nodeArgs(port, "2:3", 0), options), worker));
  LaunchProcess node2(cat(cat(nodeArgs(port, "2:3", 2), options), worker));
  ASSERT_TRUE(waitForWorkers(node2, 1, 30)) << node2.out() << node2.err();
  const double lateAt = node0.elapsed();  // node 1's start on node 0's clock
  LaunchProcess node1(cat(cat(nodeArgs(port, "2:3", 1), options), worker));
  // Each side read while it writes, so that firstSeen() is when a line came.
  ASSERT_TRUE(node0.waitForOutput("waits to join", 10)) << node0.err();
  ASSERT_TRUE(node1.waitForOutput("worker rank=", 30)) << node1.out() << node1.err();
  LaunchResult r1 = node1.wait(90);
  LaunchResult r0 = node0.wait(30);
  LaunchResult r2 = node2.wait(30);
  for (const LaunchResult* r : {&r0, &r1, &r2}) EXPECT_EQ(r->exitCode, 0) << r->all();
  // N22's bounds: seen within one heartbeat read of its join; its workers run within that, the
  // grace period (5 s: the workers' SIGTERM path) and one rendezvous.
  const double seen = node0.firstSeen("waits to join");
  ASSERT_GE(seen, 0) << r0.err;
  EXPECT_LT(seen - lateAt, kBeat + kMargin) << r0.err;
  EXPECT_LT(node1.firstSeen("worker rank="), kBeat + 5 + 2 * kMargin) << r0.err << r1.all();
  EXPECT_NE(r0.err.find("node 1 (node rank 1) waits to join: the job grows from 2 to 3 nodes "
                        "(elastic --nnodes 2:3)"),
            std::string::npos)
      << r0.err;
  EXPECT_NE(r0.err.find("not counted against --max-restarts"), std::string::npos) << r0.err;
  // Round 0: world size 2, node 2 is group rank 1; round 1: world size 3, group rank 2.
  EXPECT_EQ(countLines(r2.out, "world_size=2 attempt=0"), 1) << r2.out;
  EXPECT_EQ(countLines(r2.out, "world_size=3 attempt=1"), 1) << r2.out;
  EXPECT_EQ(envValues(r2.out, "GROUP_RANK"), (std::vector<std::string>{"1", "2"})) << r2.out;
  EXPECT_EQ(envValues(r2.out, "DTRAIN_NODE_ID"), (std::vector<std::string>{"2", "2"})) << r2.out;
  EXPECT_EQ(envValues(r1.out, "DTRAIN_NODE_ID"), (std::vector<std::string>{"1"})) << r1.out;
  EXPECT_EQ(envValues(r1.out, "GROUP_RANK"), (std::vector<std::string>{"1"})) << r1.out;
  EXPECT_NE(r2.out.find("SIGTERM: checkpointing"), std::string::npos) << r2.out;
}

// Issue 19 item 10: a node that joined the rendezvous and went silent (SIGSTOPped) is dropped
// within the heartbeat bound; the elastic job goes on with the nodes that answer, without waiting
// for the rendezvous timeout (60 s here).
TEST(ManualMultiNode, ASilentJoinedNodeIsDroppedWithinTheHeartbeatBound) {
  const int port = freeLoopbackPort();
  const std::vector<std::string> options{"--rdzv-timeout", "60"};
  const std::vector<std::string> worker{workerPath(), "--no-store", "--steps", "2"};
  LaunchProcess node0(cat(cat(nodeArgs(port, "2:3", 0), options), worker));
  LaunchProcess node2(cat(cat(nodeArgs(port, "2:3", 2), options), worker), {"DTRAIN_VERBOSE=1"});
  ASSERT_TRUE(node2.waitForOutput("round 0: joined at", 20)) << node2.err();
  node2.signal(SIGSTOP);
  const double stoppedAt = node0.elapsed();
  EXPECT_TRUE(node0.waitForOutput("dropped node 2", kSilent + 1 + kMargin + 5)) << node0.err();
  const double dropped = node0.firstSeen("dropped node 2") - stoppedAt;
  EXPECT_LT(dropped, kSilent + 1 + kMargin);
  // The rendezvous goes on once node 1 is there: node 2 is not waited for any more.
  LaunchProcess node1(cat(cat(nodeArgs(port, "2:3", 1), options), worker));
  LaunchResult r0 = node0.wait(30);
  LaunchResult r1 = node1.wait(30);
  node2.signal(SIGCONT);
  node2.signal(SIGKILL);
  EXPECT_EQ(r0.exitCode, 0) << r0.all();
  EXPECT_EQ(r1.exitCode, 0) << r1.all();
  EXPECT_NE(r0.err.find("rendezvous round 0: dropped node 2 (node rank 2): it joined round 0 and "
                        "went silent"),
            std::string::npos)
      << r0.err;
  EXPECT_LT(r0.seconds, 30) << "waited for the rendezvous timeout";
  EXPECT_EQ(countLines(r0.out, "world_size=2"), 1) << r0.out;
}

// Issue 19 item 10: the grown job resumes from the checkpoint its workers saved when the round
// was stopped (preempted(): SIGTERM, save, exit 75), at world size 3 instead of 2, with the data
// cursor re-sharded: over the whole run every epoch trains on every sample exactly once.
TEST(ManualMultiNode, TheGrownJobResumesWithEverySampleOnce) {
  if (!DTRAIN_WITH_GLOO || !DTRAIN_WITH_TORCH) {
    GTEST_SKIP() << "elastic_worker is built with libtorch and Gloo only";
  }
  const std::string worker = binaryPath("elastic_worker");
  TempDir dir;
  const int port = freeLoopbackPort();
  const std::vector<std::string> options{"--rdzv-timeout", "3", "--max-restarts", "0",
                                         "--grace-period", "30"};
  const std::vector<std::string> program{worker,        "--dir",     dir.file("ckpt"),
                                         "--trace-dir", dir.path(),  "--steps",
                                         "16",          "--step-ms", "300"};
  LaunchProcess node0(cat(cat(nodeArgs(port, "2:3", 0), options), program));
  LaunchProcess node1(cat(cat(nodeArgs(port, "2:3", 1), options), program));
  ASSERT_TRUE(node0.waitForOutput("rank 0 step 5 world 2", 90)) << node0.out() << node0.err();
  LaunchProcess node2(cat(cat(nodeArgs(port, "2:3", 2), options), program));
  LaunchResult r2 = node2.wait(120);
  LaunchResult r0 = node0.wait(30);
  LaunchResult r1 = node1.wait(30);
  for (const LaunchResult* r : {&r0, &r1, &r2}) ASSERT_EQ(r->exitCode, 0) << r->all();
  EXPECT_NE(r0.out.find("preempted at step"), std::string::npos) << r0.out;
  EXPECT_NE(r2.out.find("saved at world size 2, now 3"), std::string::npos) << r2.out;
  for (const auto& r : {r0.out, r2.out}) {
    for (const char* what : {"preempted at step", "restored step"}) {
      const size_t at = r.find(what);
      if (at != std::string::npos) std::printf("%s\n", r.substr(at, r.find('\n', at) - at).c_str());
    }
  }
  // Every trace line of every rank and attempt: "<epoch> <step> <world>: indices".
  std::map<int, std::multiset<int>> seen;  // epoch -> indices trained on
  std::set<int> worlds;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    if (entry.path().extension() != ".txt") continue;
    std::istringstream in(readFile(entry.path().string()));
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      int epoch = 0, step = 0, world = 0;
      char colon = 0;
      fields >> epoch >> step >> world >> colon;
      worlds.insert(world);
      for (int i; fields >> i;) seen[epoch].insert(i);
    }
  }
  EXPECT_EQ(worlds, (std::set<int>{2, 3}));
  ASSERT_EQ(seen.size(), 4u);
  for (const auto& [epoch, indices] : seen) {
    std::multiset<int> once;
    for (int i = 0; i < 48; ++i) once.insert(i);
    EXPECT_EQ(indices, once) << "epoch " << epoch << " skipped or repeated a sample";
  }
}

}  // namespace
}  // namespace dtrain::testing::launcher_multinode_test
