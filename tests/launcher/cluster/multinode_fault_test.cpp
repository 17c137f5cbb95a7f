// Failures of a multi-node job on a simulated cluster, each with its time bound (heartbeat every
// 0.5 s, dead after 3 s, grace 2 s; generous margins: the machine is small and shared): ssh that
// fails, unknown host keys, a SIGKILLed agent, a whole node killed, a silent partition and one
// that heals, the store's host lost, a firewall on the store port, elastic restarts, signals.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>
#include <thread>

#include "multinode_support.h"
#include "test_support.h"

namespace dtrain::testing::multinode_fault_test {
namespace {

// The agent process on host k (its guardians share its command line: they are forks of it).
pid_t agentOn(const Cluster& c, int k) {
  std::vector<pid_t> all = pidsOn(c, k, "--agent");
  for (pid_t p : all) {
    std::string stat = readFile("/proc/" + std::to_string(p) + "/stat");
    pid_t parent = std::atoi(stat.c_str() + stat.rfind(')') + 4);
    if (std::find(all.begin(), all.end(), parent) == all.end()) return p;
  }
  return -1;
}

// A job that runs until stopped: barriers at every step, so a lost peer is noticed.
std::vector<std::string> longJob(const Cluster& c, const std::vector<std::string>& extra = {}) {
  return fanOut(c, cat(extra, {"--nproc-per-node", "2", workerPath(), "--steps", "600", "--step-ms",
                               "50", "--barrier-every-step", "--barrier-timeout-ms", "60000"}));
}

std::string commWorker() { return binaryDir() + "/comm_worker"; }

// Nothing of the job is left on any host, nor here: every host first (a cut-off node's agent
// stops its workers only after --heartbeat-timeout and the grace period), then every pid the job
// printed. `program`: the workers' program.
void expectNothingLeft(const Cluster& c, const LaunchResult& r, pid_t spare = -1,
                       const std::string& program = workerPath()) {
  for (int k = 0; k < static_cast<int>(c.hosts().size()); ++k) {
    std::vector<pid_t> left;
    for (int i = 0; i < 150; ++i) {
      left = pidsOn(c, k, program);
      left.erase(std::remove(left.begin(), left.end(), spare), left.end());
      std::vector<pid_t> agents = pidsOn(c, k, "--agent");
      left.insert(left.end(), agents.begin(), agents.end());
      if (left.empty()) break;
      reapOrphans();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    std::string which;
    for (pid_t p : left) {
      std::string stat = readFile("/proc/" + std::to_string(p) + "/stat");
      which += "\n  " + stat.substr(0, 80);
    }
    EXPECT_TRUE(left.empty()) << "host " << k << " still runs " << left.size()
                              << " process(es):" << which;
  }
  std::vector<pid_t> pids = jobPids(r.all());
  pids.erase(std::remove(pids.begin(), pids.end(), spare), pids.end());
  std::vector<pid_t> gone = waitGone(pids, 5);
  EXPECT_TRUE(gone.empty()) << gone.size() << " pid(s) the job printed are still there";
}

// How soon launch ends a job after it lost a node: the heartbeat timeout, the grace period, and
// the time to report it.
constexpr double kNodeLossBound = kHeartbeatTimeout + kGrace + kMargin + 2;

// After a fault on node 1 at `faultAt` (seconds into the job of `p`): the job fails naming the
// node ("node 1 (<host>)", then `detail`) within `bound` seconds, and nothing of it is left.
void expectNodeOneFailed(const Cluster& c, LaunchProcess& p, double faultAt, double bound,
                         const std::string& detail = "") {
  LaunchResult r = p.wait(60);
  EXPECT_NE(r.exitCode, 0) << r.all();
  EXPECT_NE(r.err.find("node 1 (" + c.hosts()[1] + ")" + detail), std::string::npos) << r.err;
  EXPECT_LT(r.seconds - faultAt, bound) << r.err;
  expectNothingLeft(c, r);
}

// docs/reliability.md H5 on the simulated cluster: rank 3 (node 1) dies inside a hierarchical
// allreduce; every survivor, on both nodes, fails within 2 s (its node peer by the pidfd, the
// others through Gloo and their segment), before launch's teardown.
TEST(MultiNodeFault, RankDeadInsideAHierarchicalAllreduceFailsEverySurvivorWithinTwoSeconds) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  const std::string worker = binaryDir() + "/comm_worker";
  if (::access(worker.c_str(), X_OK) != 0) GTEST_SKIP() << "comm_worker not built (no Gloo)";
  LaunchResult r = runLaunch(fanOut(*c, {"--nproc-per-node", "2", worker, "--iters", "8",
                                         "--ignore-sigterm", "--timeout-ms", "20000"}),
                             {"DTRAIN_FAULT=signal:KILL@rank=3,step=4"}, 90);
  EXPECT_NE(r.exitCode, 0) << r.all();
  EXPECT_EQ(countLines(r.out, "ready backend=shm+gloo"), 4) << r.all();
  static const std::regex failed(
      R"(rank (\d+)/4: FAILED at iteration (\d+) after (\d+) ms: ([^\n]*))");
  std::map<int, std::pair<double, std::string>> byRank;
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), failed), end; it != end; ++it) {
    EXPECT_EQ(std::stoi((*it)[2]), 4) << it->str();
    byRank[std::stoi((*it)[1])] = {std::stod((*it)[3]), (*it)[4]};
  }
  for (int survivor : {0, 1, 2}) {
    ASSERT_TRUE(byRank.count(survivor)) << "rank " << survivor << " did not report\n" << r.all();
    EXPECT_LE(byRank[survivor].first, 2000)
        << "rank " << survivor << ": " << byRank[survivor].second;
  }
  EXPECT_NE(byRank[2].second.find("rank 3 (pid "), std::string::npos) << byRank[2].second;
  EXPECT_NE(byRank[1].second.find("whose ranks 0, 1 are ranks 1, 3 here"), std::string::npos)
      << byRank[1].second;
}

