// `launch` as a user meets it before any worker runs: usage errors (docs/reliability.md U1-U4),
// --dry-run, options from the environment, torchrun spellings, .py programs, and the worker
// environment including the job token (S18). Quick and independent: run in parallel.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <regex>

#include <gtest/gtest.h>

#include "launcher_support.h"
#include "test_support.h"

namespace dtrain::testing::launcher_cli_test {
namespace {

// A program that leaves a mark if it ever runs: "nothing was started" is checked, not assumed.
struct Marker {
  TempDir dir;
  std::string path = dir.file("started");
  std::vector<std::string> program() const { return {"/bin/sh", "-c", "touch " + path}; }
  bool started() const { return ::access(path.c_str(), F_OK) == 0; }
};

struct UsageCase {
  const char* name;
  std::vector<std::string> options;
  std::vector<std::string> env;
  const char* mentions;  // the flag (or variable) the message must name
};

class UsageErrorTest : public ::testing::TestWithParam<UsageCase> {};

TEST_P(UsageErrorTest, ExitsTwoNamingTheFlagAndStartsNothing) {
  const UsageCase& c = GetParam();
  Marker marker;
  std::vector<std::string> args = c.options;
  for (const auto& a : marker.program()) args.push_back(a);
  LaunchResult r = runLaunch(args, c.env, 10);
  EXPECT_EQ(r.exitCode, 2) << r.all();
  EXPECT_LT(r.seconds, 5);
  EXPECT_NE(r.err.find(c.mentions), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("nothing was started"), std::string::npos) << r.err;
  EXPECT_EQ(countLines(r.err, "launch:"), 1) << "one line: " << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_FALSE(marker.started());
}

INSTANTIATE_TEST_SUITE_P(
    UsageErrors, UsageErrorTest,
    ::testing::Values(
        UsageCase{"ZeroWorkers", {"--nproc-per-node", "0"}, {}, "--nproc-per-node"},
        UsageCase{"NotACount", {"--nproc_per_node=lots"}, {}, "--nproc-per-node"},
        UsageCase{"MinAboveMaxNodes", {"--nnodes", "3:2"}, {}, "--nnodes"},
        UsageCase{"MultiNodeWithoutNodeRank", {"--nnodes", "2"}, {}, "--node-rank R on every node"},
        UsageCase{"NodeRankOnOneNode", {"--node-rank", "1"}, {}, "--node-rank"},
        UsageCase{"ZeroGrace", {"--grace-period", "0"}, {}, "--grace-period"},
        UsageCase{"NegativeGrace", {"--grace-period", "-1"}, {}, "--grace-period"},
        UsageCase{"NegativeExitBarrier",
                  {"--exit-barrier-timeout", "-1"},
                  {},
                  "--exit-barrier-timeout"},
        UsageCase{"ExitBarrierNotANumber",
                  {"--exit_barrier_timeout=soon"},
                  {},
                  "--exit-barrier-timeout"},
        UsageCase{"BadEnvExitBarrier",
                  {},
                  {"DTRAIN_LAUNCH_EXIT_BARRIER_TIMEOUT=-5"},
                  "DTRAIN_LAUNCH_EXIT_BARRIER_TIMEOUT"},
        UsageCase{"ZeroKillTimeout", {"--kill-timeout", "0"}, {}, "--kill-timeout"},
        UsageCase{"ZeroMonitorInterval", {"--monitor_interval", "0"}, {}, "--monitor-interval"},
        UsageCase{"NegativeRestarts", {"--max-restarts", "-1"}, {}, "--max-restarts"},
        UsageCase{"BadOnNodeLoss",
                  {"--on-node-loss", "maybe"},
                  {},
                  "--on-node-loss \"maybe\": use restart"},
        UsageCase{"BadEnvOnNodeLoss",
                  {},
                  {"DTRAIN_LAUNCH_ON_NODE_LOSS=keep"},
                  "DTRAIN_LAUNCH_ON_NODE_LOSS (environment) \"keep\""},
        UsageCase{"BadOnNodeJoin",
                  {"--on-node-join", "soon"},
                  {},
                  "--on-node-join \"soon\": use restart"},
        UsageCase{"LiveJoinWithoutContinue",
                  {"--on-node-join", "live"},
                  {},
                  "--on-node-join live needs --on-node-loss continue"},
        UsageCase{"BadEnvOnNodeJoin",
                  {"--on-node-loss", "continue"},
                  {"DTRAIN_LAUNCH_ON_NODE_JOIN=now"},
                  "DTRAIN_LAUNCH_ON_NODE_JOIN (environment) \"now\""},
        UsageCase{"NegativeMaxReforms", {"--max-reforms", "-1"}, {}, "--max-reforms"},
        UsageCase{"ZeroReformWindow", {"--reform-window", "0"}, {}, "--reform-window"},
        UsageCase{"PortOutOfRange", {"--master-port", "70000"}, {}, "--master-port"},
        UsageCase{"EndpointPortOutOfRange",
                  {"--rdzv-endpoint", "127.0.0.1:99999"},
                  {},
                  "--rdzv-endpoint"},
        UsageCase{"SamePortTwice",
                  {"--rdzv-endpoint", "127.0.0.1:29555", "--master-port", "29555"},
                  {},
                  "share a port"},
        UsageCase{"UnknownBackend", {"--rdzv-backend", "etcd"}, {}, "--rdzv-backend"},
        UsageCase{"UnknownOption", {"--nprocs", "2"}, {}, "--nprocs"},
        UsageCase{"BadRedirects", {"--redirects", "0:9"}, {}, "--redirects"},
        UsageCase{"BadTee", {"--tee", "x"}, {}, "--tee"},
        UsageCase{"BadRanksFilter", {"--local-ranks-filter", "0,a"}, {}, "--local-ranks-filter"},
        UsageCase{"FilterBeyondWorkers",
                  {"--nproc-per-node", "2", "--local-ranks-filter", "5"},
                  {},
                  "local rank 5"},
        UsageCase{"UnknownPlaceholder",
                  {"--log-line-prefix-template", "${bogus}:"},
                  {},
                  "--log-line-prefix-template"},
        UsageCase{"ReservedEnv", {"--env", "RANK=3"}, {}, "RANK"},
        UsageCase{"EnvWithoutValue", {"--env", "NOVALUE"}, {}, "--env"},
        UsageCase{"BadRunId", {"--run-id", "../escape"}, {}, "--run-id"},
        UsageCase{"ModuleAndNoPython", {"--module", "--no-python"}, {}, "--no-python"},
        UsageCase{"LogDirIsAFile", {"--log-dir", "/etc/hostname"}, {}, "not a directory"},
        UsageCase{"LogDirUnwritable", {"--log-dir", "/proc/self/logs"}, {}, "--log-dir"},
        UsageCase{"BadEnvOption",
                  {},
                  {"DTRAIN_LAUNCH_NPROC_PER_NODE=0"},
                  "DTRAIN_LAUNCH_NPROC_PER_NODE"},
        UsageCase{"UnknownEnvOption", {}, {"DTRAIN_LAUNCH_NPROCS=2"}, "DTRAIN_LAUNCH_NPROCS"}),
    [](const ::testing::TestParamInfo<UsageCase>& info) { return info.param.name; });

TEST(LaunchCli, NoProgramIsAUsageError) {
  LaunchResult r = runLaunch({"--nproc-per-node", "2"});
  EXPECT_EQ(r.exitCode, 2);
  EXPECT_NE(r.err.find("no program given"), std::string::npos) << r.err;
}

TEST(LaunchCli, MissingOptionValueIsAUsageError) {
  LaunchResult r = runLaunch({"--max-restarts"});
  EXPECT_EQ(r.exitCode, 2);
  EXPECT_NE(r.err.find("--max-restarts needs a value"), std::string::npos) << r.err;
}

TEST(LaunchCli, HelpAndVersionExitZero) {
  LaunchResult help = runLaunch({"--help"});
  EXPECT_EQ(help.exitCode, 0);
  EXPECT_NE(help.out.find("--nproc-per-node"), std::string::npos);
  EXPECT_NE(help.out.find("Exit codes"), std::string::npos);
  EXPECT_NE(help.out.find("--exit-barrier-timeout SECONDS"), std::string::npos) << help.out;
  LaunchResult version = runLaunch({"--version"});
  EXPECT_EQ(version.exitCode, 0);
  EXPECT_NE(version.out.find("launch (dtrain)"), std::string::npos);
}

// A value near the kernel's limit for one argument (128 KiB) reaches the worker byte for byte.
// launch used to die of SIGSEGV on such values (its option library's std::regex recursed once
// per character).
TEST(LaunchCli, HundredKilobyteEnvValueReachesTheWorkerIntact) {
  TempDir dir;
  std::string value(100 * 1000, '-');
  for (size_t i = 0; i < value.size(); ++i) value[i] = static_cast<char>('!' + (i * 7919) % 90);
  writeFile(dir.file("expected"), value);
  LaunchResult r = runLaunch({"--nproc-per-node", "2", "--env", "CONFIG=" + value, "/bin/sh", "-c",
                              "printf %s \"$CONFIG\" | cmp - \"$0\" && echo intact ${#CONFIG}",
                              dir.file("expected")});
  EXPECT_EQ(r.exitCode, 0) << r.all().substr(0, 2000);
  EXPECT_EQ(countLines(r.out, "intact 100000"), 2) << r.all().substr(0, 2000);
}

// Every option that takes a value (read from --help, so options added later are covered), given
// the longest value one argument can carry: launch runs or refuses it in one short line, and never
// dies of a signal.
TEST(LaunchCli, LongestValuesNeverKillLaunch) {
  const std::string help = runLaunch({"--help"}).out;
  std::vector<std::string> options;
  std::smatch m;
  std::regex optionLine("\n  (?:-., |    )--([a-z-]+) [A-Z]");
  for (auto it = help.cbegin(); std::regex_search(it, help.cend(), m, optionLine);
       it = m[0].second) {
    options.push_back(m[1].str());
  }
  ASSERT_GE(options.size(), 20u) << help;
  constexpr size_t kArgMax = 128 * 1024;  // including the terminating NUL
  for (const auto& name : options) {
    std::string arg = "--" + name + "=";
    arg += std::string(kArgMax - 1 - arg.size(), '7');
    LaunchResult r = runLaunch({arg, "/bin/true"}, {}, 20);
    EXPECT_LT(r.exitCode, 128) << name << ": " << r.all().substr(0, 600);
    EXPECT_FALSE(r.timedOut) << name;
    EXPECT_LT(r.err.size(), 800u) << name << ": " << r.err.substr(0, 1200);
  }
  for (const std::string& program :
       {"/" + std::string(kArgMax - 2, 'p'), std::string(kArgMax - 1, 'p'),
        std::string(kArgMax - 4, 'p') + ".py"}) {
    LaunchResult r = runLaunch({program}, {}, 20);
    EXPECT_EQ(r.exitCode, 127) << r.all().substr(0, 600);
    EXPECT_LT(r.err.size(), 800u) << r.err.substr(0, 1200);
  }
}

// A manual node's dry run says what a node coming late meets: the round restarted (default) or
// taken in live (Note [Joining a running round]).
TEST(LaunchCli, DryRunSaysWhatANodeJoiningBelowTheMaximumMeets) {
  const std::vector<std::string> manual{
      "--nnodes",       "2:3",     "--node-rank", "0", "--rdzv-endpoint", "127.0.0.1:29555",
      "--on-node-loss", "continue"};
  std::vector<std::string> args = manual;
  args.insert(args.end(), {"--dry-run", workerPath()});
  LaunchResult r = runLaunch(args);
  EXPECT_EQ(r.exitCode, 0) << r.all();
  EXPECT_NE(r.all().find("On a node joining below the maximum: --on-node-join restart (the round "
                         "stops, every node restarts from the checkpoint)"),
            std::string::npos)
      << r.all();
  args = manual;
  args.insert(args.end(), {"--on-node-join", "live", "--dry-run", workerPath()});
  r = runLaunch(args);
  EXPECT_EQ(r.exitCode, 0) << r.all();
  EXPECT_NE(r.all().find("--on-node-join live (taken into the running round in the next "
                         "membership epoch)"),
            std::string::npos)
      << r.all();
}

// U3: a missing or unexecutable program is refused by name and host, before anything starts.
TEST(LaunchCli, MissingProgramExits127NamingPathAndHost) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  for (const std::string& program :
       {std::string("/nonexistent/train"), std::string("no-such-trainer-xyz")}) {
    LaunchResult r = runLaunch({"--nproc-per-node", "2", program});
    EXPECT_EQ(r.exitCode, 127) << r.err;
    EXPECT_NE(r.err.find(program), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(host), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("nothing was started"), std::string::npos) << r.err;
  }
}

TEST(LaunchCli, UnexecutableProgramExits126) {
  TempDir dir;
  writeFile(dir.file("train"), "#!/bin/sh\necho hi\n");
  ::chmod(dir.file("train").c_str(), 0644);
  LaunchResult r = runLaunch({dir.file("train")});
  EXPECT_EQ(r.exitCode, 126) << r.err;
  EXPECT_NE(r.err.find("not executable"), std::string::npos) << r.err;
  LaunchResult d = runLaunch({dir.path()});
  EXPECT_EQ(d.exitCode, 126) << d.err;
  EXPECT_NE(d.err.find("is a directory"), std::string::npos) << d.err;
}

TEST(LaunchCli, MissingScriptOrInterpreterExits127) {
  TempDir dir;
  LaunchResult noScript = runLaunch({"--python", "/bin/sh", dir.file("missing.py")});
  EXPECT_EQ(noScript.exitCode, 127) << noScript.err;
  EXPECT_NE(noScript.err.find("missing.py"), std::string::npos) << noScript.err;
  writeFile(dir.file("train.py"), "echo hi\n");
  LaunchResult noPython = runLaunch({"--python", "/nonexistent/python9", dir.file("train.py")});
  EXPECT_EQ(noPython.exitCode, 127) << noPython.err;
  EXPECT_NE(noPython.err.find("--python"), std::string::npos) << noPython.err;
}

// A .py program runs under --python; --no-python executes it directly.
TEST(LaunchCli, PythonProgramsRunUnderTheInterpreter) {
  TempDir dir;
  writeFile(dir.file("train.py"), "echo \"interpreted rank=$RANK args=$*\"\n");
  LaunchResult r = runLaunch(
      {"--nproc-per-node", "2", "--python", "/bin/sh", dir.file("train.py"), "--lr", "0.1"});
  EXPECT_EQ(r.exitCode, 0) << r.all();
  EXPECT_NE(r.out.find("[rank 0]: interpreted rank=0 args=--lr 0.1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank 1]: interpreted rank=1 args=--lr 0.1"), std::string::npos) << r.out;

  writeFile(dir.file("direct.py"), "#!/bin/sh\necho direct\n");
  ::chmod(dir.file("direct.py").c_str(), 0755);
  LaunchResult direct = runLaunch(
      {"--no_python", "--python", "/nonexistent", dir.file("direct.py")});
  EXPECT_EQ(direct.exitCode, 0) << direct.all();
  EXPECT_NE(direct.out.find("[rank 0]: direct"), std::string::npos) << direct.out;
}

// --dry-run: every worker's command and environment, the token redacted, nothing started.
TEST(LaunchCli, DryRunPrintsEachWorkerAndStartsNothing) {
  Marker marker;
  std::vector<std::string> args = {"--dry-run", "--nproc-per-node", "3", "--run-id", "dry",
                                   "--env",     "NCCL_DEBUG=INFO"};
  for (const auto& a : marker.program()) args.push_back(a);
  LaunchResult r = runLaunch(args);
  EXPECT_EQ(r.exitCode, 0) << r.all();
  EXPECT_FALSE(marker.started());
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_NE(r.out.find("rank " + std::to_string(rank) + " (local rank " + std::to_string(rank)),
              std::string::npos);
  }
  EXPECT_EQ(countLines(r.out, "DTRAIN_STORE_TOKEN=<redacted>"), 3) << r.out;
  EXPECT_EQ(countLines(r.out, "    WORLD_SIZE=3"), 3);
  EXPECT_EQ(countLines(r.out, "NCCL_DEBUG=INFO"), 3);
  EXPECT_EQ(countLines(r.out, "TORCHELASTIC_RUN_ID=dry"), 3);
  EXPECT_NE(r.out.find("command: /bin/sh -c 'touch "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Supervision: --max-restarts 0 --grace-period 30 --exit-barrier-timeout "
                       "300 --kill-timeout 60\n"),
            std::string::npos)
      << r.out;
  LaunchResult unbounded = runLaunch({"--dry-run", "/bin/true"},
                                     {"DTRAIN_LAUNCH_EXIT_BARRIER_TIMEOUT=0"});
  EXPECT_NE(unbounded.out.find("--exit-barrier-timeout 0 (no limit) --kill-timeout"),
            std::string::npos)
      << unbounded.out;
}

