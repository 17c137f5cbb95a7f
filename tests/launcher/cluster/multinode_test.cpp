// Multi-node launch on a simulated cluster (network namespaces + real sshd): the ways to start a
// job (fan-out from outside the nodes and from node 0, manual, Slurm and Kubernetes variables),
// host lists, the remote command line's fidelity and the token's secrecy. Timing-free: the
// fault tests are in multinode_fault_test.cpp.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "dtrain/config.h"
#include "multinode_support.h"
#include "test_support.h"

namespace dtrain::testing {
namespace {

std::string commWorker() { return binaryDir() + "/comm_worker"; }

// The addresses listening on `port` in this network namespace (the master's, outside the nodes).
std::vector<std::string> listenersHere(int port) {
  return listeningAddresses(readFile("/proc/net/tcp") + readFile("/proc/net/tcp6"), port);
}

TEST(MultiNode, FanOutFromOutsideTheNodes) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  // The store barrier of the test worker, then real Gloo allreduces across the namespaces: the
  // runtime must bind each node's own interface (loopback would not reach the other node).
  LaunchProcess p(fanOut(*c, {"--nproc-per-node", "2", workerPath(), "--steps", "10", "--step-ms",
                              "50", "--end-barrier"}));
  ASSERT_TRUE(waitForWorkers(p, 4, 30)) << p.out() << p.err();
  // The master's store binds only the address it chose (--rdzv-endpoint: the bridge's), not
  // 0.0.0.0 or [::], where anyone on any network of the master could reach it.
  EXPECT_EQ(listenersHere(storePort(*c)), std::vector<std::string>{c->bridgeAddress()});
  LaunchResult r = p.wait(60);
  ASSERT_EQ(r.exitCode, 0) << r.all();
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(r.out.find(fmt::format("[node{} rank{}]: rank {}: done", rank / 2, rank, rank)),
              std::string::npos)
        << r.all();
  }
  EXPECT_NE(r.out.find("world_size=4"), std::string::npos);
  if (!DTRAIN_WITH_GLOO) GTEST_SKIP() << "built without Gloo: no backend between the nodes";
  r = runLaunch(fanOut(*c, {"--nproc-per-node", "2", commWorker(), "--iters", "5"}), {}, 60);
  ASSERT_EQ(r.exitCode, 0) << r.all();
  EXPECT_EQ(countLines(r.out, "/4: OK"), 4) << r.all();
}

// The hierarchical path on real (simulated) nodes: shared memory inside each node's network
// namespace (the segment's socket is per namespace), Gloo between the nodes; DTRAIN_SHM=0,
// forwarded to every node, turns it off.
TEST(MultiNode, SharedMemoryInsideEachNodeGlooAcross) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  if (!DTRAIN_WITH_GLOO) GTEST_SKIP() << "built without Gloo: no backend between the nodes";
  LaunchResult r = runLaunch(
      fanOut(*c, {"--nproc-per-node", "2", commWorker(), "--iters", "20", "--count", "300007"}), {},
      60);
  ASSERT_EQ(r.exitCode, 0) << r.all();
  EXPECT_EQ(countLines(r.out, "ready backend=shm+gloo"), 4) << r.all();
  EXPECT_EQ(countLines(r.out, "/4: OK"), 4) << r.all();
  r = runLaunch(fanOut(*c, {"--nproc-per-node", "2", commWorker(), "--iters", "5"}),
                {"DTRAIN_SHM=0"}, 60);
  ASSERT_EQ(r.exitCode, 0) << r.all();
  EXPECT_EQ(countLines(r.out, "ready backend=gloo"), 4) << r.all();
}

