#pragma once
// Runs `launch` as a real child process for the integration tests: output captured from both
// streams while it runs (so a flooding job never blocks on our pipes), signals, deadlines, and
// the proof that no process of the job is left.
//
// The test process makes itself a child subreaper, so workers and guardians orphaned by a killed
// launcher are reparented to it and reaped here: a pid that still exists after reapOrphans() is a
// live process, not a zombie someone else forgot.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dtrain::testing {

// <build>/launch and <build>/testing/worker/worker.
std::string launchPath();
std::string workerPath();

struct LaunchResult {
  int exitCode = -1;  // launch's exit code; 128+N when it was killed by signal N
  bool timedOut = false;
  std::string out;
  std::string err;
  double seconds = 0;  // start to exit
  std::string all() const { return out + err; }
};

class LaunchProcess {
 public:
  // Starts `launch args...` with the test environment plus `env` ("KEY=VALUE"; "KEY=" unsets).
  // `wrapper` runs first and must exec its arguments (e.g. sh -c '...; exec "$@"' sh).
  LaunchProcess(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
                const std::vector<std::string>& wrapper = {});
  ~LaunchProcess();  // SIGKILLs launch if still running
  LaunchProcess(const LaunchProcess&) = delete;
  LaunchProcess& operator=(const LaunchProcess&) = delete;

  pid_t pid() const { return pid_; }
  double elapsed() const;
  // Reads whatever output is ready, waiting at most timeoutMs for some.
  void pump(int timeoutMs);
  // Pumps until `pred(out, err)` holds or `seconds` pass; returns whether it held.
  bool waitFor(const std::function<bool(const std::string&, const std::string&)>& pred,
               double seconds);
  bool waitForOutput(const std::string& needle, double seconds);
  // Pumps until launch exits or `seconds` pass (then SIGKILLs it: timedOut).
  LaunchResult wait(double seconds);
  void signal(int signo);
  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }
  // Seconds after start when `needle` first appeared in the output; -1 when it has not.
  double firstSeen(const std::string& needle) const;

 private:
  pid_t pid_ = -1;
  int outFd_ = -1;
  int errFd_ = -1;
  std::chrono::steady_clock::time_point start_;
  std::string out_;
  std::string err_;
  struct ReadTime {
    size_t outSize;
    size_t errSize;
    double when;
  };
  std::vector<ReadTime> outTimes_;  // after each read that got something
  bool exited_ = false;
  int status_ = 0;
};

// Runs launch to completion.
LaunchResult runLaunch(const std::vector<std::string>& args,
                       const std::vector<std::string>& env = {}, double seconds = 30);

// Every pid the test worker printed: its own (pid=), its guardian (ppid=), grandchildren.
std::vector<pid_t> jobPids(const std::string& output);

// Reaps every exited child of the test process that is not a launch under test.
void reapOrphans();

// Waits until none of `pids` exists (reaping orphans meanwhile). Returns the ones left.
std::vector<pid_t> waitGone(const std::vector<pid_t>& pids, double seconds);

// Lines of `text` containing `needle`.
int countLines(const std::string& text, const std::string& needle);

// Extra seconds every time bound allows: the test machine is small and shared.
constexpr double kMargin = 1.0;

// `launch <launchOptions> <worker> <store flags> <workerFlags>`: the test worker joining the
// job's store (see workerStoreFlags) with the given flags.
std::vector<std::string> launchArgs(const std::vector<std::string>& launchOptions,
                                    const std::vector<std::string>& workerFlags);
// The flags launchArgs() gives the worker for the store.
std::vector<std::string> workerStoreFlags();

// Pumps until `n` workers printed their pid line.
bool waitForWorkers(LaunchProcess& p, int n, double seconds = 20);

// The port launch printed ("launch: metrics on http://0.0.0.0:PORT/metrics"), waiting at most
// `seconds` for the line; -1 when it did not come.
int metricsPort(LaunchProcess& p, double seconds = 20);

// No pid the job printed exists any more (reaping orphans; a moment's grace for the kernel).
void expectNoneLeft(const std::string& output);

// Children of `pid` (all its threads) and a process's state letter ('Z' zombie; 0 gone).
std::vector<pid_t> childrenOf(pid_t pid);
char processStateOf(pid_t pid);

// "SIGINT" for SIGINT.
std::string signalNameOf(int signo);

// A memory cgroup of its own (v1 or v2) with a limit, for one launch to run in: wrapper() is the
// LaunchProcess wrapper that moves launch (and so the job) into it. Removed by the destructor,
// once every process has left it. create() returns null with `why` set when this machine cannot
// make one (not root, no writable cgroup file system, no memory controller): the test skips.
class MemoryCgroup {
 public:
  static std::unique_ptr<MemoryCgroup> create(const std::string& name, size_t limitBytes,
                                              std::string* why);
  ~MemoryCgroup();
  MemoryCgroup(const MemoryCgroup&) = delete;
  MemoryCgroup& operator=(const MemoryCgroup&) = delete;

  std::vector<std::string> wrapper() const;
  const std::string& dir() const { return dir_; }

 private:
  explicit MemoryCgroup(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
};

}  // namespace dtrain::testing
