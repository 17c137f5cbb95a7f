#pragma once
// Process plumbing of ddp_step_bench's driver: starting jobs, waiting for them, free ports, and
// the FIFOs through which it hands out turns (Note [Turns] in ddp_step_bench.h). Torch-free.

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dtrain::bench {

// Spawns `argv` with `env` added to (or replacing in) this process's environment.
pid_t spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env);

// Waits for every pid; on the first failure kills the rest. Throws naming `what`.
void waitAll(std::vector<pid_t> pids, const std::string& what);

// Kills (SIGKILL) and reaps `pids`, ignoring errors: cleanup after a failure.
void killAll(const std::vector<pid_t>& pids);

// A port free right now on loopback (the kernel's choice).
uint16_t freePort();

// The driver's end of one job's turn FIFOs "<path>.go" / "<path>.done" (created here).
class TurnGiver {
 public:
  explicit TurnGiver(std::string path);
  ~TurnGiver();
  TurnGiver(const TurnGiver&) = delete;
  TurnGiver& operator=(const TurnGiver&) = delete;

  // Opens both ends once the job's rank 0 opens its own; throws when one of `pids` exits first
  // or `timeoutSeconds` pass.
  void connect(const std::vector<pid_t>& pids, double timeoutSeconds);
  // One turn: lets the job run a step and waits until it is done. Throws when the job is gone.
  void give();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int go_ = -1;
  int done_ = -1;
};

// A job's rank 0 end of the same FIFOs (opened in the driver's order: go, then done). Without a
// path, or on other ranks, every call does nothing.
class TurnTaker {
 public:
  TurnTaker(const std::string& path, bool owner);
  ~TurnTaker();
  TurnTaker(const TurnTaker&) = delete;
  TurnTaker& operator=(const TurnTaker&) = delete;

  void begin();  // waits for the driver's go; throws when it closed the FIFO
  void end();    // reports the turn done

 private:
  int go_ = -1;
  int done_ = -1;
};

}  // namespace dtrain::bench
