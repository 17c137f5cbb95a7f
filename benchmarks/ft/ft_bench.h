#pragma once
// ft_bench's parts (benchmarks/README.md, "ft_bench"): the worker it runs under `launch`
// (ft_worker.cpp), the simulated cluster and the jobs it runs there (ft_job.cpp), and what one
// job's output says (JobRecord).

#include <string>
#include <vector>

namespace dtrain::bench {

// CLOCK_REALTIME in seconds: one clock for the driver and every worker in every namespace.
double wallNow();

// ft_bench --worker ARGS...: the training job (ft_worker.cpp), argv after "--worker".
int ftWorker(int argc, char** argv);

// How a node is lost.
enum class Loss {
  kNone,
  kKill,  // every process of its namespace SIGKILLed: agent, workers, sshd
  kDrop,  // its traffic silently dropped (nft, both directions of its interface)
};
const char* lossName(Loss loss);

// A cluster of `nodes` network namespaces (scripts/netns-cluster.sh), brought up and down by the
// driver; each failure run gets a fresh one, since a killed node never comes back.
class SimCluster {
 public:
  SimCluster(std::string script, std::string name, int nodes);
  ~SimCluster();
  SimCluster(const SimCluster&) = delete;
  SimCluster& operator=(const SimCluster&) = delete;

  // Throws with the script's output when it fails.
  void up();
  void down();
  // Loses node k now; returns the time (wallNow()) the loss took effect.
  double lose(int k, Loss loss) const;

  const std::string& hostList() const { return hostList_; }
  const std::string& sshConfig() const { return sshConfig_; }
  const std::string& endpoint() const { return endpoint_; }  // launch's store on the bridge
  const std::string& workDir() const { return workDir_; }    // same path, private per host

 private:
  std::string script_;
  std::string name_;
  int nodes_;
  bool isUp_ = false;
  std::string hostList_;
  std::string sshConfig_;
  std::string endpoint_;
  std::string workDir_;
};

// One line of a job's output: when the driver read it (wallNow()) and from which stream.
struct Line {
  double t = 0;
  bool err = false;
  std::string text;
};

// What the driver asks of a job: its command line, and, for a failure run, whom to lose when.
struct JobSpec {
  std::vector<std::string> argv;
  Loss loss = Loss::kNone;
  int node = 2;           // the node to lose
  int64_t loseAfter = 0;  // ... once rank 0 committed this step
  double loseDelay = 0;   // ... and this many seconds passed after it
  double timeoutSeconds = 120;
};

struct JobRun {
  std::vector<Line> lines;
  int exitCode = -1;  // launch's; -1 when killed at the timeout
  double started = 0;
  double ended = 0;
  double lostAt = 0;  // when the node was lost; 0: never
};

// Runs launch with `spec` to its end (or its timeout), reading every line as it comes.
JobRun runJob(const JobSpec& spec, SimCluster& cluster);

// The value after "key=" in `text` (up to a space), or -1 when absent.
double field(const std::string& text, const std::string& key);

}  // namespace dtrain::bench
