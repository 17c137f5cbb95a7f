#pragma once
// The seam between the Supervisor and whatever watches the job (launcher/monitor): the supervisor
// tells an observer what it starts and what ends; the observer may ask the supervisor to stop the
// job. Both are tiny on purpose, so the supervisor does not depend on the monitor.

#include <sys/types.h>

#include <string>

namespace dtrain::launcher {

// Called on the supervisor's thread (or a multi-node master's coordinator), in this order per
// attempt: attemptStarted, then workerStarted / workerEnded as they happen, teardownStarted once
// it stops the workers (if it does), attemptEnded. Implementations return quickly (no I/O that
// can block).
class JobObserver {
 public:
  virtual ~JobObserver() = default;
  // `worldSize`: ranks in this attempt (a multi-node round may have fewer nodes than the last).
  virtual void attemptStarted(int attempt, int worldSize) = 0;
  virtual void workerStarted(int rank, int localRank, pid_t pid) = 0;
  virtual void workerEnded(int rank) = 0;
  virtual void teardownStarted() = 0;
  virtual void attemptEnded(int attempt) = 0;
};

// What an observer may ask of the job, from any thread.
class JobControl {
 public:
  virtual ~JobControl() = default;
  // Stops the job because a deadline passed (`reason` says which, for the report): the usual
  // teardown, no restart, and launch exits 124 unless a worker failed first.
  virtual void stopForDeadline(const std::string& reason) = 0;
};

}  // namespace dtrain::launcher
