#pragma once
// ft_bench's parts (benchmarks/README.md, "ft_bench"): the worker it runs under `launch`
// (ft_worker.cpp), the simulated cluster and the jobs it runs there (ft_job.cpp), what a job's
// lines say about a lost node (ft_measure.cpp), the DDP rows (ft_bench.cpp), the ZeRO rows
// (ft_zero.cpp) and a node that joins (ft_join.cpp).

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dtrain::bench {

constexpr int kNodes = 3;
constexpr int kPerNode = 2;
constexpr int kLostNode = 2;  // ranks 4 and 5; the store is on the bridge, outside every node
constexpr double kHeartbeatTimeout = 3;

// CLOCK_REALTIME in seconds: one clock for the driver and every worker in every namespace.
double wallNow();

// ft_bench --worker ARGS...: the training job (ft_worker.cpp), argv after "--worker".
int ftWorker(int argc, char** argv);

// How a node is lost -- or, kJoin, comes (ft_join.cpp).
enum class Loss {
  kNone,
  kKill,  // every process of its namespace SIGKILLed: agent, workers, sshd
  kDrop,  // its traffic silently dropped (nft, both directions of its interface)
  kJoin,  // a node's launch started while the job runs below its maximum
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
  // `argv` run on node k (its network and mount namespaces).
  std::vector<std::string> onHost(int k, std::vector<std::string> argv) const;

  const std::string& hostList() const { return hostList_; }
  const std::string& stateDir() const { return stateDir_; }
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
  std::string stateDir_;
};

// A process started in the background, its output (stdout and stderr) in `log`; reaped by
// finish(), killed past `seconds`. Its exit code, -1 when killed.
struct Background {
  pid_t pid = -1;
  std::string log;
};
Background startBackground(const std::vector<std::string>& argv, const std::string& log);
int finish(Background& b, double seconds);

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
  // Instead of losing `node`: what to do then (a node joining); returns when it took effect.
  std::function<double()> cue;
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

// ft_bench's command line (ft_bench.cpp parses it). -1: the mode's default (DDP rows, or with
// --zero the ZeRO rows: ft_zero.cpp).
struct Options {
  int runs = 10;
  int pairs = 20;
  int64_t steps = -1;
  int64_t computeMs = -1;
  int64_t saveEvery = -1;
  std::vector<Loss> kinds;  // none given: the mode's default
  unsigned seed = 43;
  bool show = false;  // every failure run's lines on stderr
  int zero = 0;       // ZeRO's stage (1, 2); 0: the DDP rows
  int64_t mirrorEvery = -1;
  int64_t blockSteps = -1;  // ZeRO, no failure: the blocks mirrored and not, in turn
  int64_t loseAfter = -1;   // ZeRO: every loss after this step (-1: at random), to look at one
  int64_t features = -1;    // the worker's MLP
  int64_t width = -1;
  int64_t depth = -1;
};

// launch's command line for one job of `o` on `c`: --on-node-loss continue or restart, the
// worker with a checkpoint every `saveEvery` steps (0: none), `steps` steps and `extra` flags.
std::vector<std::string> launchArgv(const Options& o, const SimCluster& c, bool continueMode,
                                    int64_t steps, int64_t saveEvery,
                                    const std::string& checkpointDir,
                                    const std::vector<std::string>& extra = {});

// A commit of rank 0: step, world, when.
struct Commit {
  int64_t step;
  int world;
  double t;
  double workMs;
};
std::vector<Commit> commits(const JobRun& run);

// What one failure cost: seconds from the loss unless named otherwise; -1 where not seen.
struct Failure {
  std::string problem;      // empty when the run went as it should
  double detection = -1;    // -> the master's decision line
  double out = -1;          // -> the last survivor out of its step's work
  double reformMs = -1;     // the slowest survivor's re-form, its own log's figure
  double discarded = -1;    // -> the last survivor's discard (re-formed, state settled)
  double firstAny = -1;     // -> the first step committed after the loss, whichever it is
  double firstWork = -1;    // that step's tryStep() less the compute sleep, seconds
  double first = -1;        // -> the step after the last one committed before, committed again
  double stepsLost = -1;    // steps trained and thrown away
  double secondsLost = -1;  // the stall: `first`'s commit - last commit before - one step period
  double period = -1;       // one step: the median period of the commits before the loss
  int64_t lastBefore = -1;  // the last step committed before the loss
  int64_t restored = -1;    // restart path: the step the checkpoint had
  // ZeRO: the survivors' restore from the mirrors, their log line's figures (Note [Shard
  // mirrors]): the generation rolled back to, the slowest survivor's seconds, the bytes of every
  // survivor summed and the largest.
  int64_t generation = -1;
  double restoreSeconds = -1;
  double restoreBytes = -1;
  double restoreBytesMax = -1;
};
Failure measure(const JobRun& run, bool continueMode);

// The figures of one path's runs that both tables give, each over the runs that measured it,
// and how many runs did not go as they should.
struct FailureColumn {
  std::vector<double> detection, out, reformMs, discarded, first, stepsLost, secondsLost;
  int problems = 0;
  // Adds `f`'s figures; false (counted in problems) when the run did not go as it should.
  bool add(const Failure& f);
};
// Appends `x` to `v` when it was measured (x >= 0).
void putMeasured(std::vector<double>& v, double x);

void printRaw(const char* mode, Loss kind, int run, const Failure& f);
// One side of run `r` with a loss (spec.loss): the job, the cluster brought down after it, its
// figures measured and printed raw; every line of the job with `show` or when it went wrong. The
// job's lines in `job` when given.
Failure runLoss(const JobSpec& spec, SimCluster& cluster, bool continueMode, int r, bool show,
                JobRun* job = nullptr);
// Every line of `run` on stderr, its time from the job's start.
void dumpJob(const JobRun& run);
// "median [min-max]" of `v` in `format`; "-" for none.
std::string cell(const std::vector<double>& v, const char* format = "{:.2f}");

// The ZeRO rows (ft_zero.cpp), run as root.
int runZeroBench(const Options& o);
// The join rows (ft_join.cpp), run as root: `o.runs` runs, each --on-node-join live and restart.
void runJoinBench(const Options& o, unsigned seed);

}  // namespace dtrain::bench
