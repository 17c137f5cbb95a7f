// The communicator across real processes (docs/reliability.md P1-P7, L12, U6): comm_worker ranks
// started by `launch`, or directly with srun/mpirun-style variables (rank 0 hosts the store).
// Survivors run with --ignore-sigterm so they outlive launch's teardown long enough to report
// their own failure, which is what these tests measure.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>
#include <thread>

#include "dtrain/base/tcp_store.h"
#include "launcher_support.h"
#include "test_support.h"

namespace dtrain::testing::comm_processes_test {
namespace {

struct Failure {
  int iteration = -1;
  double ms = -1;
  std::string message;
};

// "rank R/N: FAILED at iteration I after MS ms: message", by rank.
std::map<int, Failure> failures(const std::string& output) {
  std::map<int, Failure> out;
  static const std::regex re(
      R"(rank (\d+)/\d+: FAILED at iteration (-?\d+) after (\d+) ms: ([^\n]*))");
  for (std::sregex_iterator it(output.begin(), output.end(), re), end; it != end; ++it) {
    Failure f;
    f.iteration = std::stoi((*it)[2]);
    f.ms = std::stod((*it)[3]);
    f.message = (*it)[4];
    out[std::stoi((*it)[1])] = f;
  }
  return out;
}

int count(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

LaunchResult launchWorkers(int ranks, const std::vector<std::string>& workerArgs,
                           const std::vector<std::string>& env = {}, double seconds = 60) {
  std::vector<std::string> args = {"--nproc-per-node", std::to_string(ranks), "--grace-period", "5",
                                   binaryPath("comm_worker")};
  args.insert(args.end(), workerArgs.begin(), workerArgs.end());
  return runLaunch(args, env, seconds);
}

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "missing \"" << (part) << "\" in: " << (text)

// Both CPU paths of one node: Gloo over loopback (DTRAIN_SHM=0) and shared memory (the default).
struct Path {
  const char* name;
  std::vector<std::string> env;
};
const Path kGloo{"gloo", {"DTRAIN_SHM=0"}};
const Path kShm{"shm", {}};

std::vector<std::string> with(const Path& path, std::vector<std::string> env) {
  env.insert(env.end(), path.env.begin(), path.env.end());
  return env;
}

class CommPath : public ::testing::TestWithParam<Path> {
 protected:
  bool shm() const { return std::string(GetParam().name) == "shm"; }
};

std::string pathName(const ::testing::TestParamInfo<Path>& info) { return info.param.name; }

TEST_P(CommPath, LaunchedRanksAllreduceAndCloseCleanly) {
  auto r = launchWorkers(4, {"--iters", "30", "--count", "100003"}, with(GetParam(), {}));
  EXPECT_EQ(r.exitCode, 0) << r.all();
  EXPECT_EQ(count(r.out, std::string("ready backend=") + GetParam().name + " launcher=launch"), 4)
      << r.all();
  EXPECT_EQ(count(r.out, ": OK"), 4) << r.all();
}

// P1, H1 and L12: rank 1 of 3 goes away at iteration 4; ranks 0 and 2 fail within 2 s naming it:
// Gloo by its connection, shared memory by its pid (a pidfd per peer).
class DeadRank : public ::testing::TestWithParam<std::tuple<Path, const char*>> {};

TEST_P(DeadRank, SurvivorsFailWithinTwoSecondsNamingIt) {
  const auto& [path, fault] = GetParam();
  auto r = launchWorkers(3, {"--iters", "8", "--ignore-sigterm", "--timeout-ms", "20000"},
                         with(path, {std::string("DTRAIN_FAULT=") + fault + "@rank=1,step=4"}));
  auto f = failures(r.out);
  for (int survivor : {0, 2}) {
    ASSERT_TRUE(f.count(survivor)) << "rank " << survivor << " did not report\n" << r.all();
    EXPECT_EQ(f[survivor].iteration, 4);
    EXPECT_LE(f[survivor].ms, 2000) << "P1 for rank " << survivor << ": " << f[survivor].message;
    if (std::string(path.name) == "shm") {
      EXPECT_CONTAINS(f[survivor].message, "rank 1 (pid ");
      EXPECT_CONTAINS(f[survivor].message, "exited while this rank waited for");
    } else {
      EXPECT_CONTAINS(f[survivor].message, "rank 1 (127.0.0.1:");
      EXPECT_CONTAINS(f[survivor].message, "connection");
    }
  }
  EXPECT_NE(r.exitCode, 0) << "a rank that leaves early is not a group success\n" << r.all();
}

INSTANTIATE_TEST_SUITE_P(Faults, DeadRank,
                         ::testing::Combine(::testing::Values(kGloo, kShm),
                                            ::testing::Values("signal:KILL", "signal:TERM", "abort",
                                                              "exit:1", "exit:0")),
                         [](const auto& info) {
                           std::string name = std::string(std::get<0>(info.param).name) + "_" +
                                              std::get<1>(info.param);
                           for (char& ch : name)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });

TEST_P(CommPath, FrozenRankFailsSurvivorsAtTheCollectiveTimeout) {
  auto r = launchWorkers(2, {"--iters", "6", "--ignore-sigterm", "--timeout-ms", "3000"},
                         with(GetParam(), {"DTRAIN_FAULT=stop@rank=1,step=3"}));
  auto f = failures(r.out);
  ASSERT_TRUE(f.count(0)) << r.all();
  EXPECT_EQ(f[0].iteration, 3);
  EXPECT_GE(f[0].ms, 2900);
  EXPECT_LE(f[0].ms, 5000) << "P2: timeout + 2 s";
  if (shm()) {
    EXPECT_CONTAINS(f[0].message, "timed out waiting for rank 1 (pid ");
    EXPECT_CONTAINS(f[0].message, "rank 1 is outside any collective, its last was seq 2");
    EXPECT_CONTAINS(f[0].message, "the process is alive");
  } else {
    EXPECT_CONTAINS(f[0].message,
                    "timed out after 3000 ms waiting for data from rank 1 (127.0.0.1)");
    EXPECT_CONTAINS(f[0].message, "rank 1 did not report");
  }
}

// P4: Gloo notices at the timeout; shared memory at once, from the descriptors the ranks post.
TEST_P(CommPath, SkippedCollectiveIsReportedAsDesyncOnBothSides) {
  auto r = launchWorkers(2, {"--iters", "6", "--ignore-sigterm", "--timeout-ms", "2000"},
                         with(GetParam(), {"DTRAIN_FAULT=skip-collective@rank=1,step=3"}));
  auto f = failures(r.out);
  ASSERT_TRUE(f.count(0) && f.count(1)) << r.all();
  EXPECT_EQ(f[0].iteration, 3);
  EXPECT_CONTAINS(f[0].message, "rank 1 is ahead at seq 4");
  EXPECT_EQ(f[1].iteration, 4);
  EXPECT_CONTAINS(f[1].message, "rank 0 is behind at seq 3");
  for (auto& [rank, fail] : f) EXPECT_LE(fail.ms, shm() ? 1000 : 4000) << "rank " << rank;
}

TEST_P(CommPath, ShapeMismatchIsCaughtAtOnceByTheCollectiveCheck) {
  auto r = launchWorkers(
      2, {"--iters", "5", "--count", "4096", "--shape", "64,64", "--check", "--ignore-sigterm"},
      with(GetParam(), {"DTRAIN_FAULT=wrong-shape@rank=1,step=2"}));
  auto f = failures(r.out);
  ASSERT_TRUE(f.count(0) && f.count(1)) << r.all();
  EXPECT_CONTAINS(f[0].message,
                  "collective check failed: this rank calls seq 2 allreduce(float32 "
                  "[64, 64], sum); rank 1 calls seq 2 allreduce(float32 [64, 63], sum)");
  EXPECT_LT(f[0].ms, 1000) << "no timeout needed";
  EXPECT_EQ(r.exitCode, 4) << "InvalidArgument: the worker's own exit code\n" << r.all();
}

// P5: without the check, Gloo's ranks time out and compare notes; shared memory compares every
// collective anyway (it costs nothing there) and fails at once.
TEST_P(CommPath, ShapeMismatchWithoutTheCheckNamesBothShapes) {
  auto r = launchWorkers(2,
                         {"--iters", "5", "--count", "4096", "--shape", "64,64", "--ignore-sigterm",
                          "--timeout-ms", "2000"},
                         with(GetParam(), {"DTRAIN_FAULT=wrong-shape@rank=1,step=2"}));
  auto f = failures(r.out);
  ASSERT_TRUE(f.count(0)) << r.all();
  if (shm()) {
    EXPECT_CONTAINS(f[0].message, "collective check failed: this rank calls seq 2 allreduce("
                                  "float32 [64, 64], sum); rank 1 calls seq 2 allreduce(float32 "
                                  "[64, 63], sum)");
    EXPECT_LT(f[0].ms, 1000);
  } else {
    EXPECT_CONTAINS(f[0].message, "rank 1 calls allreduce(float32 [64, 63], sum) at seq 2 where "
                                  "this rank calls allreduce(float32 [64, 64], sum)");
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, CommPath, ::testing::Values(kGloo, kShm), pathName);

// H2: the segment has no name (a memfd passed over a socket that exists only while the ranks
// connect), so nothing of it outlives the job, even when launch and every worker are SIGKILLed
// mid-collective.
bool anyProcessMapsASegment(std::string* who) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string maps = readFile(entry.path().string() + "/maps");
    if (maps.find("memfd:dtrain-shm") != std::string::npos) {
      if (who) *who = name;
      return true;
    }
  }
  return false;
}

std::vector<std::string> devShmEntries() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename();
    if (name.find("dtrain") != std::string::npos) out.push_back(name);
  }
  return out;
}