// A plain PyTorch DDP script written for torchrun (tests/launcher/ddp_compat.py: Gloo,
// env://, DDP) runs unchanged across two nodes: PyTorch's own Gloo must find the other node
// through what launch exports on each (MASTER_ADDR, GLOO_SOCKET_IFNAME), and its replicas agree.
TEST(MultiNode, UnchangedPyTorchDdpScriptAcrossNodes) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  const std::string missing = pythonImportError("torch.distributed");
  ASSERT_TRUE(missing.empty()) << missing;
  LaunchResult r = runLaunch(
      fanOut(*c, {"--nproc-per-node", "2", "--python", python(),
                  sourceDir() + "/tests/launcher/ddp_compat.py", "--steps", "3"}),
      {}, 100);
  ASSERT_EQ(r.exitCode, 0) << r.all();
  std::set<std::string> sums;
  for (int rank = 0; rank < 4; ++rank) {
    const std::string line = fmt::format(
        "[node{} rank{}]: ddp_compat rank={} local_rank={} world=4 replicas_equal=True "
        "restart_count=0 weight_sum=",
        rank / 2, rank, rank, rank % 2);
    const auto at = r.out.find(line);
    ASSERT_NE(at, std::string::npos) << line << "\n" << r.all();
    sums.insert(r.out.substr(at + line.size(), r.out.find('\n', at) - at - line.size()));
  }
  EXPECT_EQ(sums.size(), 1u) << "the ranks' weights differ: " << r.out;
}

TEST(MultiNode, FanOutFromNodeZeroRunsItsAgentWithoutSsh) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  // Node 0's sshd is stopped: the master, inside node 0, must run node 0's agent itself.
  std::string pid = readFile(c->dir() + "/host0/sshd.pid");
  ASSERT_FALSE(pid.empty());
  ASSERT_EQ(::kill(std::stoi(pid), SIGKILL), 0);
  LaunchProcess p(fanOutFromANode(*c, {"--nproc-per-node", "2", workerPath(), "--steps", "10",
                                       "--step-ms", "50"}),
                  {}, c->on(0));
  ASSERT_TRUE(waitForWorkers(p, 4, 30)) << p.out() << p.err();
  // By default the store binds node 0's address toward the other hosts, and only that one.
  std::string tables;
  ASSERT_EQ(c->run(0, "cat /proc/net/tcp /proc/net/tcp6", &tables), 0);
  EXPECT_EQ(listeningAddresses(tables, 29400), std::vector<std::string>{c->hosts()[0]}) << tables;
  LaunchResult r = p.wait(60);
  ASSERT_EQ(r.exitCode, 0) << r.all();
  EXPECT_EQ(countLines(r.out, ": done"), 4) << r.all();
  // The store is on node 0's own address, not loopback.
  EXPECT_NE(r.out.find("joined store " + c->hosts()[0] + ":29400"), std::string::npos) << r.all();
}

TEST(MultiNode, TrainLinearUnderDdpAcrossNodes) {
  const std::string trainer = binaryDir() + "/train_linear";
  if (::access(trainer.c_str(), X_OK) != 0) GTEST_SKIP() << "train_linear not built (no libtorch)";
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  LaunchResult r = runLaunch(fanOut(*c, {"--nproc-per-node", "1", trainer, "--epochs", "3"}), {},
                             90);
  ASSERT_EQ(r.exitCode, 0) << r.all();
  EXPECT_NE(r.all().find("over 2 ranks"), std::string::npos) << r.all();
  std::smatch m;
  std::string all = r.all();
  ASSERT_TRUE(std::regex_search(all, m, std::regex("largest weight error ([0-9.]+)"))) << all;
  EXPECT_LT(std::stod(m[1]), 0.02);
}

// Manual mode: `launch` on every node, as torchrun is used; from flags, Slurm or PET_* variables.
void runManual(const Cluster& c, const std::vector<std::vector<std::string>>& argsPerNode,
               const std::vector<std::vector<std::string>>& envPerNode) {
  std::vector<std::unique_ptr<LaunchProcess>> nodes;
  for (size_t k = 0; k < argsPerNode.size(); ++k) {
    nodes.push_back(
        std::make_unique<LaunchProcess>(argsPerNode[k], envPerNode[k], c.on(static_cast<int>(k))));
  }
  for (size_t k = 0; k < nodes.size(); ++k) {
    LaunchResult r = nodes[k]->wait(60);
    EXPECT_EQ(r.exitCode, 0) << "node " << k << ":\n" << r.all();
    EXPECT_EQ(countLines(r.out, ": done"), 2) << r.all();
    EXPECT_NE(r.out.find("world_size=4"), std::string::npos) << r.all();
  }
}