TEST(MultiNodeFault, SshToOneNodeFailsFastAndNamesIt) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  ASSERT_EQ(::kill(std::stoi(readFile(c->dir() + "/host1/sshd.pid")), SIGKILL), 0);
  LaunchResult r = runLaunch(longJob(*c, {"--ssh-connect-timeout", "2"}), {}, 60);
  EXPECT_EQ(r.exitCode, 125) << r.all();
  EXPECT_NE(r.err.find("node 1 (" + c->hosts()[1] + "): its ssh session exited with code 255"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("Connection refused"), std::string::npos) << r.err;
  EXPECT_LT(r.seconds, 2 + 5 + kMargin) << r.err;
  expectNothingLeft(*c, r);
}

TEST(MultiNodeFault, UnknownHostKeyIsRefusedWithAHint) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  TempDir dir;
  const std::string cfg = dir.file("ssh_config");
  std::string text = readFile(c->sshConfig());
  const std::string known = "UserKnownHostsFile " + c->dir() + "/known_hosts";
  text.replace(text.find(known), known.size(), "UserKnownHostsFile " + dir.file("known_hosts"));
  writeFile(cfg, text);
  std::vector<std::string> args = longJob(*c);
  args[3] = cfg;  // --ssh-config
  LaunchResult r = runLaunch(args, {}, 60);
  EXPECT_EQ(r.exitCode, 125) << r.all();
  EXPECT_NE(r.err.find("Host key verification failed"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ssh-keyscan -H 10."), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--ssh-accept-new-host-keys"), std::string::npos) << r.err;
  // The opt-in trusts first-seen keys (accept-new) and records them.
  r = runLaunch(
      cat(cat({"--hosts", c->hostList(), "--ssh-config", cfg, "--ssh-accept-new-host-keys",
               "--rdzv-endpoint", c->bridgeAddress() + ":" + std::to_string(storePort(*c))},
              timings()),
          {workerPath(), "--steps", "1"}),
      {}, 60);
  EXPECT_EQ(r.exitCode, 0) << r.all();
  EXPECT_NE(readFile(dir.file("known_hosts")).find(c->hosts()[1]), std::string::npos);
}

TEST(MultiNodeFault, RemoteAgentKilledEndsTheJobNamingTheNode) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  LaunchProcess p(longJob(*c));
  ASSERT_TRUE(waitForWorkers(p, 4, 30)) << p.out() << p.err();
  const pid_t agent = agentOn(*c, 1);
  ASSERT_GT(agent, 0);
  ASSERT_EQ(::kill(agent, SIGKILL), 0);
  expectNodeOneFailed(*c, p, p.elapsed(), kNodeLossBound);
}

// The master's ssh process for one node, on this host.
pid_t sshTo(const std::string& host) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = readFile(entry.path().string() + "/cmdline");
    if (cmd.rfind("ssh", 0) == 0 &&
        cmd.find(std::string("\0") + host + "\0") != std::string::npos &&
        cmd.find("--agent") != std::string::npos) {
      return std::stoi(name);
    }
  }
  return -1;
}

TEST(MultiNodeFault, DroppedSshSessionStopsThatNodesWorkers) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  LaunchProcess p(longJob(*c));
  ASSERT_TRUE(waitForWorkers(p, 4, 30)) << p.out() << p.err();
  const pid_t ssh = sshTo(c->hosts()[1]);
  ASSERT_GT(ssh, 0);
  ASSERT_EQ(::kill(ssh, SIGKILL), 0);
  // Node 1's agent sees its stdin close and stops its workers by itself.
  expectNodeOneFailed(*c, p, p.elapsed(), kGrace + kMargin + 2,
                      ": its ssh session was killed by SIGKILL");
}

