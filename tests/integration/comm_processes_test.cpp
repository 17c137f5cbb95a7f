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
#include <map>
#include <regex>
#include <thread>

#include "launcher_harness.h"
#include "test_support.h"

namespace dtrain::testing {
namespace {

struct Failure {
  int iteration = -1;
  double ms = -1;
  std::string message;
};

// "rank R/N: FAILED at iteration I after MS ms: message", by rank.
std::map<int, Failure> failures(const std::string& output) {
  std::map<int, Failure> out;
  static const std::regex re(R"(rank (\d+)/\d+: FAILED at iteration (-?\d+) after (\d+) ms: ([^\n]*))");
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
  std::vector<std::string> args = {"--nproc-per-node", std::to_string(ranks), "--grace-period",
                                   "5", binaryPath("comm_worker")};
  args.insert(args.end(), workerArgs.begin(), workerArgs.end());
  return runLaunch(args, env, seconds);
}

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "missing \"" << (part) << "\" in: " << (text)

TEST(CommProcesses, LaunchedRanksAllreduceAndCloseCleanly) {
  auto r = launchWorkers(4, {"--iters", "30", "--count", "100003"});
  EXPECT_EQ(r.exitCode, 0) << r.all();
  EXPECT_EQ(count(r.out, "ready backend=gloo launcher=launch"), 4) << r.all();
  EXPECT_EQ(count(r.out, ": OK"), 4) << r.all();
}

// P1 and L12: rank 1 of 3 goes away at iteration 4; ranks 0 and 2 fail within 2 s naming it.
class DeadRank : public ::testing::TestWithParam<const char*> {};

TEST_P(DeadRank, SurvivorsFailWithinTwoSecondsNamingIt) {
  auto r = launchWorkers(3, {"--iters", "8", "--ignore-sigterm", "--timeout-ms", "20000"},
                         {std::string("DTRAIN_FAULT=") + GetParam() + "@rank=1,step=4"});
  auto f = failures(r.out);
  for (int survivor : {0, 2}) {
    ASSERT_TRUE(f.count(survivor)) << "rank " << survivor << " did not report\n" << r.all();
    EXPECT_EQ(f[survivor].iteration, 4);
    EXPECT_LE(f[survivor].ms, 2000) << "P1 for rank " << survivor << ": " << f[survivor].message;
    EXPECT_CONTAINS(f[survivor].message, "rank 1 (127.0.0.1:");
    EXPECT_CONTAINS(f[survivor].message, "connection");
  }
  EXPECT_NE(r.exitCode, 0) << "a rank that leaves early is not a group success\n" << r.all();
}

INSTANTIATE_TEST_SUITE_P(Faults, DeadRank,
                         ::testing::Values("signal:KILL", "signal:TERM", "abort", "exit:1", "exit:0"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& ch : name) if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });

TEST(CommProcesses, FrozenRankFailsSurvivorsAtTheCollectiveTimeout) {
  auto r = launchWorkers(2, {"--iters", "6", "--ignore-sigterm", "--timeout-ms", "3000"},
                         {"DTRAIN_FAULT=stop@rank=1,step=3"});
  auto f = failures(r.out);
  ASSERT_TRUE(f.count(0)) << r.all();
  EXPECT_EQ(f[0].iteration, 3);
  EXPECT_GE(f[0].ms, 2900);
  EXPECT_LE(f[0].ms, 5000) << "P2: timeout + 2 s";
  EXPECT_CONTAINS(f[0].message, "timed out after 3000 ms waiting for data from rank 1 (127.0.0.1)");
  EXPECT_CONTAINS(f[0].message, "rank 1 did not report");
}

TEST(CommProcesses, SkippedCollectiveIsReportedAsDesyncOnBothSides) {
  auto r = launchWorkers(2, {"--iters", "6", "--ignore-sigterm", "--timeout-ms", "2000"},
                         {"DTRAIN_FAULT=skip-collective@rank=1,step=3"});
  auto f = failures(r.out);
  ASSERT_TRUE(f.count(0) && f.count(1)) << r.all();
  EXPECT_EQ(f[0].iteration, 3);
  EXPECT_CONTAINS(f[0].message, "rank 1 is ahead at seq 4");
  EXPECT_EQ(f[1].iteration, 4);
  EXPECT_CONTAINS(f[1].message, "rank 0 is behind at seq 3");
  for (auto& [rank, fail] : f) EXPECT_LE(fail.ms, 4000) << "rank " << rank;
}

TEST(CommProcesses, ShapeMismatchIsCaughtAtOnceByTheCollectiveCheck) {
  auto r = launchWorkers(2, {"--iters", "5", "--count", "4096", "--shape", "64,64", "--check",
                             "--ignore-sigterm"},
                         {"DTRAIN_FAULT=wrong-shape@rank=1,step=2"});
  auto f = failures(r.out);
  ASSERT_TRUE(f.count(0) && f.count(1)) << r.all();
  EXPECT_CONTAINS(f[0].message, "collective check failed: this rank calls seq 2 allreduce(float32 "
                                "[64, 64], sum); rank 1 calls seq 2 allreduce(float32 [64, 63], sum)");
  EXPECT_LT(f[0].ms, 1000) << "no timeout needed";
  EXPECT_EQ(r.exitCode, 4) << "InvalidArgument: the worker's own exit code\n" << r.all();
}

TEST(CommProcesses, ShapeMismatchWithoutTheCheckTimesOutNamingBothShapes) {
  auto r = launchWorkers(2, {"--iters", "5", "--count", "4096", "--shape", "64,64",
                             "--ignore-sigterm", "--timeout-ms", "2000"},
                         {"DTRAIN_FAULT=wrong-shape@rank=1,step=2"});
  auto f = failures(r.out);
  ASSERT_TRUE(f.count(0)) << r.all();
  EXPECT_CONTAINS(f[0].message, "rank 1 calls allreduce(float32 [64, 63], sum) at seq 2 where this "
                                "rank calls allreduce(float32 [64, 64], sum)");
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

// Runs one comm_worker per environment, all at once, without launch; outputs by index.
std::vector<Spawned> spawnWorkers(const std::vector<std::map<std::string, std::string>>& envs,
                                  const std::vector<std::string>& args, double seconds = 30) {
  TempDir dir;
  std::vector<pid_t> pids;
  for (size_t i = 0; i < envs.size(); ++i) {
    pid_t pid = fork();
    if (pid == 0) {
      for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "DTRAIN_STORE_ADDR",
                            "DTRAIN_STORE_PORT", "MASTER_ADDR", "MASTER_PORT", "DTRAIN_FAULT",
                            "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "DTRAIN_BACKEND"}) {
        unsetenv(v);
      }
      for (auto& [k, v] : envs[i]) setenv(k.c_str(), v.c_str(), 1);
      int fd = open(dir.file("out" + std::to_string(i)).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(fd, 1);
      dup2(fd, 2);
      std::string worker = binaryPath("comm_worker");
      std::vector<char*> argv{worker.data()};
      std::vector<std::string> copy = args;
      for (auto& a : copy) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(worker.c_str(), argv.data());
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
    envs.push_back({{"SLURM_PROCID", std::to_string(r)}, {"SLURM_NTASKS", "3"},
                    {"SLURM_LOCALID", std::to_string(r)}, {"MASTER_ADDR", "127.0.0.1"},
                    {"MASTER_PORT", port}});
  }
  auto runs = spawnWorkers(envs, {"--iters", "10"});
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(runs[r].exitCode, 0) << runs[r].output;
    EXPECT_CONTAINS(runs[r].output, "ready backend=gloo launcher=srun");
    EXPECT_CONTAINS(runs[r].output, ": OK");
  }
}

TEST(CommProcesses, UnderMpirunRankZeroHostsTheStoreAtMasterAddr) {
  const std::string port = std::to_string(freeLoopbackPort());
  std::vector<std::map<std::string, std::string>> envs;
  for (int r = 0; r < 2; ++r) {
    envs.push_back({{"OMPI_COMM_WORLD_RANK", std::to_string(r)}, {"OMPI_COMM_WORLD_SIZE", "2"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(r)},
                    {"MASTER_ADDR", "localhost"}, {"MASTER_PORT", port}});
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

}  // namespace
}  // namespace dtrain::testing