TEST(MultiNode, ManualModeWithTokenFile) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  const std::string token = c->dir() + "/job.token";  // outside /tmp: every node sees it
  writeFile(token, "0123456789abcdef0123456789abcdef\n");
  std::vector<std::vector<std::string>> args;
  for (int k = 0; k < 2; ++k) {
    args.push_back(cat(timings(), {"--nnodes", "2", "--node-rank", std::to_string(k),
                                   "--rdzv-endpoint", c->hosts()[0] + ":29400", "--token-file",
                                   token, "--nproc-per-node", "2", workerPath(), "--steps", "1"}));
  }
  runManual(*c, args, {{}, {}});
}

TEST(MultiNode, ManualNodeWithoutTheProgramEndsEveryNodeWithItsCode) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  // The program only in node 0's private work directory: node 1 cannot run it. Every node ends
  // with 127 and says why -- node 1 too, although node 0 (the store's host) ends at once: its
  // store stays until node 1 has read the end.
  const std::string program = c->workDir() + "/prog";
  ASSERT_EQ(c->run(0, "cp " + workerPath() + " " + program), 0);
  const std::string token = c->dir() + "/job.token";
  writeFile(token, "0123456789abcdef0123456789abcdef\n");
  std::vector<std::unique_ptr<LaunchProcess>> nodes;
  for (int k = 0; k < 2; ++k) {
    nodes.push_back(std::make_unique<LaunchProcess>(
        cat(timings(),
            {"--nnodes", "2", "--node-rank", std::to_string(k), "--rdzv-endpoint", c->hosts()[0],
             "--token-file", token, "--nproc-per-node", "1", program, "--steps", "1"}),
        std::vector<std::string>{}, c->on(k)));
  }
  LaunchResult r0 = nodes[0]->wait(60);
  LaunchResult r1 = nodes[1]->wait(60);
  EXPECT_EQ(r0.exitCode, 127) << r0.all();
  EXPECT_EQ(r1.exitCode, 127) << r1.all();
  EXPECT_NE(
      r0.err.find("node 1 (node rank 1) cannot run: program \"" + program + "\" not found on host"),
      std::string::npos)
      << r0.err;
  EXPECT_NE(r1.err.find("program \"" + program + "\" not found on host"), std::string::npos)
      << r1.err;
  EXPECT_EQ(r1.err.find("lost the store"), std::string::npos) << r1.err;
}

TEST(MultiNode, ManualModeWithoutTokenOffLoopbackIsAUsageError) {
  for (const char* rank : {"0", "1"}) {
    LaunchResult r = runLaunch({"--nnodes", "2", "--node-rank", rank, "--rdzv-endpoint",
                                "10.231.254.1:29400", workerPath()},
                               {"DTRAIN_STORE_TOKEN="}, 20);
    EXPECT_EQ(r.exitCode, 2) << r.all();
    EXPECT_NE(r.err.find("a store at 10.231.254.1 (off loopback) needs a job token"),
              std::string::npos)
        << r.all();
    EXPECT_NE(r.err.find("HINT: make one token and give it to every node, e.g. `openssl rand -hex "
                         "32 > job.token`"),
              std::string::npos)
        << r.all();
    EXPECT_EQ(r.out.find("worker rank="), std::string::npos) << "a worker was started: " << r.out;
  }
}

TEST(MultiNode, ManualNodeWithAnotherTokenIsRefusedAtOnce) {
  // Node 1 holds another job's token: node 0's store refuses it, and node 1 says so at once,
  // not after retrying for the rendezvous timeout.
  TempDir dir;
  writeFile(dir.file("a.token"), "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n");
  writeFile(dir.file("b.token"), "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\n");
  const std::string endpoint = "127.0.0.1:" + std::to_string(freeLoopbackPort());
  LaunchProcess node0(
      cat(timings(), {"--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", endpoint,
                      "--token-file", dir.file("a.token"), "--rdzv-timeout", "6", workerPath()}));
  LaunchResult r = runLaunch(
      cat(timings(), {"--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", endpoint,
                      "--token-file", dir.file("b.token"), "--rdzv-timeout", "30", workerPath()}),
      {}, 40);
  EXPECT_EQ(r.exitCode, 125) << r.all();
  EXPECT_NE(r.err.find("the store at 127.0.0.1:" + endpoint.substr(10) + " refused this node"),
            std::string::npos)
      << r.err;
  EXPECT_LT(r.seconds, 6 + kMargin) << r.err;
  LaunchResult r0 = node0.wait(30);
  EXPECT_EQ(r0.exitCode, 124) << r0.all();
  EXPECT_NE(r0.err.find("missing: node 1 (node rank 1)"), std::string::npos) << r0.err;
}

