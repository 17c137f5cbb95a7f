#pragma once
// A simulated cluster on this machine, for the scale test (launcher_scale_tests) and the scale
// benchmark (launch_scale_bench): N `launch` processes in manual mode on loopback -- node rank 0
// hosts the store, no ssh, so a lost node is found through its heartbeats -- each with its own
// node id and one test worker that publishes progress once a second through dtrain's publisher
// and computes nothing (testing/worker/worker --progress).
//
// Fleet starts processes and reads their output as it comes, every line with the time it arrived;
// LaunchSim builds the agents' command lines and reads what they say (DTRAIN_VERBOSE=1): when
// each joined a round and read its plan, when its worker started, the store's request counts
// node rank 0 logs. Times are CLOCK_MONOTONIC seconds, the clock of every process here.

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dtrain::sim {

double monotonicSeconds();

// Processes started together; their output read as it comes.
class Fleet {
 public:
  struct Line {
    double at = 0;  // arrival
    std::string text;
  };
  struct Member {
    pid_t pid = -1;
    int outFd = -1;
    int errFd = -1;
    std::string partial[2];
    std::vector<Line> lines;  // both streams, in arrival order
    bool exited = false;
    int status = 0;
    double exitedAt = 0;
    double cpuSeconds = 0;     // once exited: its own and its reaped children's (wait4)
    uint64_t maxRssBytes = 0;  // once exited: its largest resident set (wait4)
  };

  Fleet() = default;
  ~Fleet();  // SIGKILLs every member's process group still there, and reaps them
  Fleet(const Fleet&) = delete;
  Fleet& operator=(const Fleet&) = delete;

  // Starts argv (argv[0] a path) in a process group of its own, with this environment plus `env`
  // ("KEY=VALUE"; "KEY=" unsets); stdin is /dev/null. Returns its index.
  int spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env);
  // Reads what arrives for up to `ms` milliseconds; reaps members whose streams both ended.
  void pump(int ms);
  // Pumps until `done()` or `seconds` pass; returns done().
  bool pumpUntil(const std::function<bool()>& done, double seconds);
  void signal(int member, int signo);
  size_t size() const { return members_.size(); }
  const Member& member(int i) const { return *members_[static_cast<size_t>(i)]; }
  bool allExited() const;
  // The exit code of an exited member; 128+N when killed by signal N.
  int exitCode(int i) const;
  // Member i's lines containing `needle`.
  std::vector<Line> linesWith(int i, const std::string& needle) const;
  // Everything member i printed, for messages.
  std::string text(int i, size_t maxBytes = 20000) const;

 private:
  void take(Member& m, int stream, const char* data, size_t n, double at);
  std::vector<std::unique_ptr<Member>> members_;
};

// "t=<seconds>" in a line, or -1.
double timeIn(const std::string& line);

// CPU seconds (user + system) a process has used, all its threads; -1 when it is gone.
double processCpuSeconds(pid_t pid);
// Its threads' CPU seconds summed by thread name ("dtrain-store", "launch-coord", ...).
std::map<std::string, double> threadCpuSeconds(pid_t pid);
// Resident memory of a process in bytes; 0 when it is gone.
uint64_t residentBytes(pid_t pid);
// The process and its descendants: CPU seconds and resident bytes summed.
void treeUsage(pid_t pid, double* cpuSeconds, uint64_t* residentBytes);

// The options of one simulated job.
struct LaunchSimOptions {
  std::string launch;  // the launch binary
  std::string worker;  // testing/worker/worker
  int nodes = 16;
  int minNodes = 0;  // elastic MIN; 0: not elastic (MIN = nodes)
  double heartbeatInterval = 5;
  double heartbeatTimeout = 30;
  double gracePeriod = 10;
  double rdzvTimeout = 300;
  int maxRestarts = 0;
  int workerSteps = 30;   // seconds each worker runs (a step a second)
  int restartSteps = -1;  // in a restarted round; -1: workerSteps
  std::string token;      // the job's token (DTRAIN_STORE_TOKEN on every node)
};

// Store requests node rank 0 had served when it logged them.
struct StoreCount {
  double at = 0;
  std::string when;  // "periodic", "round 0 planned", ...
  uint64_t heartbeats = 0;
  uint64_t monitoring = 0;
  uint64_t rest = 0;
  uint64_t total() const { return heartbeats + monitoring + rest; }
};

class LaunchSim {
 public:
  explicit LaunchSim(LaunchSimOptions options);
  // Starts node 0 (the store's host) first, then the others as fast as it can.
  void start();
  Fleet& fleet() { return fleet_; }
  const LaunchSimOptions& options() const { return options_; }
  int port() const { return port_; }
  // After the last agent was started.
  double startedAt() const { return startedAt_; }
  // Agents (node ids) whose line for round `round` is there; -1 for the others.
  std::vector<double> joined(int round) const;
  std::vector<double> planned(int round) const;
  // Their workers' start (and end) in round `round` (its attempt).
  std::vector<double> workerStarted(int round) const;
  std::vector<double> workerDone(int round) const;
  // When node `node`'s worker got SIGTERM in any round (-1: never).
  double workerStopped(int node) const;
  // What node 0 logged of the store's requests, in order.
  std::vector<StoreCount> storeCounts() const;
  // Arrival of node 0's first line containing `needle`; -1 when none.
  double masterSaid(const std::string& needle) const;
  // How many of `times` are set, and the largest.
  static int count(const std::vector<double>& times);
  static double latest(const std::vector<double>& times);

 private:
  std::vector<std::string> agentArgv(int node) const;
  LaunchSimOptions options_;
  int port_ = 0;
  double startedAt_ = 0;
  Fleet fleet_;
};

}  // namespace dtrain::sim