TEST(CommProcesses, NoSegmentOutlivesASigkilledJob) {
  ASSERT_FALSE(anyProcessMapsASegment(nullptr)) << "a segment from before this test";
  const auto shmBefore = devShmEntries();
  LaunchProcess p({"--nproc-per-node", "3", binaryPath("comm_worker"), "--iters", "1000000",
                   "--count", "300000"});
  ASSERT_TRUE(p.waitFor(
      [](const std::string& o, const std::string&) { return count(o, "ready backend=shm") == 3; },
      30))
      << p.out() << p.err();
  const auto pids = jobPids(p.out());
  ASSERT_EQ(pids.size(), 3u) << p.out();
  std::string mapper;
  EXPECT_TRUE(anyProcessMapsASegment(&mapper)) << "the ranks map their segment while they run";
  EXPECT_EQ(readFile("/proc/net/unix").find("@dtrain-shm"), std::string::npos)
      << "the socket that handed out the segment is closed once every rank has it";
  p.signal(SIGKILL);
  EXPECT_TRUE(waitGone(pids, 1.0 + kMargin).empty());
  p.wait(5);
  std::string holder;
  EXPECT_FALSE(anyProcessMapsASegment(&holder)) << "pid " << holder << " still maps a segment";
  EXPECT_EQ(devShmEntries(), shmBefore) << "nothing was ever created in /dev/shm";
}