TEST(MultiNode, SlurmVariables) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  // SLURM_JOB_NODELIST in Slurm's bracket form: "10.231.S.[1-2]".
  const std::string prefix = c->hosts()[0].substr(0, c->hosts()[0].rfind('.') + 1);
  std::vector<std::vector<std::string>> args, env;
  for (int k = 0; k < 2; ++k) {
    args.push_back(cat(timings(), {"--nproc-per-node", "2", workerPath(), "--steps", "1"}));
    env.push_back({"SLURM_JOB_NODELIST=" + prefix + "[1-2]", "SLURM_NNODES=2",
                   "SLURM_NODEID=" + std::to_string(k), "DTRAIN_STORE_TOKEN=slurmtoken1234"});
  }
  runManual(*c, args, env);
}

TEST(MultiNode, KubernetesPetVariables) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  std::vector<std::vector<std::string>> args, env;
  for (int k = 0; k < 2; ++k) {
    args.push_back(cat(timings(), {workerPath(), "--steps", "1", "--print-env"}));
    env.push_back({"PET_NNODES=2", "PET_NODE_RANK=" + std::to_string(k), "PET_NPROC_PER_NODE=2",
                   "PET_MASTER_ADDR=" + c->hosts()[0], "PET_MASTER_PORT=23456",
                   "DTRAIN_STORE_TOKEN=pettoken12345678"});
  }
  runManual(*c, args, env);
}

TEST(MultiNode, HostfileWithIncludeAndExclude) {
  DTRAIN_CLUSTER_OR_SKIP(c, 3);
  const std::string hostfile = c->dir() + "/hostfile";
  writeFile(hostfile, "# three nodes\n" + c->hosts()[0] + " slots=2\n" + c->hosts()[1] +
                          " slots=2\n\n" + c->hosts()[2] + " slots=2 # spare\n");
  // Node 0 with slot 1 only, node 1 whole, node 2 left out.
  LaunchResult r = runLaunch(
      cat(cat({"--hostfile", hostfile, "--ssh-config", c->sshConfig(), "--include",
               c->hosts()[0] + ":1@" + c->hosts()[1], "--rdzv-endpoint",
               c->bridgeAddress() + ":" + std::to_string(storePort(*c))},
              timings()),
          {workerPath(), "--steps", "1", "--print-env"}),
      {}, 60);
  ASSERT_EQ(r.exitCode, 0) << r.all();
  EXPECT_NE(r.out.find("world_size=3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 0: env CUDA_VISIBLE_DEVICES=1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1: env GROUP_RANK=1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 2: env GROUP_RANK=1"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("rank 3:"), std::string::npos) << r.out;
  // The NCCL interface: each node's own, never lo.
  EXPECT_NE(r.out.find("rank 0: env NCCL_SOCKET_IFNAME=eth0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 0: env GLOO_SOCKET_IFNAME=eth0"), std::string::npos) << r.out;
  // --exclude: slot 0 of node 1 and all of node 2 (seen in the plan of a dry run).
  r = runLaunch({"--hostfile", hostfile, "--exclude", c->hosts()[1] + ":0@" + c->hosts()[2],
                 "--dry-run", workerPath()},
                {}, 20);
  ASSERT_EQ(r.exitCode, 0) << r.all();
  EXPECT_NE(r.out.find("node 1 " + c->hosts()[1] + " (" + c->hosts()[1] +
                       "), 1 workers, CUDA_VISIBLE_DEVICES=1"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("node 2"), std::string::npos) << r.out;
  r = runLaunch({"--hostfile", hostfile, "--include", c->hosts()[0], "--exclude", c->hosts()[1],
                 workerPath()},
                {}, 20);
  EXPECT_EQ(r.exitCode, 2) << r.all();
}

TEST(MultiNode, HostfileDuplicateNamesTheLine) {
  TempDir dir;
  writeFile(dir.file("hosts"), "a slots=1\nb slots=1\na slots=2\n");
  LaunchResult r = runLaunch({"--hostfile", dir.file("hosts"), workerPath()}, {}, 20);
  EXPECT_EQ(r.exitCode, 2) << r.all();
  EXPECT_NE(r.err.find("line 3: host a is listed twice (first on line 1)"), std::string::npos)
      << r.err;
}

TEST(MultiNode, ArgumentsArriveByteIdenticalOnEveryNode) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  const std::vector<std::string> corpus = {
      "with space", "it's", "say \"hi\"",   "$(id)", "`id`",          "a;b",         "x && y",
      "*",          "~",    "line1\nline2", "",      "-leading-dash", "caf\xc3\xa9", "\xff\xfe raw",
      "$HOME",      "'"};
  // Each worker prints every argument as hex, one a line; RANK tells the nodes apart.
  const std::string script =
      "for a in \"$@\"; do printf 'arg %s ' \"$RANK\"; printf '%s' \"$a\" | od -An -tx1 -v | "
      "tr -d ' \\n'; echo; done";
  std::vector<std::string> args = fanOut(*c,
                                         {"--nproc-per-node", "1", "/bin/sh", "-c", script, "sh"});
  args.insert(args.end(), corpus.begin(), corpus.end());
  LaunchResult r = runLaunch(args, {}, 60);
  ASSERT_EQ(r.exitCode, 0) << r.all();
  for (int rank = 0; rank < 2; ++rank) {
    std::string expect;
    for (const auto& a : corpus) {
      std::string hex;
      for (unsigned char ch : a) hex += fmt::format("{:02x}", ch);
      expect += fmt::format("[node{} rank{}]: arg {} {}\n", rank, rank, rank, hex);
    }
    std::string got;
    std::istringstream in(r.out);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(fmt::format("[node{} rank{}]: arg", rank, rank), 0) == 0) got += line + "\n";
    }
    EXPECT_EQ(got, expect) << "rank " << rank;
  }
}

