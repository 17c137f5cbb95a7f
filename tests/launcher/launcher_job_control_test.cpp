// The ends of supervision (docs/reliability.md L17, L18): a worker that survives SIGKILL
// (launch's last deadline, Note [Last deadline] in launcher/supervisor/supervisor.h), the
// workers' stdin, and Ctrl-Z on an interactive launch (Note [Job control]). Real processes; a
// real terminal (a pty) for Ctrl-Z.
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include <gtest/gtest.h>

#include "launcher_support.h"
#include "test_support.h"

namespace dtrain::testing::launcher_job_control_test {
namespace {

using namespace std::chrono_literals;

constexpr double kGrace = 0.3;
constexpr double kKillTimeout = 1.0;

// Pid of the worker of local rank `rank` (from its "worker rank=R ... pid=P" line); -1 if none.
pid_t workerPid(const std::string& out, int rank) {
  const std::string needle = "worker rank=" + std::to_string(rank) + " ";
  size_t at = out.find(needle);
  if (at == std::string::npos) return -1;
  size_t pid = out.find(" pid=", at);
  return pid == std::string::npos ? -1 : static_cast<pid_t>(std::stol(out.substr(pid + 5)));
}

// Two workers; the test holds rank 0 past SIGKILL by `hold` and SIGTERMs launch. launch must give
// up on rank 0 --kill-timeout seconds after SIGKILL, name it (pid, `state`, command) and exit
// 125, while rank 1 ends normally. `release` lets the held worker die; nothing may be left then.
void expectGivesUpOnAHeldWorker(const std::function<bool(pid_t)>& hold,
                                const std::function<void(pid_t)>& release,
                                const std::string& state) {
  LaunchProcess p({"--nproc-per-node", "2", "--grace-period", std::to_string(kGrace),
                   "--kill-timeout", std::to_string(kKillTimeout), workerPath(), "--no-store",
                   "--steps", "100000", "--step-ms", "20", "--quiet"});
  ASSERT_TRUE(waitForWorkers(p, 2)) << p.out() << p.err();
  const pid_t held = workerPid(p.out(), 0);
  ASSERT_GT(held, 0) << p.out();
  ASSERT_TRUE(hold(held));
  const double termAt = p.elapsed();
  p.signal(SIGTERM);
  LaunchResult r = p.wait(30);
  const std::string pidText = std::to_string(held);
  release(held);
  ASSERT_FALSE(r.timedOut) << "launch waited for ever on a worker that survives SIGKILL\n"
                           << r.all();
  EXPECT_EQ(r.exitCode, 125) << r.all();
  EXPECT_NE(r.err.find("launch: 1 process of the job still exists 1 s after SIGKILL: pid " +
                       pidText + " in state " + state),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("rank 0 (local rank 0): pid " + pidText + " (the worker), state " + state),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("      command: " + workerPath() + " --no-store --steps 100000"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("(--kill-timeout 1; exit code 125"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 1 (local rank 1, pid"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("rank 1 (local rank 1): pid"), std::string::npos)
      << "rank 1 ended; only rank 0 survived\n"
      << r.err;
  const double took = r.seconds - termAt;
  EXPECT_GT(took, kGrace + kKillTimeout - 0.05) << "gave up before the last deadline";
  EXPECT_LT(took, kGrace + kKillTimeout + 1.0 + kMargin) << r.err;
  expectNoneLeft(r.out);  // the held worker, once released, and its guardian end
}

// A real state D: the worker frozen by the cgroup-v1 freezer. A frozen task is in
// uninterruptible sleep and SIGKILL does not end it until it is thawed. (The v2 freezer lets
// SIGKILL through, so there is nothing to test with it: the test then skips.)
TEST(LastDeadline, WorkerInStateDIsNamedAndLaunchExits125) {
  const std::string dir = "/sys/fs/cgroup/freezer/dtrain-d-state-test-" +
                          std::to_string(::getpid());
  std::error_code ec;
  if (!std::filesystem::exists("/sys/fs/cgroup/freezer/cgroup.procs") ||
      !std::filesystem::create_directory(dir, ec)) {
    GTEST_SKIP() << "no writable cgroup-v1 freezer (needs root and /sys/fs/cgroup/freezer); "
                    "LastDeadline.WorkerHeldByATracerPastSigkill covers the deadline";
  }
  auto hold = [&](pid_t pid) {
    writeFile(dir + "/cgroup.procs", std::to_string(pid));
    writeFile(dir + "/freezer.state", "FROZEN");
    bool frozen = false;
    for (int i = 0; i < 200 && !frozen; ++i) {
      frozen = readFile(dir + "/freezer.state").rfind("FROZEN", 0) == 0;
      if (!frozen) std::this_thread::sleep_for(10ms);
    }
    EXPECT_TRUE(frozen) << readFile(dir + "/freezer.state");
    EXPECT_EQ(processStateOf(pid), 'D');
    return frozen;
  };
  auto release = [&](pid_t) { writeFile(dir + "/freezer.state", "THAWED"); };
  expectGivesUpOnAHeldWorker(hold, release, "D (disk sleep)");
  for (int i = 0; i < 100 && !std::filesystem::remove(dir, ec); ++i) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_FALSE(std::filesystem::exists(dir)) << "cgroup left behind: " << dir;
}

// Anywhere: the test traces the worker (PTRACE_O_TRACEEXIT) and never lets it finish exiting, so
// after SIGKILL it waits in its exit stop (state 't') until the test detaches -- a process that
// SIGKILL does not remove, held by something outside the job, as a hung kernel call would hold
// it.
TEST(LastDeadline, WorkerHeldByATracerPastSigkill) {
  auto hold = [](pid_t pid) {
    if (::ptrace(PTRACE_SEIZE, pid, nullptr, PTRACE_O_TRACEEXIT) != 0) {
      ADD_FAILURE() << "PTRACE_SEIZE " << pid << ": " << std::strerror(errno)
                    << " (the test traces a worker it started; needs ptrace)";
      return false;
    }
    return true;
  };
  auto release = [](pid_t pid) {
    // It is in its exit stop: detaching lets it finish (and its guardian reap it).
    if (::ptrace(PTRACE_DETACH, pid, nullptr, nullptr) != 0) ::kill(pid, SIGKILL);
  };
  expectGivesUpOnAHeldWorker(hold, release, "t (tracing stop)");
}

// Workers read /dev/null, not launch's stdin (which here is a file with a line in it).
TEST(JobControl, WorkersStdinIsDevNull) {
  TempDir dir;
  writeFile(dir.file("input"), "typed at the terminal\n");
  LaunchProcess p({"--nproc-per-node", "2", "/bin/sh", "-c",
                   "echo \"stdin=$(readlink /proc/self/fd/0) read=$(head -c 100)\""},
                  {}, {"/bin/sh", "-c", "exec \"$@\" < " + dir.file("input"), "sh"});
  LaunchResult r = p.wait(20);
  EXPECT_EQ(r.exitCode, 0) << r.all();
  EXPECT_EQ(countLines(r.out, "stdin=/dev/null read=\n"), 0) << "no line may end there";
  EXPECT_EQ(countLines(r.out, "stdin=/dev/null read="), 2) << r.out;
  EXPECT_EQ(r.out.find("typed at the terminal"), std::string::npos) << r.out;
}

// An interactive bash on a pseudo-terminal: what a user at a terminal gets.
class PtyShell {
 public:
  PtyShell() {
    winsize ws{};
    ws.ws_row = 50;
    ws.ws_col = 400;
    pid_ = ::forkpty(&master_, nullptr, nullptr, &ws);
    if (pid_ == 0) {
      ::setenv("PS1", "PTY$ ", 1);
      ::setenv("TERM", "dumb", 1);
      ::execl("/bin/bash", "bash", "--norc", "--noprofile", "--noediting", "-i",
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~PtyShell() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (master_ >= 0) ::close(master_);
  }
  bool ok() const { return pid_ > 0 && master_ >= 0; }
  pid_t pid() const { return pid_; }
  void type(const std::string& text) {
    ASSERT_EQ(::write(master_, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  }
  // Reads the terminal until `needle` appears after offset `from`, or `seconds` pass.
  bool waitFor(const std::string& needle, double seconds, size_t from = 0) {
    auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (screen_.find(needle, from) == std::string::npos) {
      if (std::chrono::steady_clock::now() > until) return false;
      pollfd fd{master_, POLLIN, 0};
      if (::poll(&fd, 1, 50) > 0) {
        char buf[4096];
        ssize_t n = ::read(master_, buf, sizeof buf);
        if (n > 0) screen_.append(buf, static_cast<size_t>(n));
      }
    }
    return true;
  }
  const std::string& screen() const { return screen_; }

 private:
  pid_t pid_ = -1;
  int master_ = -1;
  std::string screen_;
};

bool eventuallyState(const std::vector<pid_t>& pids, bool stopped, double seconds) {
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (true) {
    bool all = !pids.empty();
    for (pid_t p : pids) all = all && ((processStateOf(p) == 'T') == stopped);
    if (all) return true;
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(10ms);
  }
}

// Ctrl-Z on launch at a terminal stops the whole job -- launch and every worker -- and `fg`
// resumes it; the job then finishes normally. Without launch's own job control the workers (in
// process groups of their own, outside the terminal's foreground group) would train on while
// launch is stopped.
TEST(JobControl, CtrlZStopsTheWholeJobAndFgResumesIt) {
  PtyShell shell;
  ASSERT_TRUE(shell.ok());
  ASSERT_TRUE(shell.waitFor("PTY$ ", 10)) << shell.screen();
  // 150 steps of 20 ms: three seconds of work, stopped for one in the middle.
  shell.type(launchPath() + " --nproc-per-node 2 " + workerPath() +
             " --no-store --steps 150 --step-ms 20\n");
  ASSERT_TRUE(shell.waitFor("worker rank=1 ", 20)) << shell.screen();
  ASSERT_TRUE(shell.waitFor("worker rank=0 ", 20)) << shell.screen();
  const std::vector<pid_t> children = childrenOf(shell.pid());
  ASSERT_EQ(children.size(), 1u) << "bash's child: launch";
  const pid_t launch = children[0];
  const std::vector<pid_t> workers = {workerPid(shell.screen(), 0), workerPid(shell.screen(), 1)};
  ASSERT_GT(workers[0], 0);
  ASSERT_GT(workers[1], 0);
  const std::vector<pid_t> guardians = childrenOf(launch);
  ASSERT_EQ(guardians.size(), 2u);

  const size_t beforeStop = shell.screen().size();
  shell.type("\x1a");  // Ctrl-Z
  ASSERT_TRUE(shell.waitFor("Stopped", 10, beforeStop)) << shell.screen();
  EXPECT_TRUE(eventuallyState({launch}, true, 5)) << "launch is stopped";
  EXPECT_TRUE(eventuallyState(workers, true, 5)) << "every worker is stopped";
  const int stepsStopped = countLines(shell.screen(), ": step ");
  std::this_thread::sleep_for(1s);
  EXPECT_TRUE(eventuallyState(workers, true, 0)) << "and stays stopped";
  shell.waitFor("never printed", 0.2);  // read what the terminal has
  EXPECT_EQ(countLines(shell.screen(), ": step "), stepsStopped) << "no step while stopped";
  for (pid_t g : guardians) EXPECT_NE(processStateOf(g), 'T') << "guardians stay awake";
  const int stepsBefore = countLines(shell.screen(), ": step ");

  const size_t beforeFg = shell.screen().size();
  shell.type("fg\n");
  EXPECT_TRUE(eventuallyState(workers, false, 5)) << "fg resumes the workers";
  EXPECT_TRUE(eventuallyState({launch}, false, 5)) << "and launch";
  ASSERT_TRUE(shell.waitFor("PTY$ ", 30, beforeFg)) << "the job ends\n" << shell.screen();
  EXPECT_GT(countLines(shell.screen(), ": step "), stepsBefore + 10) << shell.screen();
  shell.type("echo \"launch rc=$?\"\n");
  EXPECT_TRUE(shell.waitFor("launch rc=0", 10, beforeFg)) << shell.screen();
  EXPECT_EQ(countLines(shell.screen(), "rank 0: done"), 1) << shell.screen();
  EXPECT_EQ(countLines(shell.screen(), "rank 1: done"), 1) << shell.screen();
  waitGone(workers, 5);
}

}  // namespace
}  // namespace dtrain::testing::launcher_job_control_test
