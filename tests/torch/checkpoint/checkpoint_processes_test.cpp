// Checkpoints and resume across real processes: checkpoint_worker (checkpoint_worker.cpp, beside
// this file) trains under `launch`; a run that is SIGKILLed after a checkpoint,
// killed in the middle of a save (sync and async), or preempted with SIGTERM ends with parameters
// bitwise equal to an uninterrupted run (also sharded: ZeRO stages 2 and 3); a resume at another
// world size ends within 1e-6; ranks started by hand as two simulated nodes recover a node's lost
// directory from the other; the scaler's overflow agreement holds with DTRAIN_FAULT=nan-grad; and
// the `checkpoint` tool lists, verifies and exports what Python's torch.load reads.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "launcher_support.h"
#include "test_support.h"

namespace dtrain::testing::checkpoint_processes_test {
namespace {

constexpr double kRunSeconds = 120;

std::vector<std::string> workerArgs(const std::string& dir, const std::string& out,
                                    std::vector<std::string> extra) {
  std::vector<std::string> args = {binaryPath("checkpoint_worker"), "--dir", dir, "--out", out};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

LaunchResult train(int ranks, const std::vector<std::string>& launchExtra,
                   const std::vector<std::string>& worker,
                   const std::vector<std::string>& env = {}) {
  std::vector<std::string> args = {"--nproc-per-node", std::to_string(ranks), "--grace-period",
                                   "10"};
  args.insert(args.end(), launchExtra.begin(), launchExtra.end());
  args.insert(args.end(), worker.begin(), worker.end());
  return runLaunch(args, env, kRunSeconds);
}

// The uninterrupted run every scenario is compared with, computed once per world size.
const std::string& reference(int ranks) {
  static std::map<int, std::string> cache;
  auto it = cache.find(ranks);
  if (it != cache.end()) return it->second;
  TempDir dir;
  auto r = train(ranks, {}, workerArgs(dir.file("ckpt"), dir.file("params"), {"--steps", "12"}));
  EXPECT_EQ(r.exitCode, 0) << r.all();
  EXPECT_NE(r.out.find("rank 0 final identical across ranks"), std::string::npos) << r.all();
  return cache[ranks] = readFile(dir.file("params"));
}

void expectBitwiseEqualToReference(const std::string& params, int ranks, const LaunchResult& r) {
  ASSERT_FALSE(params.empty()) << r.all();
  EXPECT_EQ(params, reference(ranks)) << "the resumed run ended with other parameters\n" << r.all();
  EXPECT_NE(r.out.find("final identical across ranks"), std::string::npos) << r.all();
}

TEST(CheckpointResume, KilledAfterACheckpointResumesBitwise) {
  TempDir dir;
  auto r = train(
      2, {"--max-restarts", "2"},
      workerArgs(dir.file("ckpt"), dir.file("params"), {"--steps", "12", "--save-every", "3"}),
      {"DTRAIN_FAULT=signal:KILL@rank=1,step=7,attempt=0"});
  EXPECT_EQ(r.exitCode, 0) << r.all();
  EXPECT_NE(r.all().find("restored step 5"), std::string::npos) << r.all();
  expectBitwiseEqualToReference(readFile(dir.file("params")), 2, r);
}

// Calls before the first save: creating `ckpt` and `ckpt/node0` fsyncs each one's parent (open +
// fsync, twice): 4. Calls of one small save: open, 3 writes (data, manifest, header), fsync,
// rename, open+fsync the directory, LATEST's open, write, fsync, rename, open+fsync the directory:
// 14. crash@io=21 kills rank 0 right after the second save wrote its manifest, before the header:
// a torn temporary.
TEST(CheckpointResume, KilledDuringASynchronousSaveResumesFromThePreviousOne) {
  TempDir dir;
  auto r = train(
      2, {"--max-restarts", "2"},
      workerArgs(dir.file("ckpt"), dir.file("params"), {"--steps", "12", "--save-every", "3"}),
      {"DTRAIN_IO_FAULT=crash@io=21,rank=0,attempt=0"});
  EXPECT_EQ(r.exitCode, 0) << r.all();
  EXPECT_NE(r.all().find("killed by SIGKILL"), std::string::npos) << r.all();
  EXPECT_NE(r.all().find("restored step 2"), std::string::npos) << r.all();
  expectBitwiseEqualToReference(readFile(dir.file("params")), 2, r);
}

// crash@io=23: the second save's file is complete and fsynced but not yet renamed, while training
// goes on beside the background write.
TEST(CheckpointResume, KilledDuringAnAsynchronousSaveResumesFromThePreviousOne) {
  TempDir dir;
  auto r = train(2, {"--max-restarts", "2"},
                 workerArgs(dir.file("ckpt"), dir.file("params"),
                            {"--steps", "12", "--save-every", "3", "--async"}),
                 {"DTRAIN_IO_FAULT=crash@io=23,rank=0,attempt=0"});
  EXPECT_EQ(r.exitCode, 0) << r.all();
  EXPECT_NE(r.all().find("killed by SIGKILL"), std::string::npos) << r.all();
  EXPECT_NE(r.all().find("restored step 2"), std::string::npos) << r.all();
  expectBitwiseEqualToReference(readFile(dir.file("params")), 2, r);
}

// Spot preemption: SIGTERM to launch mid-run; every rank checkpoints at one agreed step, exits 75,
// launch exits 75; the same command again resumes and ends as if nothing happened.
TEST(CheckpointResume, SigtermCheckpointsExits75AndTheRerunResumes) {
  TempDir dir;
  std::vector<std::string> args = {"--nproc-per-node", "2", "--grace-period", "20",
                                   "--max-restarts",   "2"};
  auto worker = workerArgs(dir.file("ckpt"), dir.file("params"),
                           {"--steps", "12", "--step-ms", "300"});
  args.insert(args.end(), worker.begin(), worker.end());
  LaunchProcess first(args);
  ASSERT_TRUE(first.waitForOutput("step 3 loss", 60)) << first.out() << first.err();
  first.signal(SIGTERM);
  auto stopped = first.wait(60);
  ASSERT_EQ(stopped.exitCode, 75) << stopped.all();
  EXPECT_NE(stopped.all().find("preempted"), std::string::npos) << stopped.all();
  EXPECT_EQ(countLines(stopped.out, "preempted at step"), 2) << stopped.all();
  // Both ranks stopped at the same step.
  auto at = [&](int rank) {
    std::string key = "rank " + std::to_string(rank) + " preempted at step ";
    size_t p = stopped.out.find(key);
    return p == std::string::npos ? -1 : std::stoi(stopped.out.substr(p + key.size()));
  };
  EXPECT_EQ(at(0), at(1)) << stopped.out;
  EXPECT_LT(at(0), 11) << "the run ended before the signal";
  auto again = runLaunch(args, {}, kRunSeconds);
  EXPECT_EQ(again.exitCode, 0) << again.all();
  EXPECT_NE(again.out.find("restored step " + std::to_string(at(0))), std::string::npos)
      << again.all();
  expectBitwiseEqualToReference(readFile(dir.file("params")), 2, again);
}

// Note [Checkpoint agreement] across processes: rank 0's first write call of the run takes 4 s (a
// slow disk, `write:slow:4000@1`) while the collectives time out after 2 s. Rank 1 waits for the
// writer's outcome through the job's store, not in a collective: the job finishes and ends as the
// uninterrupted run. (Rank 1 waiting in an allgather timed it out, which failed the communicator
// and the job.)
TEST(CheckpointResume, AWriteSlowerThanTheCollectiveTimeoutCompletes) {
  TempDir dir;
  auto r = train(
      2, {},
      workerArgs(dir.file("ckpt"), dir.file("params"),
                 {"--steps", "12", "--save-every", "3", "--collective-timeout-ms", "2000"}),
      {"DTRAIN_IO_FAULT=write:slow:4000@1,rank=0"});
  ASSERT_EQ(r.exitCode, 0) << r.all();
  EXPECT_EQ(readFile(dir.file("ckpt") + "/node0/LATEST"), "step-00000011\n");
  expectBitwiseEqualToReference(readFile(dir.file("params")), 2, r);
}

// Two ranks save at step 5 and stop; three ranks resume (global batch unchanged, the sampler
// re-shards the rest of the epoch): equal to the uninterrupted two-rank run up to the order of
// the reductions.
TEST(CheckpointResume, AnotherWorldSizeResumesWithinOneInAMillion) {
  TempDir dir;
  auto first = train(2, {},
                     workerArgs(dir.file("ckpt"), dir.file("params"),
                                {"--steps", "12", "--save-every", "3", "--stop-after", "5"}));
  ASSERT_EQ(first.exitCode, 0) << first.all();
  auto refused = train(3, {}, workerArgs(dir.file("ckpt"), dir.file("params"), {"--steps", "12"}));
  EXPECT_NE(refused.exitCode, 0);
  EXPECT_NE(refused.all().find("world size 2, this job has world size 3"), std::string::npos)
      << refused.all();
  auto resumed = train(
      3, {}, workerArgs(dir.file("ckpt"), dir.file("params"), {"--steps", "12", "--allow-resize"}));
  ASSERT_EQ(resumed.exitCode, 0) << resumed.all();
  EXPECT_NE(resumed.out.find("restored step 5 from world size 2"), std::string::npos)
      << resumed.all();
  std::string got = readFile(dir.file("params")), want = reference(2);
  ASSERT_EQ(got.size(), want.size());
  const auto* g = reinterpret_cast<const float*>(got.data());
  const auto* w = reinterpret_cast<const float*>(want.data());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size() / 4; ++i) {
    diff += (double(g[i]) - w[i]) * (double(g[i]) - w[i]);
    norm += double(w[i]) * w[i];
  }
  EXPECT_LE(std::sqrt(diff / norm), 1e-6) << resumed.all();
}

// The GradScaler's agreement across processes: rank 1 alone sees a NaN after the allreduce
// (DTRAIN_FAULT=nan-grad ... phase=after). Every rank skips step 3 and the ranks stay bitwise
// equal; with a scaler that does not agree (--scaler-local) only rank 1 skips and the ranks
// drift apart; a NaN before the allreduce reaches every rank either way.
TEST(GradScalerProcesses, OneRankAloneOverflowsAfterTheAllreduce) {
  TempDir dir;
  const std::string fault = "DTRAIN_FAULT=nan-grad@rank=1,step=3,phase=after";
  auto agreed = train(2, {}, workerArgs(dir.file("a"), dir.file("pa"), {"--steps", "6"}), {fault});
  EXPECT_EQ(agreed.exitCode, 0) << agreed.all();
  EXPECT_NE(agreed.out.find("rank 0 skipped step 3"), std::string::npos) << agreed.all();
  EXPECT_NE(agreed.out.find("rank 1 skipped step 3"), std::string::npos) << agreed.all();
  EXPECT_NE(agreed.out.find("rank 0 final identical across ranks (scale 32768)"), std::string::npos)
      << agreed.all();
  EXPECT_NE(agreed.err.find("poisoned"), std::string::npos) << agreed.all();

  auto local = train(2, {},
                     workerArgs(dir.file("b"), dir.file("pb"), {"--steps", "6", "--scaler-local"}),
                     {fault});
  EXPECT_EQ(local.exitCode, 0) << local.all();
  EXPECT_EQ(local.out.find("rank 0 skipped step 3"), std::string::npos) << local.all();
  EXPECT_NE(local.out.find("rank 1 skipped step 3"), std::string::npos) << local.all();
  EXPECT_NE(local.out.find("DIFFERS across ranks"), std::string::npos) << local.all();

  auto before = train(2, {},
                      workerArgs(dir.file("c"), dir.file("pc"), {"--steps", "6", "--scaler-local"}),
                      {"DTRAIN_FAULT=nan-grad:inf@rank=1,step=3"});
  EXPECT_EQ(before.exitCode, 0) << before.all();
  EXPECT_NE(before.out.find("rank 0 skipped step 3"), std::string::npos) << before.all();
  EXPECT_NE(before.out.find("rank 1 skipped step 3"), std::string::npos) << before.all();
  EXPECT_NE(before.out.find("rank 0 final identical across ranks"), std::string::npos)
      << before.all();
}

// Ranks started by hand, as two nodes of two ranks (GROUP_RANK / LOCAL_RANK as launch sets them
// on each node), rank 0 hosting the store. Node 1's directory is wiped before the rerun, as a spot
// node coming back with an empty disk: the rerun restores from node 0's copy, writes node 1 a
// copy, and ends bitwise equal to an uninterrupted run of the same two nodes.
struct RankRun {
  int exitCode = -1;
  std::string output;
  double endedMs = -1;  // when it exited, after the ranks were started (20 ms polls)
};

// One simulated node: the worker's arguments there and its extra environment ("NAME=value").
struct SimulatedNode {
  std::vector<std::string> args;
  std::vector<std::string> env;
};

std::vector<RankRun> runAsTwoNodes(const std::vector<SimulatedNode>& nodes,
                                   const std::string& logDir, const std::string& tag);

std::vector<RankRun> runAsTwoNodes(const std::vector<std::string>& args, const std::string& logDir,
                                   const std::string& tag) {
  return runAsTwoNodes({{args, {}}, {args, {}}}, logDir, tag);
}

std::vector<RankRun> runAsTwoNodes(const std::vector<SimulatedNode>& nodes,
                                   const std::string& logDir, const std::string& tag) {
  const int world = 4;
  int port = freeLoopbackPort();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    std::string log = logDir + "/" + tag + "-rank" + std::to_string(rank) + ".log";
    pid_t pid = ::fork();
    if (pid == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      for (const char* v :
           {"DTRAIN_STORE_ADDR", "DTRAIN_STORE_PORT", "DTRAIN_STORE_TOKEN", "DTRAIN_FAULT",
            "DTRAIN_IO_FAULT", "DTRAIN_RESTART_COUNT", "DTRAIN_NODE_ID"}) {
        ::unsetenv(v);
      }
      const SimulatedNode& node = nodes[static_cast<size_t>(rank / 2)];
      for (const auto& kv : node.env) {
        const size_t eq = kv.find('=');
        ::setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
      }
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(rank % 2).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", "2", 1);
      ::setenv("GROUP_RANK", std::to_string(rank / 2).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      std::vector<char*> argv;
      for (const auto& a : node.args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<RankRun> runs(world);
  const auto started = std::chrono::steady_clock::now();
  const auto deadline = started + std::chrono::seconds(90);
  // Every rank polled each round, so that each one's exit time is its own.
  for (int left = world; left > 0;) {
    for (int rank = 0; rank < world; ++rank) {
      int status = 0;
      if (runs[rank].endedMs >= 0 || ::waitpid(pids[rank], &status, WNOHANG) == 0) continue;
      runs[rank].endedMs = std::chrono::duration<double, std::milli>(
                               std::chrono::steady_clock::now() - started)
                               .count();
      runs[rank].exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      runs[rank].output = readFile(logDir + "/" + tag + "-rank" + std::to_string(rank) + ".log");
      --left;
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (pid_t p : pids) ::kill(p, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return runs;
}

TEST(CheckpointResume, ANodeWithAnEmptyDiskGetsACopyFromTheOtherNode) {
  TempDir dir;
  std::string ckpt = dir.file("ckpt");
  auto args = workerArgs(ckpt, dir.file("params"),
                         {"--steps", "12", "--save-every", "3", "--stop-after", "5"});
  auto first = runAsTwoNodes(args, dir.path(), "first");
  for (const auto& r : first) ASSERT_EQ(r.exitCode, 0) << r.output;
  ASSERT_EQ(::access((ckpt + "/node0/step-00000005").c_str(), F_OK), 0);
  ASSERT_EQ(::access((ckpt + "/node1/step-00000005").c_str(), F_OK), 0);
  ASSERT_EQ(std::system(("rm -rf " + ckpt + "/node1").c_str()), 0);
  auto rerun = runAsTwoNodes(
      workerArgs(ckpt, dir.file("params"), {"--steps", "12", "--save-every", "3"}), dir.path(),
      "rerun");
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(rerun[rank].exitCode, 0) << rerun[rank].output;
    EXPECT_NE(rerun[rank].output.find("restored step 5"), std::string::npos) << rerun[rank].output;
    bool copied = rerun[rank].output.find("copied from another node") != std::string::npos;
    EXPECT_EQ(copied, rank >= 2) << rerun[rank].output;
  }
  // Node 1 trained on from its copy and committed the later checkpoints itself (keepLast 2).
  EXPECT_EQ(readFile(ckpt + "/node1/LATEST"), "step-00000011\n");
  EXPECT_EQ(::access((ckpt + "/node1/step-00000008").c_str(), F_OK), 0);
  // The uninterrupted run in the same layout: two nodes take the hierarchical path, whose sums
  // associate differently from one node's (reference(4)), so only this one is bitwise the same.
  auto uninterrupted = runAsTwoNodes(workerArgs(dir.file("ckpt-uninterrupted"),
                                                dir.file("params-uninterrupted"),
                                                {"--steps", "12"}),
                                     dir.path(), "uninterrupted");
  for (const auto& r : uninterrupted) ASSERT_EQ(r.exitCode, 0) << r.output;
  EXPECT_EQ(readFile(dir.file("params")), readFile(dir.file("params-uninterrupted")))
      << rerun[0].output;
}

// Loads an export (argv[1]) into the worker's model with weights_only=True and compares its
// parameters with the worker's --out file (argv[2]).
constexpr const char* kLoadWithWeightsOnly =
    "import sys, torch\n"
    "sd = torch.load(sys.argv[1], weights_only=True)\n"
    "net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))\n"
    "net.load_state_dict(sd)\n"
    "flat = torch.cat([p.detach().flatten() for p in net.parameters()])\n"
    "want = torch.frombuffer(bytearray(open(sys.argv[2], 'rb').read()), dtype=torch.float32)\n"
    "print('python equal' if torch.equal(flat, want) else 'python differs')\n";

// Python's torch.load(export, weights_only=True) into the worker's model gives the parameters in
// `params` (the worker's --out file), bitwise. A DTRAIN_PYTHON without torch fails the test.
void expectPythonLoadsExport(const TempDir& dir, const std::string& exported,
                             const std::string& params) {
  const std::string missing = pythonImportError("torch");
  if (!missing.empty()) {
    ADD_FAILURE() << missing;
    return;
  }
  writeFile(dir.file("check.py"), kLoadWithWeightsOnly);
  const std::string py = dir.file("py.out");
  std::system(
      (python() + " " + dir.file("check.py") + " " + exported + " " + params + " > " + py + " 2>&1")
          .c_str());
  EXPECT_NE(readFile(py).find("python equal"), std::string::npos) << readFile(py);
}

// Sharded checkpoints (ZeRO stage 2) across real processes, two simulated nodes of two ranks:
// one rank is SIGKILLed while a save is in progress -- a node's writer (rank 2) in the middle of
// writing its file (crash@io=21: after the first save, inside the second), or a rank that writes
// nothing (rank 3) while the asynchronous save of step 5 is written but not yet agreed, so LATEST
// has not moved. The survivors fail within the checkpoint's deadline (its timeout + its grace)
// after the kill (their exit: + 1 s of teardown + kMargin); the rerun restores a step whose
// shards are all intact (step 2, or step 5 where a node's file was complete: with two nodes each
// file holds every shard) and ends bitwise as the uninterrupted run.
TEST(ShardedCheckpointProcesses, AnyRankKilledDuringASaveLeavesAStepToResumeFrom) {
  TempDir dir;
  // --checkpoint-timeout-ms and its grace, clamp(timeout / 2, 1 s, 60 s): Placement::deadline().
  constexpr double kDeadlineMs = 5000 + 2500;
  // What is measured is the survivor's exit: after its failure it tears down, and its closing
  // barrier fails once a peer's exit closes the connection and the report grace (500 ms) passes.
  constexpr double kTeardownMs = 1000;
  const std::vector<std::string> common = {
      "--zero", "2", "--checkpoint-timeout-ms", "5000", "--collective-timeout-ms", "10000"};
  auto args = [&](const std::string& ckpt, const std::string& out, std::vector<std::string> extra) {
    extra.insert(extra.end(), common.begin(), common.end());
    return workerArgs(ckpt, out, extra);
  };
  auto uninterrupted = runAsTwoNodes(
      args(dir.file("ref"), dir.file("params-ref"), {"--steps", "12"}), dir.path(), "ref");
  for (const auto& r : uninterrupted) ASSERT_EQ(r.exitCode, 0) << r.output;
  const std::string want = readFile(dir.file("params-ref"));
  struct Kill {
    std::string name, env;
    std::vector<std::string> extra;
  };
  const std::vector<Kill> kills = {
      {"writer", "DTRAIN_IO_FAULT=crash@io=21,rank=2", {}},
      {"non-writer", "DTRAIN_FAULT=signal:KILL@rank=3,step=6", {"--async"}}};
  for (const auto& kill : kills) {
    SCOPED_TRACE(kill.name);
    const std::string ckpt = dir.file("ckpt-" + kill.name);
    const std::string out = dir.file("params-" + kill.name);
    std::vector<std::string> first = {"--steps", "12", "--save-every", "3"};
    first.insert(first.end(), kill.extra.begin(), kill.extra.end());
    const SimulatedNode node{args(ckpt, out, first), {kill.env}};
    auto killed = runAsTwoNodes({node, node}, dir.path(), "killed-" + kill.name);
    const int victim = kill.name == "writer" ? 2 : 3;
    EXPECT_NE(killed[victim].exitCode, 0) << "the fault did not fire";
    for (int rank = 0; rank < 4; ++rank) {
      if (rank == victim) continue;
      const double afterKillMs = killed[rank].endedMs - killed[victim].endedMs;
      EXPECT_NE(killed[rank].exitCode, 0) << "rank " << rank << " went on\n" << killed[rank].output;
      EXPECT_LT(afterKillMs, kDeadlineMs + kTeardownMs + kMargin * 1000)
          << "rank " << rank << " failed late\n"
          << killed[rank].output;
    }
    for (int n = 0; n < 2; ++n) {
      EXPECT_EQ(readFile(fmt::format("{}/node{}/LATEST", ckpt, n)), "step-00000002\n")
          << "LATEST moved before every node held the shards";
    }
    auto rerun = runAsTwoNodes(args(ckpt, out, {"--steps", "12", "--save-every", "3"}), dir.path(),
                               "rerun-" + kill.name);
    for (int rank = 0; rank < 4; ++rank) {
      EXPECT_EQ(rerun[rank].exitCode, 0) << rerun[rank].output;
      const bool two = rerun[rank].output.find("restored step 2") != std::string::npos;
      const bool five = rerun[rank].output.find("restored step 5") != std::string::npos;
      EXPECT_TRUE(two || five) << rerun[rank].output;
    }
    EXPECT_EQ(readFile(out), want) << rerun[0].output;
  }
  // The tool on the sharded checkpoints: list and verify name the shards each file holds (two
  // nodes: each file holds every rank's); export writes the module that Python's torch.load
  // reads with weights_only=True, the parameters the run ended with.
  const std::string ckpt = dir.file("ckpt-writer");
  auto tool = [&](const std::string& a) {
    const std::string log = dir.file("tool.out");
    const int status = std::system(
        (binaryPath("checkpoint") + " " + a + " > " + log + " 2>&1").c_str());
    return std::make_pair(WEXITSTATUS(status), readFile(log));
  };
  auto [listRc, list] = tool("list " + ckpt);
  EXPECT_EQ(listRc, 0) << list;
  EXPECT_NE(list.find("step-00000011  epoch 2  world 4"), std::string::npos) << list;
  EXPECT_NE(list.find("shards of ranks 0, 1, 2, 3"), std::string::npos) << list;
  auto [verifyRc, verified] = tool("verify " + ckpt);
  EXPECT_EQ(verifyRc, 0) << verified;
  EXPECT_NE(verified.find("shards of ranks 0, 1, 2, 3, every checksum matches"), std::string::npos)
      << verified;
  auto [entriesRc, entries] = tool("list " + ckpt + "/node1/step-00000011");
  EXPECT_NE(entries.find("rank 2"), std::string::npos) << entries;
  EXPECT_NE(entries.find("optimizer/sgd/0.weight/momentum_buffer (elements "), std::string::npos)
      << entries;
  auto [exportRc, exported] = tool("export " + ckpt + " --to " + dir.file("model.pt"));
  ASSERT_EQ(exportRc, 0) << exported;
  expectPythonLoadsExport(dir, dir.file("model.pt"), dir.file("params-writer"));
}

// ZeRO stage 3 across real processes (each layer a ShardedUnit, freed between uses): rank 1 is
// SIGKILLed after the checkpoint of step 5; launch restarts both ranks, which restore it from the
// shard records and end bitwise as the uninterrupted stage-3 run. The export of the directory
// assembles the layers from the ranks' shards into what Python's torch.load reads with
// weights_only=True: the parameters the run ended with.
TEST(ShardedCheckpointProcesses, Stage3KilledAfterACheckpointResumesBitwiseAndExports) {
  TempDir dir;
  const std::vector<std::string> zero3 = {"--zero", "3", "--steps", "12"};
  auto uninterrupted = train(2, {}, workerArgs(dir.file("ref"), dir.file("params-ref"), zero3));
  ASSERT_EQ(uninterrupted.exitCode, 0) << uninterrupted.all();
  std::vector<std::string> saving = zero3;
  saving.insert(saving.end(), {"--save-every", "3"});
  const std::string ckpt = dir.file("ckpt");
  auto r = train(2, {"--max-restarts", "2"}, workerArgs(ckpt, dir.file("params"), saving),
                 {"DTRAIN_FAULT=signal:KILL@rank=1,step=7,attempt=0"});
  EXPECT_EQ(r.exitCode, 0) << r.all();
  EXPECT_NE(r.all().find("restored step 5"), std::string::npos) << r.all();
  EXPECT_NE(r.out.find("final identical across ranks"), std::string::npos) << r.all();
  const std::string params = readFile(dir.file("params"));
  ASSERT_FALSE(params.empty()) << r.all();
  EXPECT_EQ(params, readFile(dir.file("params-ref"))) << r.all();
  const std::string log = dir.file("export.out");
  const int status = std::system((binaryPath("checkpoint") + " export " + ckpt + " --to " +
                                  dir.file("model.pt") + " > " + log + " 2>&1")
                                     .c_str());
  ASSERT_EQ(WEXITSTATUS(status), 0) << readFile(log);
  expectPythonLoadsExport(dir, dir.file("model.pt"), dir.file("params"));
}

// An elastic re-rendezvous gives the nodes other group ranks: host A, GROUP_RANK 0 in the first
// run, is GROUP_RANK 1 in the second, and host B the other way round. Each host keeps its own
// disk (its own --dir here) and its stable DTRAIN_NODE_ID (7 and 3). Directories are keyed by that
// id, so each node finds its own checkpoint again: no copy over the network, no directory of a
// group rank left behind. (Keyed by GROUP_RANK, each node looked for `node<its new rank>` on a
// disk that held the other one, and the rerun started from scratch.)
TEST(CheckpointResume, NodesKeepTheirDirectoriesWhenTheirGroupRanksChange) {
  TempDir dir;
  const std::string diskA = dir.file("hostA"), diskB = dir.file("hostB");
  auto node = [&](const std::string& disk, const char* id, std::vector<std::string> extra) {
    return SimulatedNode{workerArgs(disk + "/ckpt", dir.file("params"), std::move(extra)),
                         {std::string("DTRAIN_NODE_ID=") + id}};
  };
  const std::vector<std::string> first = {"--steps", "12",           "--save-every",
                                          "3",       "--stop-after", "5"};
  auto before = runAsTwoNodes({node(diskA, "7", first), node(diskB, "3", first)}, dir.path(),
                              "first");
  for (const auto& r : before) ASSERT_EQ(r.exitCode, 0) << r.output;
  ASSERT_EQ(::access((diskA + "/ckpt/node7/step-00000005").c_str(), F_OK), 0);
  ASSERT_EQ(::access((diskB + "/ckpt/node3/step-00000005").c_str(), F_OK), 0);
  const std::vector<std::string> rest = {"--steps", "12", "--save-every", "3"};
  auto after = runAsTwoNodes({node(diskB, "3", rest), node(diskA, "7", rest)}, dir.path(), "after");
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(after[rank].exitCode, 0) << after[rank].output;
    EXPECT_NE(after[rank].output.find("restored step 5"), std::string::npos) << after[rank].output;
    EXPECT_EQ(after[rank].output.find("copied from another node"), std::string::npos)
        << after[rank].output;
    EXPECT_NE(after[rank].output.find("final identical across ranks"), std::string::npos)
        << after[rank].output;
  }
  EXPECT_EQ(readFile(diskA + "/ckpt/node7/LATEST"), "step-00000011\n");
  EXPECT_EQ(readFile(diskB + "/ckpt/node3/LATEST"), "step-00000011\n");
  for (const char* stray : {"/ckpt/node0", "/ckpt/node1"}) {
    EXPECT_NE(::access((diskA + stray).c_str(), F_OK), 0) << diskA + stray;
    EXPECT_NE(::access((diskB + stray).c_str(), F_OK), 0) << diskB + stray;
  }
}

// The `checkpoint` tool: list and verify name the damage; export writes what Python's
// torch.load reads (CheckpointTool.ExportLoadsInPythonWithWeightsOnly loads it in Python).
TEST(CheckpointTool, ListVerifyAndExportForPython) {
  TempDir dir;
  std::string ckpt = dir.file("ckpt");
  auto r = train(1, {},
                 workerArgs(ckpt, dir.file("params"), {"--steps", "4", "--save-every", "2"}));
  ASSERT_EQ(r.exitCode, 0) << r.all();
  auto tool = [&](const std::string& args) {
    std::string out = dir.file("tool.out");
    int status = std::system(
        (binaryPath("checkpoint") + " " + args + " > " + out + " 2>&1").c_str());
    return std::make_pair(WEXITSTATUS(status), readFile(out));
  };
  auto [listRc, list] = tool("list " + ckpt);
  EXPECT_EQ(listRc, 0) << list;
  EXPECT_NE(list.find("node0: 2 checkpoint(s), LATEST -> step-00000003"), std::string::npos)
      << list;
  auto [verifyRc, verified] = tool("verify " + ckpt);
  EXPECT_EQ(verifyRc, 0) << verified;
  EXPECT_EQ(countLines(verified, ": ok"), 2) << verified;
  auto [entriesRc, entries] = tool("list " + ckpt + "/node0/step-00000003");
  EXPECT_EQ(entriesRc, 0);
  EXPECT_NE(entries.find("module/model/0.weight"), std::string::npos) << entries;
  EXPECT_NE(entries.find("rank/0/rng/cpu"), std::string::npos) << entries;

  auto [exportRc, exported] = tool("export " + ckpt + " --to " + dir.file("model.pt"));
  EXPECT_EQ(exportRc, 0) << exported;
  EXPECT_NE(readFile(dir.file("model.pt")).find("_rebuild_tensor_v2"), std::string::npos);

  // Damage: one flipped byte in the newest file; verify names the entry and fails.
  std::string newest = ckpt + "/node0/step-00000003";
  {
    std::fstream f(newest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    char c = 0;
    f.read(&c, 1);
    f.seekp(200);
    f.put(static_cast<char>(c ^ 1));
  }
  auto [badRc, bad] = tool("verify " + ckpt);
  EXPECT_EQ(badRc, 1) << bad;
  EXPECT_NE(bad.find("step-00000003: DAMAGED"), std::string::npos) << bad;
  EXPECT_NE(bad.find("module/model/0.weight"), std::string::npos) << bad;
  auto [usageRc, usage] = tool("export " + ckpt);
  EXPECT_EQ(usageRc, 2) << usage;
}

// What `checkpoint export` writes loads with torch.load(path, weights_only=True), PyTorch 2.6's
// default (Note [Exported pickles]), into the model the worker trained, bitwise: with the torch
// of DTRAIN_PYTHON (the project's .venv: PyTorch 2.14).
TEST(CheckpointTool, ExportLoadsInPythonWithWeightsOnly) {
  TempDir dir;
  std::string ckpt = dir.file("ckpt");
  auto r = train(1, {},
                 workerArgs(ckpt, dir.file("params"), {"--steps", "4", "--save-every", "2"}));
  ASSERT_EQ(r.exitCode, 0) << r.all();
  const std::string out = dir.file("export.out");
  ASSERT_EQ(std::system((binaryPath("checkpoint") + " export " + ckpt + " --to " +
                         dir.file("model.pt") + " > " + out + " 2>&1")
                            .c_str()),
            0)
      << readFile(out);
  expectPythonLoadsExport(dir, dir.file("model.pt"), dir.file("params"));
}

}  // namespace
}  // namespace dtrain::testing::checkpoint_processes_test