TEST(MultiNode, EnvironmentArrivesByteIdenticalOnEveryNode) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  // The argument corpus as environment values: every one by --env, and every one a line can
  // hold by .dtrain_env (in the master's working directory, which every node also has).
  const std::vector<std::string> corpus = {"with space",
                                           "it's",
                                           "say \"hi\"",
                                           "$(id)",
                                           "`id`",
                                           "a;b",
                                           "x && y",
                                           "*",
                                           "~",
                                           "line1\nline2",
                                           "",
                                           "-leading-dash",
                                           "caf\xc3\xa9",
                                           "\xff\xfe raw",
                                           "$HOME",
                                           "'",
                                           "a=b=c",
                                           " lead and trail "};
  std::vector<std::pair<std::string, std::string>> expected;  // name, value
  std::vector<std::string> envOptions;
  std::string dotEnv = "# the corpus, one variable a line\n";
  for (size_t i = 0; i < corpus.size(); ++i) {
    expected.emplace_back("E" + std::to_string(i), corpus[i]);
    envOptions.insert(envOptions.end(), {"--env", "E" + std::to_string(i) + "=" + corpus[i]});
    if (corpus[i].find('\n') == std::string::npos) {
      expected.emplace_back("D" + std::to_string(i), corpus[i]);
      dotEnv += "D" + std::to_string(i) + "=" + corpus[i] + "\n";
    }
  }
  const std::string jobDir = c->dir() + "/envjob";
  ASSERT_EQ(::mkdir(jobDir.c_str(), 0755), 0);
  writeFile(jobDir + "/.dtrain_env", dotEnv);
  // Each worker prints, per variable, whether it is set and its value as hex.
  std::string names;
  for (const auto& [name, value] : expected) names += " " + name;
  const std::string script =
      "for n in" + names +
      "; do eval \"v=\\${$n-} s=\\${$n+set}\"; printf 'env %s %s %s ' "
      "\"$RANK\" \"$n\" \"${s:-unset}\"; printf '%s' \"$v\" | od -An -tx1 -v | tr -d ' \\n'; "
      "echo; done";
  LaunchProcess p(cat(fanOut(*c, envOptions), {"--nproc-per-node", "1", "/bin/sh", "-c", script}),
                  {}, {"/bin/sh", "-c", "cd \"$1\" && shift && exec \"$@\"", "sh", jobDir});
  LaunchResult r = p.wait(60);
  ASSERT_EQ(r.exitCode, 0) << r.all();
  for (int rank = 0; rank < 2; ++rank) {
    std::string want;
    for (const auto& [name, value] : expected) {
      std::string hex;
      for (unsigned char ch : value) hex += fmt::format("{:02x}", ch);
      want += fmt::format("[node{} rank{}]: env {} {} set {}\n", rank, rank, rank, name, hex);
    }
    std::string got;
    std::istringstream in(r.out);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(fmt::format("[node{} rank{}]: env", rank, rank), 0) == 0) got += line + "\n";
    }
    EXPECT_EQ(got, want) << "rank " << rank;
  }
}

