// Checkpoints of a multi-node job on a simulated cluster (network namespaces + sshd; each host has
// its own private work directory, as machines have their own disks): a node whose checkpoint
// directory is wiped -- a spot machine that comes back empty -- resumes from the other node's copy
// and gets one of its own; SIGTERM to one node's agent -- a spot notice on one machine --
// checkpoints the whole job at one step and the rerun resumes. Both end bitwise equal to an
// uninterrupted run of the same world size on one machine.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <regex>
#include <set>

#include <fmt/format.h>

#include "multinode_support.h"
#include "test_support.h"

namespace dtrain::testing::checkpoint_e2e_test {
namespace {

std::string checkpointWorker() { return binaryDir() + "/checkpoint_worker"; }

// The uninterrupted run: two ranks on this machine.
std::string reference(const std::string& dir) {
  LaunchResult r = runLaunch({"--nproc-per-node", "2", checkpointWorker(), "--dir", dir + "/ref",
                              "--out", dir + "/ref.params", "--steps", "12"},
                             {}, 90);
  EXPECT_EQ(r.exitCode, 0) << r.all();
  return readFile(dir + "/ref.params");
}

// Every node's lines "restored step N" and whether that node got a copy.
int countRestored(const std::string& out, int step) {
  return countLines(out, fmt::format("restored step {} ", step));
}

TEST(CheckpointE2E, ANodeWithAWipedDiskResumesFromTheOtherNodesCopy) {
  if (::access(checkpointWorker().c_str(), X_OK) != 0)
    GTEST_SKIP() << "checkpoint_worker not built";
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  const std::string ckpt = c->workDir() + "/ckpt";  // private on each host
  const std::string out = c->dir() + "/params";     // seen by every host and by this test
  auto job = [&](std::vector<std::string> extra) {
    return fanOut(*c, cat({"--nproc-per-node", "1", checkpointWorker(), "--dir", ckpt, "--out", out,
                           "--steps", "12", "--save-every", "3"},
                          extra));
  };
  LaunchResult first = runLaunch(job({"--stop-after", "5"}), {}, 90);
  ASSERT_EQ(first.exitCode, 0) << first.all();
  // Each host holds its own node's directory only.
  EXPECT_EQ(c->run(0, "test -f " + ckpt + "/node0/step-00000005"), 0);
  EXPECT_EQ(c->run(1, "test -f " + ckpt + "/node1/step-00000005"), 0);
  EXPECT_NE(c->run(0, "test -e " + ckpt + "/node1"), 0) << "the work directory is not private";
  ASSERT_EQ(c->run(1, "rm -rf " + ckpt), 0);

  LaunchResult again = runLaunch(job({}), {}, 90);
  ASSERT_EQ(again.exitCode, 0) << again.all();
  EXPECT_EQ(countRestored(again.out, 5), 2) << again.all();
  EXPECT_EQ(countLines(again.out, "(copied from another node)"), 1) << again.all();
  EXPECT_NE(again.out.find("rank 1 restored step 5 from world size 2 (copied from another node)"),
            std::string::npos)
      << again.all();
  std::string latest;
  c->run(1, "cat " + ckpt + "/node1/LATEST", &latest);
  EXPECT_EQ(latest, "step-00000011\n") << "node 1 did not go on from its copy";
  EXPECT_EQ(readFile(out), reference(c->dir())) << again.all();
}

// A spot notice on one machine: SIGTERM to node 1's agent only. Its workers get it; the ranks agree
// at the next step boundary, all checkpoint that step and exit 75, and so does launch. The same
// command again resumes from there.
TEST(CheckpointE2E, SigtermToOneNodesAgentPreemptsTheWholeJob) {
  if (::access(checkpointWorker().c_str(), X_OK) != 0)
    GTEST_SKIP() << "checkpoint_worker not built";
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  const std::string ckpt = c->workDir() + "/ckpt";
  const std::string out = c->dir() + "/params";
  auto args = fanOut(*c, {"--grace-period", "20", "--nproc-per-node", "1", checkpointWorker(),
                          "--dir", ckpt, "--out", out, "--steps", "12", "--step-ms", "300"});
  LaunchProcess p(args);
  ASSERT_TRUE(p.waitForOutput("step 3 loss", 60)) << p.out() << p.err();
  std::vector<pid_t> agents = pidsOn(*c, 1, "--agent");
  ASSERT_FALSE(agents.empty()) << "no agent on host 1";
  for (pid_t a : agents) ::kill(a, SIGTERM);  // the agent and its guardians (forks of it)
  LaunchResult stopped = p.wait(60);
  EXPECT_EQ(stopped.exitCode, 75) << stopped.all();
  if (std::getenv("DTRAIN_TEST_SHOW")) std::cout << stopped.all();
  std::smatch m;
  std::regex re("rank ([01]) preempted at step ([0-9]+)");
  std::set<std::string> steps;
  for (auto it = std::sregex_iterator(stopped.out.begin(), stopped.out.end(), re);
       it != std::sregex_iterator(); ++it) {
    steps.insert((*it)[2]);
  }
  ASSERT_EQ(countLines(stopped.out, "preempted at step"), 2) << stopped.all();
  ASSERT_EQ(steps.size(), 1u) << "the ranks stopped at different steps: " << stopped.all();
  const int at = std::stoi(*steps.begin());
  EXPECT_LT(at, 11) << "the run ended before the signal";

  LaunchResult again = runLaunch(args, {}, 90);
  ASSERT_EQ(again.exitCode, 0) << again.all();
  EXPECT_EQ(countRestored(again.out, at), 2) << again.all();
  EXPECT_EQ(readFile(out), reference(c->dir())) << again.all();
}

}  // namespace
}  // namespace dtrain::testing::checkpoint_e2e_test