TEST(MultiNodeFault, SigkilledMasterLeavesNothingOnAnyNode) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  LaunchProcess p(longJob(*c));
  ASSERT_TRUE(waitForWorkers(p, 4, 30)) << p.out() << p.err();
  p.signal(SIGKILL);
  LaunchResult r = p.wait(10);
  EXPECT_EQ(r.exitCode, 128 + SIGKILL);
  // ssh dies with the master (PDEATHSIG), each agent's stdin closes, agents stop their workers.
  expectNothingLeft(*c, r);
}

TEST(MultiNodeFault, WholeNodeKilledEndsTheJobWithinTheHeartbeatBound) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  LaunchProcess p(longJob(*c));
  ASSERT_TRUE(waitForWorkers(p, 4, 30)) << p.out() << p.err();
  c->killHost(1);
  expectNodeOneFailed(*c, p, p.elapsed(), kNodeLossBound);
}

// Pumps until every one of `n` comm_workers said it is ready (its Gloo mesh is up).
// Every worker's communicator is up. Two ranks per node take the hierarchical path (shm+gloo:
// shared memory inside each node, Gloo across), so what crosses the cut link is Gloo either way.
bool waitForCommWorkers(LaunchProcess& p, int n, double seconds) {
  return p.waitFor(
      [n](const std::string& out, const std::string&) {
        return countLines(out, ": ready backend=gloo") +
                   countLines(out, ": ready backend=shm+gloo") >=
               n;
      },
      seconds);
}

TEST(MultiNodeFault, SilentPartitionEndsTheJobNamingTheNode) {
  if (::access(commWorker().c_str(), X_OK) != 0) GTEST_SKIP() << "comm_worker not built (no Gloo)";
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  // Gloo allreduces across the nodes, back to back, with a 10-minute collective timeout: when
  // the cable goes, every worker sits inside an allreduce that would wait that long.
  LaunchProcess p(
      fanOut(*c, {"--ssh-option", "ServerAliveInterval=30", "--nproc-per-node", "2", commWorker(),
                  "--iters", "1000000", "--count", "16384", "--timeout-ms", "600000"}));
  ASSERT_TRUE(waitForCommWorkers(p, 4, 40)) << p.out() << p.err();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  c->link(1, false);
  const double cutAt = p.elapsed();
  LaunchResult r = p.wait(60);
  c->link(1, true);
  EXPECT_EQ(r.exitCode, 124) << r.all();
  EXPECT_NE(r.err.find("node 1 (" + c->hosts()[1] + ") on " + c->hosts()[1] + " went silent"),
            std::string::npos)
      << r.err;
  EXPECT_LT(r.seconds - cutAt, kNodeLossBound) << r.err;
  EXPECT_EQ(countLines(r.out, ": OK"), 0) << r.out;
  // The cut-off node's agent loses the store and stops its workers by itself.
  expectNothingLeft(*c, r, -1, commWorker());
}

TEST(MultiNodeFault, PartitionThatHealsInTimeIsNoFailure) {
  if (::access(commWorker().c_str(), X_OK) != 0) GTEST_SKIP() << "comm_worker not built (no Gloo)";
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  // Gloo allreduces across the nodes while node 1's cable is out for 1.2 s (< the 3 s heartbeat
  // timeout): TCP carries the collectives (and the heartbeats) over the gap, and every result of
  // every iteration is checked against its closed form, element by element, on every rank.
  LaunchProcess p(fanOut(*c, {"--nproc-per-node", "2", commWorker(), "--iters", "150", "--iter-ms",
                              "20", "--timeout-ms", "30000"}));
  ASSERT_TRUE(waitForCommWorkers(p, 4, 40)) << p.out() << p.err();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  c->link(1, false);
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  c->link(1, true);
  p.pump(0);
  EXPECT_EQ(countLines(p.out(), ": OK"), 0) << "the job ended before the partition healed";
  LaunchResult r = p.wait(60);
  EXPECT_EQ(r.exitCode, 0) << r.all();
  EXPECT_EQ(countLines(r.out, "/4: OK: 150 allreduces of 4096 floats, every element exact"), 4)
      << r.all();
  EXPECT_EQ(r.out.find("WRONG"), std::string::npos) << r.out;
  EXPECT_EQ(r.err.find("went silent"), std::string::npos) << r.err;
}