TEST(MultiNode, TokenInNoCommandLineAndNoLog) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  const std::string logDir = c->workDir() + "/logs";  // private on every node
  LaunchProcess p(fanOut(*c, {"--nproc-per-node", "2", "--log-dir", logDir, workerPath(), "--steps",
                              "40", "--step-ms", "50", "--print-env"}),
                  {"DTRAIN_VERBOSE=2"});
  ASSERT_TRUE(waitForWorkers(p, 4, 30)) << p.out() << p.err();
  // The token, from a remote worker's environment.
  std::string token;
  std::vector<pid_t> workers = pidsOn(*c, 1, workerPath());
  ASSERT_FALSE(workers.empty());
  for (pid_t w : workers) {
    std::string env = readFile("/proc/" + std::to_string(w) + "/environ");
    size_t at = env.find("DTRAIN_STORE_TOKEN=");
    if (at != std::string::npos) token = env.substr(at + 19, env.find('\0', at) - at - 19);
  }
  ASSERT_GE(token.size(), 32u);
  // No command line of any process on this machine (every namespace shares its /proc) has it.
  DIR* d = ::opendir("/proc");
  int scanned = 0;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::string cmd = readFile(std::string("/proc/") + e->d_name + "/cmdline");
    EXPECT_EQ(cmd.find(token), std::string::npos) << "pid " << e->d_name << ": " << cmd;
    ++scanned;
  }
  ::closedir(d);
  EXPECT_GT(scanned, 10);
  LaunchResult r = p.wait(60);
  ASSERT_EQ(r.exitCode, 0) << r.all();
  EXPECT_EQ(r.all().find(token), std::string::npos);
  for (int k = 0; k < 2; ++k) {
    std::string found;
    EXPECT_EQ(c->run(k, "grep -rlF -- " + token + " " + logDir + " || test -d " + logDir, &found),
              0);
    EXPECT_EQ(found, "") << "node " << k << " logs hold the token";
  }
}

