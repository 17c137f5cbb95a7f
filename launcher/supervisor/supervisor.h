#pragma once
// The Supervisor runs one node's workers: spawns them (each under a guardian, see Note
// [Guardians]), multiplexes their output, notices the first failure within milliseconds, stops
// the others (SIGTERM, SIGKILL after the grace period), restarts the whole group while the
// restart budget lasts, and finally prints the root-cause report and returns launch's exit code.
//
// One thread does it all: a single epoll loop over every worker's stdout, stderr and status pipe
// and a signalfd for the launcher's own signals. See Note [One event loop].

#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include "launcher/launch_config.h"
#include "launcher/program.h"
#include "launcher/supervisor/failure_report.h"
#include "launcher/worker_env.h"

namespace dtrain::launcher {

// Note [One event loop]
// ~~~~~~~~~~~~~~~~~~~~~
// A thread per pipe would cost 2N+ threads on a 2-core machine and still need a lock around the
// console to keep lines whole. Instead one epoll set holds every pipe (level-triggered, one read
// of at most 64 KiB per ready pipe per turn, so a flooding worker cannot starve the others or the
// status pipes), the signalfd, and a timeout for the SIGKILL deadline. Crash detection latency is
// the guardian's pidfd wake-up plus one pipe write: milliseconds, with no polling interval.

// The signals launch forwards and then tears the job down for.
constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// Blocks kForwardedSignals in the calling thread (and so in threads it starts later, such as the
// store server's) so the supervisor can read them from a signalfd; ignores SIGPIPE. Call before
// starting any thread.
void blockLauncherSignals();

// Everything resolved before the first worker starts.
struct JobPlan {
  LaunchConfig config;
  WorkerCommand command;
  NodeContext node;          // with localWorldSize, ports, token, jobDir, inherited environment
  bool logAllStreams = false;  // --log-dir: every stream of every rank gets a log file
  std::string logHint;       // for the report when a stream has no log file
  // node.jobDir is launch's temporary directory, removed when the job ends -- by the guardians
  // if launch is killed (see Note [Temporary job directory]).
  bool temporaryJobDir = false;
};

class Supervisor {
 public:
  explicit Supervisor(JobPlan plan);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Runs attempts until every worker exits 0, a failure outlasts the restart budget, or launch is
  // signalled. Prints the failure report (stderr) and returns launch's exit code.
  int run();

 private:
  struct Slot;
  AttemptResult runAttempt(int attempt);

  JobPlan plan_;
  int signalFd_ = -1;
  int epollFd_ = -1;
};

}  // namespace dtrain::launcher