TEST(MultiNodeFault, StoreHostLostEndsEveryAgent) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  // Manual mode: node 0 hosts the store; kill all of node 0.
  const std::string token = c->dir() + "/job.token";
  writeFile(token, "feedfacefeedfacefeedfacefeedface\n");
  std::vector<std::unique_ptr<LaunchProcess>> nodes;
  for (int k = 0; k < 2; ++k) {
    nodes.push_back(std::make_unique<LaunchProcess>(
        cat(timings(), {"--nnodes", "2", "--node-rank", std::to_string(k), "--rdzv-endpoint",
                        c->hosts()[0], "--token-file", token, "--nproc-per-node", "1", workerPath(),
                        "--steps", "600", "--step-ms", "50"}),
        std::vector<std::string>{}, c->on(k)));
  }
  ASSERT_TRUE(waitForWorkers(*nodes[1], 1, 30)) << nodes[1]->out() << nodes[1]->err();
  c->killHost(0);
  const double killedAt = nodes[1]->elapsed();
  LaunchResult r = nodes[1]->wait(60);
  EXPECT_EQ(r.exitCode, 125) << r.all();
  EXPECT_NE(r.err.find("lost the store at " + c->hosts()[0] + ":29400"), std::string::npos)
      << r.err;
  EXPECT_LT(r.seconds - killedAt, kNodeLossBound) << r.err;
  nodes[0]->wait(10);
  expectNothingLeft(*c, r);
}

TEST(MultiNodeFault, FirewallOnTheStorePortFailsTheRendezvousNamingTheNode) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  if (::access("/usr/sbin/nft", X_OK) != 0) GTEST_SKIP() << "no nft (nftables) here";
  ASSERT_EQ(c->run(1, "nft add table inet f && nft add chain inet f out '{ type filter hook "
                      "output priority 0; }' && nft add rule inet f out tcp dport " +
                          std::to_string(storePort(*c)) + " drop"),
            0);
  LaunchResult r = runLaunch(cat(fanOut(*c, {"--rdzv-timeout", "4"}),
                                 {"--nproc-per-node", "1", workerPath(), "--steps", "1"}),
                             {}, 60);
  EXPECT_EQ(r.exitCode, 124) << r.all();
  EXPECT_NE(r.err.find("missing: node 1 (" + c->hosts()[1] + ")"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(":" + std::to_string(storePort(*c))), std::string::npos) << r.err;
  EXPECT_LT(r.seconds, 4 + 4 + kMargin) << r.err;
  expectNothingLeft(*c, r);
}

TEST(MultiNodeFault, ElasticGoesOnWithMinNodesWhenOneNeverReturns) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  LaunchProcess p(fanOut(*c, {"--nnodes", "1:2", "--max-restarts", "1", "--rdzv-timeout", "4",
                              "--ssh-connect-timeout", "1", "--nproc-per-node", "2", workerPath(),
                              "--steps", "30", "--step-ms", "50", "--barrier-every-step",
                              "--barrier-timeout-ms", "60000"}));
  ASSERT_TRUE(waitForWorkers(p, 4, 30)) << p.out() << p.err();
  c->killHost(1);  // its sshd too: it never comes back
  LaunchResult r = p.wait(90);
  EXPECT_EQ(r.exitCode, 0) << r.all();
  EXPECT_NE(r.err.find("going on with them (elastic --nnodes 1:2)"), std::string::npos) << r.err;
  // The second round: one node, world size 2, ranks renumbered.
  EXPECT_NE(r.out.find("world_size=2 attempt=1"), std::string::npos) << r.out;
  EXPECT_EQ(countLines(r.out, ": done"), 2) << r.out;
}

TEST(MultiNodeFault, SignalToTheMasterReachesEveryNodesWorkers) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  // A decoy with the workers' command line on node 1: the teardown must spare it (nothing is
  // ever killed by name).
  std::string decoyPid;
  ASSERT_EQ(c->run(1,
                   "setsid " + workerPath() +
                       " --no-store --steps 600 --step-ms 50 "
                       "</dev/null >/dev/null 2>&1 & echo $!",
                   &decoyPid),
            0);
  const pid_t decoy = std::atoi(decoyPid.c_str());
  ASSERT_GT(decoy, 0);
  LaunchProcess p(fanOut(*c, {"--nproc-per-node", "2", workerPath(), "--steps", "600", "--step-ms",
                              "50", "--on-sigterm", "75"}));
  ASSERT_TRUE(waitForWorkers(p, 4, 30)) << p.out() << p.err();
  p.signal(SIGTERM);
  LaunchResult r = p.wait(30);
  EXPECT_EQ(countLines(r.out, "SIGTERM: checkpointing"), 4) << r.all();
  EXPECT_EQ(r.exitCode, 75) << r.all();
  expectNothingLeft(*c, r, decoy);
  EXPECT_EQ(::kill(decoy, 0), 0) << "the decoy was killed";
  ::kill(decoy, SIGKILL);
}

}  // namespace
}  // namespace dtrain::testing::multinode_fault_test
