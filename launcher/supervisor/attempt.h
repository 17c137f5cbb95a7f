#pragma once
// One attempt of this node's workers (Supervisor::Attempt, Note [Attempt steps]); internal to
// launcher/supervisor/. attempt.cpp holds the steps and the event loop, teardown.cpp the ways
// an attempt stops -- the teardown, launch's own signals and job control, the deadlines.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "launcher/seconds.h"
#include "launcher/supervisor/guardian.h"
#include "launcher/supervisor/output.h"
#include "launcher/supervisor/supervisor.h"

namespace dtrain::launcher {

// The event loop's epoll tags: a worker's pipes are tagOf(slot, kind); the others are fixed.
enum FdKind : uint64_t { kStatusFd = 0, kStdoutFd = 1, kStderrFd = 2 };
constexpr uint64_t kSignalTag = ~uint64_t{0};
constexpr uint64_t kStopTag = ~uint64_t{1};
constexpr uint64_t kDeadlineTag = ~uint64_t{2};
constexpr size_t kReadChunk = 64 * 1024;

inline uint64_t tagOf(size_t slot, FdKind kind) {
  return (static_cast<uint64_t>(slot) << 2) | kind;
}

// Adds `fd` to the epoll set `epollFd` (readable), tagged `tag`.
void addToEpoll(int epollFd, int fd, uint64_t tag);

// One worker of an attempt: its guardian, its streams and what became of it.
struct Supervisor::Slot {
  int rank = 0;
  int localRank = 0;
  GuardedWorker guarded;
  std::unique_ptr<WorkerStream> out;
  std::unique_ptr<WorkerStream> err;
  bool stdoutOpen = false;
  bool stderrOpen = false;
  bool statusOpen = false;
  bool exitReported = false;
  bool askedToStop = false;
  int execErrno = 0;
  std::string errorFile;
  WorkerOutcome outcome;
};

// Note [Attempt steps]
// ~~~~~~~~~~~~~~~~~~~~
// One attempt of this node's workers, as named steps that the one-node job (Supervisor::run) and a
// multi-node agent (launcher/cluster/agent/agent.h, one attempt per round) share: spawnWorkers(),
// then superviseUntilEveryWorkerEnded() -- the event loop of Note [One event loop], dispatching to
// onSignals(), onStatus(), pump() and the stop request of AttemptHooks, with the deadlines of
// nextTimeoutMs() -- then drainOutput() and gatherFacts() for the report. The state the steps share
// is this class's members; the Supervisor keeps what outlives an attempt (epoll set, signalfd,
// plan).
class Supervisor::Attempt {
 public:
  Attempt(Supervisor& sup, int attempt, const AttemptHooks& hooks);
  AttemptResult run();

 private:
  using Clock = std::chrono::steady_clock;

  double seconds() const { return secondsSince(start_); }

  // The steps (attempt.cpp).
  // Spawns every worker; a failure part-way stops the ones already running.
  void spawnWorkers();
  void spawnWorker(int i);
  void superviseUntilEveryWorkerEnded();
  // The event loop's one timer (epoll_wait's timeout): the last deadline after SIGKILL, the
  // SIGKILL deadline while stopping, else the exit barrier's once armed; none while stopped.
  int nextTimeoutMs() const;
  bool anyStatusOpen() const;
  bool pump(Slot& s, FdKind kind);
  void onStatus(Slot& s);
  // Every worker and everything under it is gone: what is left in the pipes is the end of
  // their output. Take it (the report wants the last stderr lines) and close.
  void drainOutput();
  // The facts for the report.
  void gatherFacts();

  // Stopping (teardown.cpp).
  // `why`: this node's own reason, passed to the hooks (empty: asked from outside) unless
  // `nodeLost` (AttemptHooks::signalLosesNode): then it goes into the result instead.
  void beginTeardown(const std::string& why, bool nodeLost = false);
  void killAll();
  // Ctrl-Z: stop every worker, then launch itself; SIGCONT resumes them (Note [Job control]).
  void forwardToAll(int sig);
  void onStop();
  void onContinue();
  void onSignals();
  // JobControl::stopForDeadline (--stall-action stop): the job ends with 124, without a restart.
  void onDeadlineStop();
  // Workers still running when the barrier's deadline passes: the job ends with 124.
  void onBarrierTimeout();
  // The last deadline passed: name what is left of each worker, and stop waiting for it.
  void onKillTimeout();

  Supervisor& sup_;
  const LaunchConfig& config_;
  const NodeContext& node_;
  const AttemptHooks& hooks_;
  JobObserver* const observer_;
  const int attempt_;
  const Clock::time_point start_;
  const int64_t oomBefore_;
  AttemptResult result_;
  std::vector<Slot> slots_;
  std::vector<char> buffer_;
  bool stopping_ = false;
  bool killed_ = false;
  Clock::time_point killAt_;
  Clock::time_point giveUpAt_;  // the last deadline, once SIGKILL was sent (Note [Last deadline])
  bool jobStopped_ = false;     // by SIGTSTP (Note [Job control])
  Clock::time_point stoppedAt_;
  // The exit barrier: armed when the first worker exits 0 (see Note [Exit barrier]).
  bool barrierArmed_ = false;
  Clock::time_point barrierAt_;
};

}  // namespace dtrain::launcher
