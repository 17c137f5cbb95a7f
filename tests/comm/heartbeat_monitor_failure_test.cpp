// The NCCL watchdog's heartbeat monitor ends a process whose watchdog is stuck, within its bound
// (docs/reliability.md M3), and never one whose watchdog beats. Timing-bound: serial.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "heartbeat_monitor.h"

namespace dtrain::comm::heartbeat_monitor_failure_test {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

TEST(HeartbeatMonitorFailure, ABeatingWatchdogIsLeftAlone) {
  std::atomic<int> stuck{0};
  HeartbeatMonitorOptions o;
  o.who = "test";
  o.timeout = Millis(200);
  o.checkInterval = Millis(10);
  o.onStuck = [&](const std::string&) { stuck++; };
  HeartbeatMonitor monitor(o);
  monitor.start();
  const auto start = Clock::now();
  while (secondsSince(start) < 1.5) {  // 7.5 timeouts
    monitor.beat("a turn of its loop");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  monitor.stop();
  EXPECT_EQ(stuck.load(), 0);
}

TEST(HeartbeatMonitorFailure, SilenceIsReportedOnceWithinTheTimeoutAndOneCheck) {
  std::mutex mutex;
  std::vector<std::string> messages;
  Clock::time_point reportedAt;
  HeartbeatMonitorOptions o;
  o.who = "nccl rank 0/2 (cuda:0)";
  o.timeout = Millis(300);
  o.checkInterval = Millis(20);
  o.onStuck = [&](const std::string& m) {
    std::lock_guard<std::mutex> lock(mutex);
    messages.push_back(m);
    reportedAt = Clock::now();
  };
  HeartbeatMonitor monitor(o);
  monitor.start();
  for (int i = 0; i < 10; ++i) {
    monitor.beat("a turn of its loop");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  monitor.beat("ncclCommAbort");
  const auto lastBeat = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(2));  // timeout + 1.7 s of silence
  monitor.stop();
  std::lock_guard<std::mutex> lock(mutex);
  ASSERT_EQ(messages.size(), 1u) << "the monitor reports a silence once";
  const double after = std::chrono::duration<double>(reportedAt - lastBeat).count();
  EXPECT_GE(after, 0.3);
  // timeout + one check interval; the margin is for a loaded machine.
  EXPECT_LT(after, 0.3 + 0.02 + 1.0);
  EXPECT_NE(messages[0].find("it was in: ncclCommAbort"), std::string::npos) << messages[0];
  EXPECT_NE(messages[0].find("nccl rank 0/2 (cuda:0)"), std::string::npos) << messages[0];
}

TEST(HeartbeatMonitorFailure, StopBeforeTheTimeoutReportsNothing) {
  std::atomic<int> stuck{0};
  HeartbeatMonitorOptions o;
  o.timeout = Millis(300);
  o.checkInterval = Millis(10);
  o.onStuck = [&](const std::string&) { stuck++; };
  {
    HeartbeatMonitor monitor(o);
    monitor.start();
    monitor.beat("its wait for work (idle)");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }  // the destructor stops it
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(stuck.load(), 0);
}

// The default action in a real process: the message on stderr and in TORCHELASTIC_ERROR_FILE
// (what launch's failure report quotes), then SIGABRT.
TEST(HeartbeatMonitorFailure, AStuckWatchdogEndsTheProcessWithSigabrtAndItsErrorFile) {
  char dir[] = "/tmp/dtrain_heartbeat_XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string errorFile = std::string(dir) + "/error.json";
  const auto start = Clock::now();
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    struct rlimit noCore {
      0, 0
    };
    ::setrlimit(RLIMIT_CORE, &noCore);  // no core file from the abort
    ::setenv("TORCHELASTIC_ERROR_FILE", errorFile.c_str(), 1);
    HeartbeatMonitorOptions o;
    o.who = "nccl rank 3/4 (cuda:3)";
    o.timeout = Millis(300);
    o.describe = [] { return std::string("its last collectives: seq 12 allreduce running"); };
    auto* monitor = new HeartbeatMonitor(o);  // the process ends in its thread
    monitor->start();
    monitor->beat("ncclCommAbort");
    for (;;) ::pause();  // the watchdog is stuck: it never beats again
  }
  int status = 0;
  pid_t done = 0;
  while ((done = ::waitpid(pid, &status, WNOHANG)) == 0 && secondsSince(start) < 20) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (done == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "the process with a stuck watchdog was still there after 20 s";
  }
  const double took = secondsSince(start);
  ASSERT_TRUE(WIFSIGNALED(status)) << "status " << status;
  EXPECT_EQ(WTERMSIG(status), SIGABRT);
  EXPECT_GE(took, 0.3);
  EXPECT_LT(took, 5.0) << "timeout 0.3 s + one check interval, with a margin for load";
  std::ifstream in(errorFile);
  std::stringstream content;
  content << in.rdbuf();
  const std::string text = content.str();
  EXPECT_EQ(text.rfind("{\"message\": {\"message\": \"", 0), 0u) << text;
  for (const char* part :
       {"nccl rank 3/4 (cuda:3)", "it was in: ncclCommAbort", "seq 12 allreduce running"}) {
    EXPECT_NE(text.find(part), std::string::npos) << "missing \"" << part << "\" in: " << text;
  }
  ::unlink(errorFile.c_str());
  ::rmdir(dir);
}

}  // namespace
}  // namespace dtrain::comm::heartbeat_monitor_failure_test