// DTRAIN_LAUNCH_<OPTION> sets an option; the command line wins over it.
TEST(LaunchCli, OptionsFromTheEnvironment) {
  LaunchResult fromEnv = runLaunch({"/bin/sh", "-c", "echo rank=$RANK of $WORLD_SIZE"},
                                   {"DTRAIN_LAUNCH_NPROC_PER_NODE=3"});
  EXPECT_EQ(fromEnv.exitCode, 0) << fromEnv.all();
  EXPECT_EQ(countLines(fromEnv.out, "of 3"), 3) << fromEnv.out;
  LaunchResult cmdWins = runLaunch(
      {"--nproc-per-node", "1", "/bin/sh", "-c", "echo of $WORLD_SIZE"},
      {"DTRAIN_LAUNCH_NPROC_PER_NODE=3"});
  EXPECT_EQ(countLines(cmdWins.out, "of 1"), 1) << cmdWins.out;
  EXPECT_EQ(countLines(cmdWins.out, "of 3"), 0) << cmdWins.out;
}

// torchrun's spellings start the same job.
TEST(LaunchCli, AcceptsTorchrunSpellings) {
  LaunchResult r = runLaunch({"--standalone", "--nnodes=1", "--nproc_per_node=2", "--rdzv_id=tr",
                              "--rdzv_backend", "c10d", "--max_restarts=0",
                              "--monitor_interval=0.1", "--start_method", "spawn", "--node_rank",
                              "0", "/bin/sh", "-c", "echo run=$TORCHELASTIC_RUN_ID rank=$RANK"});
  EXPECT_EQ(r.exitCode, 0) << r.all();
  EXPECT_NE(r.out.find("run=tr rank=0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("run=tr rank=1"), std::string::npos) << r.out;
}

// Everything after the program belongs to the program, launcher-looking flags included.
TEST(LaunchCli, ArgumentsAfterTheProgramAreTheProgramsOwn) {
  LaunchResult r = runLaunch({"--", "/bin/echo", "--nproc-per-node", "7", "--", "x y"});
  EXPECT_EQ(r.exitCode, 0) << r.all();
  EXPECT_NE(r.out.find("[rank 0]: --nproc-per-node 7 -- x y"), std::string::npos) << r.out;
}

// The contract variables, OMP_NUM_THREADS = CPUs / workers when unset, and the user's value kept.
TEST(LaunchCli, WorkerEnvironment) {
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  LaunchResult r = runLaunch({"--nproc-per-node", "2", "--run-id", "envtest", workerPath(),
                              "--no-store", "--steps", "0", "--print-env"});
  ASSERT_EQ(r.exitCode, 0) << r.all();
  EXPECT_NE(r.out.find("rank 1: env WORLD_SIZE=2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1: env LOCAL_RANK=1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 0: env MASTER_ADDR=127.0.0.1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 0: env TORCHELASTIC_RUN_ID=envtest"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 0: env DTRAIN_STORE_TOKEN is set"), std::string::npos) << r.out;
  std::string omp = "env OMP_NUM_THREADS=" + std::to_string(std::max(1L, cpus / 2));
  EXPECT_EQ(countLines(r.out, omp), 2) << r.out;
  EXPECT_EQ(countLines(r.out, "attempt=0 torchelastic_restart_count=0"), 2) << r.out;

  LaunchResult user = runLaunch(
      {"--nproc-per-node", "2", workerPath(), "--no-store", "--steps", "0", "--print-env"},
      {"OMP_NUM_THREADS=7"});
  EXPECT_EQ(countLines(user.out, "env OMP_NUM_THREADS=7"), 2) << user.out;
}

// S18: the job token is in the workers' environment only -- never in any process's argv, never in
// launch's output.
TEST(LaunchCli, TokenNeverInArgvOrOutput) {
  LaunchProcess p(
      {"--nproc-per-node", "2", workerPath(), "--no-store", "--steps", "100", "--step-ms", "20"});
  ASSERT_TRUE(p.waitFor(
      [](const std::string& o, const std::string&) { return countLines(o, "worker rank=") == 2; },
      10))
      << p.out() << p.err();
  std::vector<pid_t> pids = jobPids(p.out());
  ASSERT_FALSE(pids.empty());
  std::string environ = readFile("/proc/" + std::to_string(pids[0]) + "/environ");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(environ, m, std::regex("DTRAIN_STORE_TOKEN=([0-9a-f]{64})")))
      << "the worker has no 64-hex-digit token";
  const std::string token = m[1].str();
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    std::string cmdline = readFile(entry.path().string() + "/cmdline");
    EXPECT_EQ(cmdline.find(token), std::string::npos) << "token in argv of " << entry.path();
  }
  LaunchResult r = p.wait(20);
  EXPECT_EQ(r.exitCode, 0) << r.all();
  EXPECT_EQ(r.all().find(token), std::string::npos);
}

}  // namespace
}  // namespace dtrain::testing::launcher_cli_test