TEST(CommProcesses, InvalidNcclVariableIsRejectedAtInitByName) {
  auto r = launchWorkers(2, {"--iters", "2"}, {"DTRAIN_BACKEND=nccl", "NCCL_IB_DISABLE=yes"});
  auto f = failures(r.out);
  ASSERT_TRUE(f.count(0) || r.out.find("FAILED") != std::string::npos) << r.all();
  EXPECT_CONTAINS(r.out, "NCCL_IB_DISABLE=\"yes\" is not a valid value: NCCL expects 0 or 1");
  EXPECT_EQ(r.exitCode, 4) << r.all();
}

// --- Without a launcher: srun / mpirun set these variables and rank 0 hosts the store. ---

struct Spawned {
  int exitCode = -1;
  std::string output;
};

// Runs one comm_worker per environment, all at once, without launch; outputs by index. Worker i
// runs under wrappers[i] when there is one (a command that runs its arguments: `unshare ...`).
std::vector<Spawned> spawnWorkers(const std::vector<std::map<std::string, std::string>>& envs,
                                  const std::vector<std::string>& args, double seconds = 30,
                                  const std::vector<std::vector<std::string>>& wrappers = {}) {
  TempDir dir;
  std::vector<pid_t> pids;
  for (size_t i = 0; i < envs.size(); ++i) {
    pid_t pid = fork();
    if (pid == 0) {
      for (const char* v :
           {"RANK", "WORLD_SIZE", "LOCAL_RANK", "DTRAIN_STORE_ADDR", "DTRAIN_STORE_PORT",
            "MASTER_ADDR", "MASTER_PORT", "DTRAIN_FAULT", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK",
            "DTRAIN_BACKEND", "GROUP_RANK", "DTRAIN_SHM", "SLURM_NODEID", "DTRAIN_STORE_TOKEN",
            "DTRAIN_RESTART_COUNT"}) {
        unsetenv(v);
      }
      for (auto& [k, v] : envs[i]) setenv(k.c_str(), v.c_str(), 1);
      int fd = open(dir.file("out" + std::to_string(i)).c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                    0600);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<std::string> command = i < wrappers.size() ? wrappers[i]
                                                             : std::vector<std::string>{};
      command.push_back(binaryPath("comm_worker"));
      command.insert(command.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : command) argv.push_back(a.data());
      argv.push_back(nullptr);
      execvp(argv[0], argv.data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<Spawned> out(envs.size());
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (size_t i = 0; i < pids.size(); ++i) {
    int status = 0;
    while (waitpid(pids[i], &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pids[i], SIGKILL);
        waitpid(pids[i], &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    out[i].exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    out[i].output = readFile(dir.file("out" + std::to_string(i)));
  }
  return out;
}

TEST(CommProcesses, UnderSrunRankZeroHostsTheStoreAtMasterAddr) {
  const std::string port = std::to_string(freeLoopbackPort());
  std::vector<std::map<std::string, std::string>> envs;
  for (int r = 0; r < 3; ++r) {
    envs.push_back({{"SLURM_PROCID", std::to_string(r)},
                    {"SLURM_NTASKS", "3"},
                    {"SLURM_LOCALID", std::to_string(r)},
                    {"MASTER_ADDR", "127.0.0.1"},
                    {"MASTER_PORT", port}});
  }
  auto runs = spawnWorkers(envs, {"--iters", "10"});
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(runs[r].exitCode, 0) << runs[r].output;
    EXPECT_CONTAINS(runs[r].output, "ready backend=shm launcher=srun");
    EXPECT_CONTAINS(runs[r].output, ": OK");
  }
}

TEST(CommProcesses, UnderMpirunRankZeroHostsTheStoreAtMasterAddr) {
  const std::string port = std::to_string(freeLoopbackPort());
  std::vector<std::map<std::string, std::string>> envs;
  for (int r = 0; r < 2; ++r) {
    envs.push_back({{"OMPI_COMM_WORLD_RANK", std::to_string(r)},
                    {"OMPI_COMM_WORLD_SIZE", "2"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(r)},
                    {"MASTER_ADDR", "localhost"},
                    {"MASTER_PORT", port}});
  }
  auto runs = spawnWorkers(envs, {"--iters", "5"});
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(runs[r].exitCode, 0) << runs[r].output;
    EXPECT_CONTAINS(runs[r].output, "launcher=mpirun");
  }
}

TEST(CommProcesses, WithoutAnyVariablesTheErrorNamesRankAndLaunch) {
  auto runs = spawnWorkers({{}}, {"--iters", "1"});
  EXPECT_EQ(runs[0].exitCode, 4) << runs[0].output;
  EXPECT_CONTAINS(runs[0].output, "RANK is not set");
  EXPECT_CONTAINS(runs[0].output, "HINT: start the program with `launch`, which sets it");
}

// Two pretend nodes of two ranks each, numbered as launch numbers nodes (GROUP_RANK): shared
// memory inside each node, Gloo across. The test hosts the job's store, as launch would (a rank
// hosting it would take it away from the others' failure reports when it fails first).
std::vector<std::map<std::string, std::string>> twoNodesOfTwo(const store::TcpStoreServer& server,
                                                              const std::string& fault = "") {
  std::vector<std::map<std::string, std::string>> envs;
  for (int r = 0; r < 4; ++r) {
    envs.push_back({{"RANK", std::to_string(r)},
                    {"WORLD_SIZE", "4"},
                    {"LOCAL_RANK", std::to_string(r % 2)},
                    {"GROUP_RANK", std::to_string(r / 2)},
                    {"DTRAIN_STORE_ADDR", "127.0.0.1"},
                    {"DTRAIN_STORE_PORT", std::to_string(server.port())},
                    {"DTRAIN_RESTART_COUNT", "0"}});
    if (!fault.empty()) envs.back()["DTRAIN_FAULT"] = fault;
  }
  return envs;
}

std::shared_ptr<store::TcpStoreServer> loopbackStore() {
  store::TcpStoreServerOptions o;
  o.host = "127.0.0.1";
  return store::TcpStoreServer::start(o);
}

TEST(CommProcesses, TwoNodesOfTwoRanksAllreduceHierarchically) {
  auto server = loopbackStore();
  auto runs = spawnWorkers(twoNodesOfTwo(*server), {"--iters", "20", "--count", "300007"});
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(runs[r].exitCode, 0) << runs[r].output;
    EXPECT_CONTAINS(runs[r].output, "ready backend=shm+gloo");
    EXPECT_CONTAINS(runs[r].output, ": OK");
  }
}

// H1 across nodes: rank 3 (node 1) dies; its node peer sees its pid exit, its cross-node peer
// (rank 1) loses the Gloo connection, and rank 0 hears of it from rank 1 through their segment.
TEST(CommProcesses, HierarchicalSurvivorsFailWithinTwoSecondsNamingTheDeadRank) {
  auto server = loopbackStore();
  auto runs = spawnWorkers(twoNodesOfTwo(*server, "signal:KILL@rank=3,step=4"),
                           {"--iters", "8", "--timeout-ms", "20000"});
  EXPECT_EQ(runs[3].exitCode, 128 + SIGKILL) << runs[3].output;
  for (int survivor : {0, 1, 2}) {
    auto f = failures(runs[survivor].output);
    ASSERT_TRUE(f.count(survivor)) << "rank " << survivor << ":\n" << runs[survivor].output;
    EXPECT_EQ(f[survivor].iteration, 4);
    EXPECT_LE(f[survivor].ms, 2000) << "rank " << survivor << ": " << f[survivor].message;
  }
  // Its node peer, by pid; rank 0 through the report rank 2 left for their cross-node group.
  EXPECT_CONTAINS(failures(runs[2].output)[2].message, "rank 3 (pid ");
  EXPECT_CONTAINS(failures(runs[0].output)[0].message, "rank 3 (pid ");
  // Its cross-node peer, by the connection, with the group's ranks translated (the group's own
  // sequence numbers: its seq 0 compared the nodes' options at creation).
  const std::string one = failures(runs[1].output)[1].message;
  EXPECT_CONTAINS(one, "(the Gloo group of local rank 1 on every node, whose ranks 0, 1 are "
                       "ranks 1, 3 here): rank 0/2: seq 5 allreduce(float32 x 4096, sum) failed: "
                       "connection");
  EXPECT_CONTAINS(one, " by rank 1 (127.0.0.1:");
}

// --- Ranks in two PID namespaces (H8; Note [Watching peers] in runtime/comm/shm/shm_wait.h) ---
// As containers that share a node's network and IPC but not its PIDs: rank 0 runs in a PID
// namespace of its own, as pid 2 (`sh`, the namespace's init, waits for it), and rank 1 in the
// test's. Neither's getpid() means anything to the other: in rank 1's namespace pid 2 is some
// other process, and rank 0's namespace has no process with rank 1's pid.

// Why ranks cannot be put in PID namespaces here ("" when they can).
std::string pidNamespacesUnavailable() {
  if (geteuid() != 0) return "needs root (unshare --pid)";
  if (std::system("unshare --pid --fork true >/dev/null 2>&1") != 0) {
    return "`unshare --pid --fork` fails here (no unshare, or PID namespaces are not allowed)";
  }
  return "";
}

std::vector<std::string> ownPidNamespace() {
  // Not `exec`: sh stays as the namespace's pid 1, so the worker is pid 2 and signals itself as
  // an ordinary process would.
  return {"unshare", "--pid", "--fork", "sh", "-c", "\"$0\" \"$@\"; exit $?"};
}

std::vector<std::map<std::string, std::string>> twoRanksOneNode(const store::TcpStoreServer& server,
                                                                const std::string& fault) {
  std::vector<std::map<std::string, std::string>> envs;
  for (int r = 0; r < 2; ++r) {
    envs.push_back({{"RANK", std::to_string(r)},
                    {"WORLD_SIZE", "2"},
                    {"LOCAL_RANK", std::to_string(r)},
                    {"GROUP_RANK", "0"},
                    {"DTRAIN_STORE_ADDR", "127.0.0.1"},
                    {"DTRAIN_STORE_PORT", std::to_string(server.port())},
                    {"DTRAIN_RESTART_COUNT", "0"},
                    {"DTRAIN_FAULT", fault}});
  }
  return envs;
}

TEST(CommProcesses, APeerInAnotherPidNamespaceIsNotDeclaredDeadAtASlowWait) {
  if (auto why = pidNamespacesUnavailable(); !why.empty()) GTEST_SKIP() << why;
  auto server = loopbackStore();
  // Each rank waits 1.5 s for the other once: 15 looks at a live peer that is slow.
  auto runs = spawnWorkers(
      twoRanksOneNode(*server, "slow:1500@rank=1,step=2;slow:1500@rank=0,step=4"),
      {"--iters", "6", "--timeout-ms", "20000"}, 30, {ownPidNamespace()});
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(runs[r].exitCode, 0) << "rank " << r << ":\n" << runs[r].output;
    EXPECT_CONTAINS(runs[r].output, "ready backend=shm");
    EXPECT_CONTAINS(runs[r].output, ": OK: 6 allreduces");
  }
  EXPECT_CONTAINS(runs[0].output, "pid=2\n") << "rank 0 is pid 2 in a namespace of its own";
}

// H1 across PID namespaces: a peer that dies is still seen, by its pidfd, within the bound.
class DeadPeerInAnotherPidNamespace : public ::testing::TestWithParam<int> {};

TEST_P(DeadPeerInAnotherPidNamespace, IsSeenWithinTwoSecondsNamingIt) {
  if (auto why = pidNamespacesUnavailable(); !why.empty()) GTEST_SKIP() << why;
  const int dead = GetParam();
  const int survivor = 1 - dead;
  auto server = loopbackStore();
  auto runs = spawnWorkers(
      twoRanksOneNode(*server, "signal:KILL@rank=" + std::to_string(dead) + ",step=3"),
      {"--iters", "6", "--timeout-ms", "20000"}, 40, {ownPidNamespace()});
  EXPECT_EQ(runs[dead].exitCode, 128 + SIGKILL) << runs[dead].output;
  auto f = failures(runs[survivor].output);
  ASSERT_TRUE(f.count(survivor)) << runs[survivor].output;
  EXPECT_EQ(f[survivor].iteration, 3);
  EXPECT_LE(f[survivor].ms, 2000) << f[survivor].message;
  EXPECT_CONTAINS(f[survivor].message,
                  "rank " + std::to_string(dead) + " (pid " + (dead == 0 ? "2" : ""));
  EXPECT_CONTAINS(f[survivor].message, " in its PID namespace) exited while this rank waited");
}

INSTANTIATE_TEST_SUITE_P(Ranks, DeadPeerInAnotherPidNamespace, ::testing::Values(0, 1),
                         [](const auto& info) {
                           return info.param == 0 ? "InTheOtherNamespace" : "InTheTestsNamespace";
                         });

}  // namespace
}  // namespace dtrain::testing::comm_processes_test