TEST(MultiNode, DryRunShowsEveryNodeAndRedactsTheToken) {
  TempDir dir;
  writeFile(dir.file(".dtrain_env"), "FROM_DOTENV=yes\n");
  LaunchProcess p({"--hosts", "10.231.254.1,10.231.254.2:4", "--dry-run", "--nccl-debug", "info",
                   workerPath(), "it's"},
                  {"NCCL_IB_HCA=mlx5"},
                  {"/bin/sh", "-c", "cd \"$1\" && shift && exec \"$@\"", "sh", dir.path()});
  LaunchResult r = p.wait(20);
  ASSERT_EQ(r.exitCode, 0) << r.all();
  EXPECT_NE(r.out.find("token <redacted>"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("NCCL_IB_HCA=mlx5"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FROM_DOTENV=yes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("NCCL_DEBUG=INFO"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("node 1 10.231.254.2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("BatchMode=yes"), std::string::npos) << r.out;
  // A quote inside single quotes is closed, double-quoted and reopened ('"'"'): read alike by
  // sh and by csh, tcsh and fish login shells (Note [Remote command lines]).
  EXPECT_NE(r.out.find("'\"'\"'"), std::string::npos)
      << "the argument it's, single-quoted: " << r.out;
}

}  // namespace
}  // namespace dtrain::testing

namespace dtrain::testing {
namespace {

TEST(MultiNodeCheck, GreenOnAHealthyCluster) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  LaunchResult r = runLaunch(fanOut(*c, {"--check", "--nproc-per-node", "2", workerPath()}), {},
                             60);
  EXPECT_EQ(r.exitCode, 0) << r.all();
  EXPECT_NE(r.out.find("launch --check: all is well"), std::string::npos) << r.out;
  for (int k = 0; k < 2; ++k) {
    EXPECT_NE(r.out.find(c->hosts()[k]), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("eth0 " + c->hosts()[k]), std::string::npos) << r.out;
  }
  EXPECT_EQ(r.out.find("FAILED"), std::string::npos) << r.out;
}

TEST(MultiNodeCheck, ProgramPathWithShellSyntaxIsNeverRun) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  // The check runs ldd on the program in a shell on every node: its path is one quoted word.
  const std::string dir = c->dir() + "/a'$(id >&2)'b";
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  const std::string program = dir + "/prog";
  std::filesystem::copy_file(workerPath(), program);  // c->dir() is the same on every host
  LaunchResult r = runLaunch(fanOut(*c, {"--check", program}), {}, 60);
  EXPECT_EQ(r.exitCode, 0) << r.all();
  EXPECT_NE(r.out.find("launch --check: all is well"), std::string::npos) << r.out;
  EXPECT_EQ(r.all().find("uid="), std::string::npos) << "the path ran as a command: " << r.all();
}

TEST(MultiNodeCheck, NamesAMissingProgramAndAFirewalledPort) {
  DTRAIN_CLUSTER_OR_SKIP(c, 3);
  if (::access("/usr/sbin/nft", X_OK) != 0) GTEST_SKIP() << "no nft (nftables) here";
  // The program only in node 0's private work directory; node 2 drops the store port.
  const std::string program = c->workDir() + "/prog";
  ASSERT_EQ(c->run(0, "cp " + workerPath() + " " + program), 0);
  ASSERT_EQ(c->run(2, "nft add table inet f && nft add chain inet f out '{ type filter hook "
                      "output priority 0; }' && nft add rule inet f out tcp dport " +
                          std::to_string(storePort(*c)) + " drop"),
            0);
  LaunchResult r = runLaunch(fanOut(*c, {"--check", program}), {}, 60);
  EXPECT_EQ(r.exitCode, 125) << r.all();
  EXPECT_NE(r.out.find("node 1 (" + c->hosts()[1] + "): program \"" + program + "\" not found"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("node 2 (" + c->hosts()[2] + "): the store port " + c->bridgeAddress() +
                       ":" + std::to_string(storePort(*c)) +
                       " is dropped (no answer: a firewall?)"),
            std::string::npos)
      << r.out;
  // The real launch says the same about the program, and exits 127 without starting anything.
  r = runLaunch(fanOut(*c, {"--include", c->hosts()[0] + "@" + c->hosts()[1], program}), {}, 60);
  EXPECT_EQ(r.exitCode, 127) << r.all();
  EXPECT_NE(r.err.find("node 1 (" + c->hosts()[1] + ") cannot run: program \"" + program +
                       "\" not found on host " + c->hosts()[1]),
            std::string::npos)
      << r.err;
}

// A node without launch at the master's path (dtrain not installed there): --check names it and
// says what to do, and finds nothing wrong with the node that has it.
TEST(MultiNodeCheck, NamesANodeWithoutLaunch) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  const std::string launch = c->workDir() + "/launch";  // private: only host 0 gets a copy
  ASSERT_EQ(c->run(0, "cp " + launchPath() + " " + launch), 0);
  LaunchResult r = runLaunch(fanOut(*c, {"--check", "--remote-launch", launch, workerPath()}), {},
                             60);
  EXPECT_EQ(r.exitCode, 125) << r.all();
  EXPECT_NE(r.out.find("node 1 (" + c->hosts()[1] + "): ssh"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("HINT: launch is not at " + launch +
                       " there; install it, or give "
                       "--remote-launch PATH"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("node 0 (" + c->hosts()[0] + "): ssh"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace dtrain::testing
