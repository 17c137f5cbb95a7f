// Root cause, exit codes, error files, OOM evidence and the report text: pure functions, tables.
#include <signal.h>

#include <gtest/gtest.h>

#include "launcher/supervisor/failure_report.h"
#include "launcher/supervisor/oom.h"

namespace dtrain::launcher::launcher_report_test {
namespace {

using State = WorkerOutcome::State;

WorkerOutcome exited(int rank, int code, double at, bool stoppedByLaunch = false) {
  WorkerOutcome w;
  w.rank = w.localRank = rank;
  w.pid = 1000 + rank;
  w.state = State::Exited;
  w.exitCode = code;
  w.endSeconds = at;
  w.stoppedByLaunch = stoppedByLaunch;
  return w;
}

WorkerOutcome signaled(int rank, int sig, double at, bool stoppedByLaunch = false) {
  WorkerOutcome w = exited(rank, 0, at, stoppedByLaunch);
  w.state = State::Signaled;
  w.signal = sig;
  return w;
}

TEST(RootCause, EarliestFailureLaunchDidNotCause) {
  EXPECT_EQ(rootCauseIndex({exited(0, 0, 1), exited(1, 0, 2)}), -1);
  EXPECT_EQ(rootCauseIndex({exited(0, 3, 2.0), signaled(1, SIGKILL, 1.0)}), 1);
  EXPECT_EQ(rootCauseIndex({signaled(0, SIGTERM, 0.5, true), exited(1, 7, 1.0)}), 1)
      << "a worker launch stopped is not the root cause, even if it ended first";
  EXPECT_EQ(rootCauseIndex({exited(0, 0, 0.1), exited(1, 4, 1.0)}), 1) << "exit 0 is no failure";
}

struct ExitCodeCase {
  const char* name;
  std::vector<WorkerOutcome> workers;
  int launcherSignal;
  bool signalFirst;
  int code;
};

class LauncherExitCodeTest : public ::testing::TestWithParam<ExitCodeCase> {};

TEST_P(LauncherExitCodeTest, FollowsDesignTable) {
  AttemptResult a;
  a.workers = GetParam().workers;
  a.launcherSignal = GetParam().launcherSignal;
  a.signalBeforeFailure = GetParam().signalFirst;
  EXPECT_EQ(launcherExitCode(a), GetParam().code);
}

WorkerOutcome execFailed(int err) {
  WorkerOutcome w = exited(0, 127, 0.1);
  w.state = State::ExecFailed;
  w.execErrno = err;
  return w;
}

WorkerOutcome lost() {
  WorkerOutcome w = exited(0, 0, 0.1);
  w.state = State::Lost;
  return w;
}

INSTANTIATE_TEST_SUITE_P(
    Table, LauncherExitCodeTest,
    ::testing::Values(
        ExitCodeCase{"AllZero", {exited(0, 0, 1), exited(1, 0, 1)}, 0, false, 0},
        ExitCodeCase{"WorkerCode", {exited(0, 0, 1), exited(1, 3, 1)}, 0, false, 3},
        ExitCodeCase{"WorkerCodeTwo", {exited(0, 2, 1)}, 0, false, 2},
        ExitCodeCase{"HighCodePassedThrough", {exited(0, 138, 1)}, 0, false, 138},
        ExitCodeCase{"Signal",
                     {signaled(0, SIGSEGV, 1), signaled(1, SIGTERM, 2, true)},
                     0,
                     false,
                     139},
        ExitCodeCase{"EarliestWins", {exited(0, 5, 2), exited(1, 6, 1)}, 0, false, 6},
        ExitCodeCase{"ExecNotFound", {execFailed(ENOENT)}, 0, false, 127},
        ExitCodeCase{"ExecDenied", {execFailed(EACCES)}, 0, false, 126},
        ExitCodeCase{"Lost", {lost()}, 0, false, 125},
        ExitCodeCase{"LauncherSignal", {signaled(0, SIGTERM, 1, true)}, SIGINT, true, 130},
        ExitCodeCase{"Preempted",
                     {exited(0, 75, 1, true), exited(1, 75, 1, true)},
                     SIGTERM,
                     true,
                     75},
        ExitCodeCase{"PartlyPreempted",
                     {exited(0, 75, 1, true), signaled(1, SIGKILL, 2, true)},
                     SIGTERM,
                     true,
                     143},
        ExitCodeCase{"SeventyFiveNeedsSigterm", {exited(0, 75, 1, true)}, SIGHUP, true, 129},
        ExitCodeCase{"FailureBeforeSignal",
                     {exited(0, 4, 1), signaled(1, SIGTERM, 2, true)},
                     SIGINT,
                     false,
                     4}),
    [](const ::testing::TestParamInfo<ExitCodeCase>& info) { return info.param.name; });

TEST(DescribeOutcome, Words) {
  EXPECT_EQ(describeOutcome(exited(0, 3, 0)), "exited with code 3");
  EXPECT_EQ(describeOutcome(signaled(0, SIGSEGV, 0)), "was killed by SIGSEGV (signal 11)");
  WorkerOutcome oom = signaled(0, SIGKILL, 0);
  oom.oomNote = "likely killed by the OOM killer";
  EXPECT_EQ(describeOutcome(oom),
            "was killed by SIGKILL (signal 9) -- likely killed by the OOM killer");
  EXPECT_EQ(describeOutcome(execFailed(ENOENT)),
            "could not be executed: No such file or directory");
}

struct ErrorFileCase {
  const char* name;
  std::string content;
  int64_t fileSize;  // -1: content.size()
  const char* says;
};

class ErrorFileSummaryTest : public ::testing::TestWithParam<ErrorFileCase> {};

TEST_P(ErrorFileSummaryTest, NeverThrows) {
  const ErrorFileCase& c = GetParam();
  std::string s = summarizeErrorFile(
      c.content, c.fileSize < 0 ? static_cast<int64_t>(c.content.size()) : c.fileSize);
  EXPECT_NE(s.find(c.says), std::string::npos) << s;
  EXPECT_LT(s.size(), 5000u);
}

INSTANTIATE_TEST_SUITE_P(
    Table, ErrorFileSummaryTest,
    ::testing::Values(
        ErrorFileCase{"Torchrun",
                      R"({"message": {"message": "RuntimeError: boom", "extraInfo": )"
                      R"({"py_callstack": "Traceback: x", "timestamp": "1"}}})",
                      -1, "RuntimeError: boom\nTraceback: x"},
        ErrorFileCase{"PlainMessage", R"({"message": "plain"})", -1, "plain"},
        ErrorFileCase{"NoMessage", R"({"other": 1})", -1, "no \"message\" string"},
        ErrorFileCase{"Array", "[1,2]", -1, "no \"message\" string"},
        ErrorFileCase{"Garbage", std::string("\x01\x02{oops", 7), -1, "not valid JSON"},
        ErrorFileCase{"GarbageEscaped", std::string("\x01\x02{oops", 7), -1, "\\x01\\x02{oops"},
        ErrorFileCase{"Empty", "", -1, "the error file is empty"},
        ErrorFileCase{"Whitespace", " \n", -1, "the error file is empty"},
        ErrorFileCase{"Truncated", R"({"message": {"message": "xxxx)", 9000000, "is 9000000 bytes"},
        ErrorFileCase{"HugeMessageCut", "{\"message\": \"" + std::string(100000, 'y') + "\"}", -1,
                      "yyy..."}),
    [](const ::testing::TestParamInfo<ErrorFileCase>& info) { return info.param.name; });

TEST(ReadErrorFile, MissingIsEmpty) {
  EXPECT_EQ(readErrorFile(""), "");
  EXPECT_EQ(readErrorFile("/nonexistent/error.json"), "");
  EXPECT_NE(readErrorFile("/").find("not a regular file"), std::string::npos);
}

TEST(Oom, KernelLogLines) {
  const std::string log =
      "some line\n"
      "Out of memory: Killed process 12345 (python3) total-vm:1kB, anon-rss:1kB\n"
      "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),task=train,pid=777,uid=0\n";
  EXPECT_NE(findOomKillLine(log, 12345).find("Killed process 12345"), std::string::npos);
  EXPECT_NE(findOomKillLine(log, 777).find("pid=777,"), std::string::npos);
  EXPECT_EQ(findOomKillLine(log, 1234), "") << "a prefix of another pid is not a match";
  EXPECT_EQ(findOomKillLine(log, 77), "");
  EXPECT_EQ(findOomKillLine("", 1), "");
}

TEST(Oom, CgroupCounter) {
  EXPECT_EQ(parseOomKillCount("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n"), 2);
  EXPECT_EQ(parseOomKillCount("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n"), 5);
  EXPECT_EQ(parseOomKillCount("nothing here"), -1);
  EXPECT_EQ(oomCounterPath("0::/user.slice/x\n", "/sys/fs/cgroup"),
            "/sys/fs/cgroup/user.slice/x/memory.events");
  EXPECT_EQ(oomCounterPath("5:cpu:/\n4:memory:/job/a\n0::/\n", "/sys/fs/cgroup"),
            "/sys/fs/cgroup/memory/job/a/memory.oom_control");
  EXPECT_EQ(oomCounterPath("0::/\n", "/r"), "/r/memory.events");
  EXPECT_EQ(oomCounterPath("", "/r"), "");
}

TEST(Oom, NoteSaysHowSure) {
  EXPECT_NE(oomNote(5, "Out of memory: Killed process 5 (x)\n", -1, -1).find("likely"),
            std::string::npos);
  EXPECT_NE(oomNote(5, "", 1, 2).find("possibly"), std::string::npos);
  EXPECT_EQ(oomNote(5, "", 2, 2), "") << "no evidence, no claim";
  EXPECT_EQ(oomNote(5, "", -1, -1), "");
}

TEST(FailureReport, RootCauseFirstThenTheOthers) {
  AttemptResult a;
  WorkerOutcome root = signaled(3, SIGSEGV, 0.42);
  root.stderrLog = "/logs/j/attempt_0/rank_3/stderr.log";
  root.stderrTail = {"line 1", "Segmentation fault in step 17"};
  root.errorFileMessage = "RuntimeError: bad";
  WorkerOutcome hung = signaled(1, SIGKILL, 2.5, true);
  hung.wasStopped = true;
  a.workers = {signaled(0, SIGTERM, 0.5, true), hung, exited(2, 0, 0.2), root};
  ReportContext ctx;
  ctx.host = "node7";
  ctx.runId = "j";
  std::string r = formatFailureReport(ctx, {a});
  EXPECT_EQ(r.find("launch: job failed: rank 3 was killed by SIGSEGV"), 0u) << r;
  EXPECT_NE(r.find("exit code 139"), std::string::npos);
  EXPECT_NE(r.find("host:        node7"), std::string::npos);
  EXPECT_NE(r.find("pid:         1003"), std::string::npos);
  EXPECT_NE(r.find("RuntimeError: bad"), std::string::npos);
  EXPECT_NE(r.find("stderr log:  /logs/j/attempt_0/rank_3/stderr.log"), std::string::npos);
  EXPECT_NE(r.find("| Segmentation fault in step 17"), std::string::npos);
  EXPECT_LT(r.find("rank 3"), r.find("rank 0 (local rank 0"));
  EXPECT_NE(r.find("a hung rank?"), std::string::npos) << "the stopped worker is pointed out";
}

TEST(FailureReport, RestartsListEarlierAttempts) {
  AttemptResult a0;
  a0.attempt = 0;
  a0.workers = {exited(0, 3, 1), exited(1, 0, 1)};
  AttemptResult a1 = a0;
  a1.attempt = 1;
  a1.workers = {signaled(0, SIGABRT, 1), exited(1, 0, 1)};
  ReportContext ctx;
  ctx.maxRestarts = 1;
  std::string r = formatFailureReport(ctx, {a0, a1});
  EXPECT_NE(r.find("attempts: 2 (1 restart of at most 1)"), std::string::npos) << r;
  EXPECT_NE(r.find("attempt 0: rank 0 exited with code 3"), std::string::npos) << r;
  EXPECT_NE(formatRestartLine(a0, 1, 1).find("attempt 0 failed: rank 0 (pid 1000) exited with "
                                             "code 3; restarting all workers (restart 1 of 1)"),
            std::string::npos);
}

TEST(FailureReport, LauncherSignal) {
  AttemptResult a;
  a.workers = {signaled(0, SIGTERM, 1, true)};
  a.launcherSignal = SIGINT;
  a.signalBeforeFailure = true;
  ReportContext ctx;
  ctx.gracePeriod = 30;
  std::string r = formatFailureReport(ctx, {a});
  EXPECT_EQ(r.find("launch: stopped: received SIGINT"), 0u) << r;
  EXPECT_NE(r.find("exit code 130: launch itself received SIGINT"), std::string::npos) << r;
}

// Note [Exit barrier]: rank 0 exited 0, rank 1 was still running when the deadline passed and
// launch stopped it.
AttemptResult barrierTimedOut() {
  AttemptResult a;
  WorkerOutcome straggler = signaled(1, SIGTERM, 2.3, true);
  straggler.stderrTail = {"rank 1: writing the last shard"};
  a.workers = {exited(0, 0, 0.3), straggler, exited(2, 0, 0.4)};
  a.exitBarrier.timedOut = true;
  a.exitBarrier.timeoutSeconds = 2;
  a.exitBarrier.firstRank = 0;
  a.exitBarrier.firstExitSeconds = 0.3;
  ExitBarrierTimeout::Straggler s;
  s.rank = s.localRank = 1;
  s.pid = 1001;
  s.runningFor = 2.0;
  a.exitBarrier.stillRunning = {s};
  return a;
}

TEST(ExitBarrier, TimeoutExits124) {
  AttemptResult a = barrierTimedOut();
  EXPECT_EQ(launcherExitCode(a), 124);
  EXPECT_EQ(exitCodeMeaning(124, a), "a deadline passed: the exit barrier timed out");
  a.launcherSignal = SIGINT;  // Ctrl-C during the barrier's teardown
  a.signalBeforeFailure = false;
  EXPECT_EQ(launcherExitCode(a), 124) << "the barrier ended the job, not the signal";
  a.exitBarrier = ExitBarrierTimeout{};
  EXPECT_EQ(launcherExitCode(a), 130) << "without the barrier, the same workers mean the signal";
}

TEST(ExitBarrier, ReportNamesTheRanksStillRunning) {
  ReportContext ctx;
  ctx.host = "node7";
  ctx.runId = "j";
  ctx.logHint = "not kept";
  ctx.exitBarrierOption = "DTRAIN_LAUNCH_EXIT_BARRIER_TIMEOUT (environment)";
  std::string r = formatFailureReport(ctx, {barrierTimedOut()});
  EXPECT_EQ(r.find("launch: job failed: exit barrier timed out: rank 0 exited 0 at 0.30 s, and 1 "
                   "rank was still running 2 s later (exit code 124: a deadline passed"),
            0u)
      << r;
  EXPECT_NE(r.find("rank 1 (local rank 1, pid 1001): still running 2.00 s after rank 0 exited 0"),
            std::string::npos)
      << r;
  EXPECT_NE(r.find("| rank 1: writing the last shard"), std::string::npos) << r;
  EXPECT_NE(r.find("HINT:"), std::string::npos) << r;
  EXPECT_NE(r.find("stuck outside collectives"), std::string::npos) << r;
  EXPECT_NE(r.find("raise DTRAIN_LAUNCH_EXIT_BARRIER_TIMEOUT (environment)"), std::string::npos)
      << "the HINT names the option as the user gave it: " << r;
  EXPECT_EQ(r.find("rank 2 (local rank 2, pid 1002): still running"), std::string::npos) << r;
  EXPECT_NE(r.find("rank 2 (local rank 2, pid 1002) exited with code 0"), std::string::npos) << r;

  std::string line = formatExitBarrierLine(barrierTimedOut().exitBarrier, "--exit-barrier-timeout",
                                           30);
  EXPECT_EQ(line, "launch: exit barrier timed out: rank 0 exited 0 2 s ago (--exit-barrier-timeout "
                  "2) and rank 1 is still running; stopping the workers (SIGTERM, SIGKILL after "
                  "30 s)\n");
}

// Processes that survived SIGKILL decide the exit code (125), whatever else ended the job, and
// the report names each one first: rank, pid, state, where it waits, command.
TEST(LastDeadline, SurvivorsExit125AndAreNamedFirst) {
  AttemptResult a;
  a.workers = {exited(0, 3, 1.0), signaled(1, SIGTERM, 1.5, true)};
  EXPECT_EQ(launcherExitCode(a), 3);
  Survivor s;
  s.rank = s.localRank = 1;
  s.pid = 1001;
  s.isWorker = true;
  s.state = "D (disk sleep)";
  s.waitingIn = "nfs_wait_bit_killable";
  s.command = "./train --epochs 3";
  a.survivors = {s};
  a.killTimeout = 60;
  a.workers[1].state = State::Lost;
  a.workers[1].lostReason = "it survived SIGKILL for 60 s";
  EXPECT_EQ(launcherExitCode(a), 125);
  a.launcherSignal = SIGINT;
  a.signalBeforeFailure = true;
  EXPECT_EQ(launcherExitCode(a), 125) << "also when launch was signalled";
  a.launcherSignal = 0;
  a.signalBeforeFailure = false;

  ReportContext ctx;
  ctx.host = "node7";
  ctx.runId = "j";
  std::string r = formatFailureReport(ctx, {a});
  EXPECT_EQ(r.find("launch: job failed: 1 process of the job survived SIGKILL for 60 s "
                   "(--kill-timeout 60; exit code 125: launcher or infrastructure error: "
                   "processes of the job survived SIGKILL)\n"),
            0u)
      << r;
  EXPECT_NE(r.find("    rank 1 (local rank 1): pid 1001 (the worker), state D (disk sleep), "
                   "waiting in nfs_wait_bit_killable\n      command: ./train --epochs 3\n"),
            std::string::npos)
      << r;
  EXPECT_NE(r.find("HINT: state D (uninterruptible sleep)"), std::string::npos) << r;
  EXPECT_NE(r.find("launch: job failed: rank 0 exited with code 3 (exit code 125"),
            std::string::npos)
      << "the root cause still follows: " << r;
  EXPECT_NE(r.find("rank 1 (local rank 1, pid 1001) was lost: it survived SIGKILL for 60 s"),
            std::string::npos)
      << r;
  EXPECT_EQ(formatSurvivorsLine(a.survivors, 60),
            "launch: 1 process of the job still exists 60 s after SIGKILL: pid 1001 in state D "
            "(disk sleep); giving up on it\n");
}

TEST(Printable, EscapesAndCuts) {
  EXPECT_EQ(printable("a\x01"
                      "b\n",
                      100),
            "a\\x01b\n");
  EXPECT_EQ(printable(std::string(10, 'x'), 4), "xxxx...");
}

}  // namespace
}  // namespace dtrain::launcher::launcher_report_test
