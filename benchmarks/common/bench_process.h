#pragma once
// Process plumbing of the drivers of ddp_step_bench, train_bench, zero_bench and recompute_bench:
// starting jobs, waiting for them, free ports, the FIFOs through which they hand out turns
// (Note [Turns]), reading their flags, their main(), and the small helpers they share.
// Torch-free; the library dtrain_bench_common (benchmarks/common/common.cmake).

#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/stats.h"
#include "dtrain/base/tcp_store.h"

namespace dtrain::bench {

// Spawns `argv` with `env` added to (or replacing in) this process's environment.
pid_t spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env);

// Waits for every pid; on the first failure kills the rest. Throws naming `what`.
void waitAll(std::vector<pid_t> pids, const std::string& what);

// Kills (SIGKILL) and reaps `pids`, ignoring errors: cleanup after a failure.
void killAll(const std::vector<pid_t>& pids);

// A port free right now on loopback (the kernel's choice).
uint16_t freePort();

// A running job: dtrain's (its workers and the store they rendezvous in) or PyTorch's peer.
struct Job {
  std::string name;  // for messages
  std::vector<pid_t> pids;
  std::unique_ptr<store::TcpStoreServer> store;
  std::string out;  // the result file its rank 0 writes
};

// dtrain's job: `world` copies of this program run with --worker and `workerArgs`, the ranks of
// one job on a store hosted here (with a random token), OMP_NUM_THREADS=1 and `env` added.
Job startWorkers(std::string name, int world, const std::vector<std::string>& workerArgs,
                 const std::map<std::string, std::string>& env, std::string out);

// torchrun running a peer of `world` processes on this node, up to the script and its arguments.
// The rendezvous is on a free loopback port; torchrun polls its workers every 5 s (1 s in smoke
// runs) rather than 2.x's default 0.1 s, so that its own polling takes less of the two cores the
// peer's ranks measure on.
std::vector<std::string> torchrunArgv(const std::string& python, int world,
                                      const std::string& rdzvId, bool smoke);

// Waits for the job's processes and stops its store; returns the text of its result file. Throws
// when a process failed or the file is empty.
std::string finishJob(Job& job);

// The non-empty parts of `s` between separators.
std::vector<std::string> split(const std::string& s, char sep);

// parse()'s reading of flag argv[i]'s value, advancing i; throws "<flag> needs a value" at the end
// of argv.
std::string flagValue(int argc, char** argv, int& i);
// The same value read as a count in [0, 1000000); throws "<flag> needs a count, got '<value>'".
int flagCount(int argc, char** argv, int& i);

// A benchmark's main(): returns what `body` returns; an exception is printed as "<name>: <what>"
// on stderr and exits 1.
template <class Body>
int benchMain(const char* name, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

// Note [Turns]
// The development machine is shared and its load swings within seconds, more than the
// differences measured here. So the jobs of one measurement -- dtrain's and its peer's (PyTorch's,
// or another dtrain configuration) -- run at once and take turns step by step: before each step
// (warm-up ones included) rank 0 of a job waits for a byte on its "go" FIFO, the job's ranks meet
// in a barrier, run and time the step, meet again, and rank 0 answers on "done". The driver hands
// the turns out in rotation, so every dtrain step has a peer's step next to it in time (Note
// [Paired statistics] in stats.h), and a job that waits for its turn sleeps in a barrier (no CPU).

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
