#pragma once
// Monitor: watches a running job from launch -- samples this node's workers, memory, GPUs,
// network and disks (node_sampler.h), reads every rank's progress (and its trainer's metrics
// records) from the job's store, and from that writes --metrics-file and --tensorboard-dir,
// serves --metrics-port, prints the --status-interval line, the memory and idle-GPU warnings,
// and the stall report (--stall-timeout), stopping the job with exit 124 when --stall-action
// stop says so. One thread of its own; the supervisor only tells it what starts and ends
// (JobObserver).
//
// Multi-node: every node's launch samples its own node and runs the memory and GPU warnings for
// it; the master aggregates. See Note [Monitor roles].

#include <sys/types.h>

#include <condition_variable>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/base/metrics.h"
#include "dtrain/base/progress.h"
#include "dtrain/base/store.h"
#include "dtrain/base/tensorboard.h"
#include "launcher/config/monitor_options.h"
#include "launcher/monitor/gpu_sampler.h"
#include "launcher/monitor/job_view.h"
#include "launcher/monitor/native_stack.h"
#include "launcher/monitor/node_sampler.h"
#include "launcher/monitor/process_sampler.h"
#include "launcher/monitor/records.h"
#include "launcher/monitor/stall_detector.h"
#include "launcher/monitor/watches.h"
#include "launcher/supervisor/job_observer.h"

namespace dtrain::launcher::monitor {

// Note [Monitor roles]
// ~~~~~~~~~~~~~~~~~~~~
// A Monitor samples a node, aggregates the job, or both:
//   - one node (launch alone): both -- it samples its workers and serves, writes and judges
//     everything itself;
//   - a multi-node agent: samples its node, prints the memory and idle-GPU warnings for it (its
//     output reaches the master's console), writes its records to monitor/node/<N> each
//     interval and answers the master's requests for native stacks of its stuck ranks;
//   - the multi-node master: aggregates -- reads every rank's progress and every node's records
//     from the store, serves --metrics-port, writes --metrics-file, prints the status line and
//     the stall report (asking the agents for stacks) and stops the job through JobControl.
// Keys: Note [Monitoring keys] in dtrain/base/progress.h; the protocol:
// launcher/monitor/cluster_keys.h.

struct MonitorContext {
  std::string runId;
  std::string node;  // this node's name: the `node` label, and in messages
  int nodeRank = 0;
  int numNodes = 1;
  bool samplesNode = true;  // see Note [Monitor roles]
  bool aggregates = true;
  int localWorldSize = 1;
  int worldSize = 1;
  int maxRestarts = 0;
  double heartbeatTimeout = 0;  // the multi-node master's --heartbeat-timeout; 0: none
  // The job's store, to read the ranks' progress (launch hosts it).
  std::string storeHost;
  int storePort = 0;
  std::string storeToken;
  // How the user spelled an option ("stall-timeout" -> "--stall-timeout"), for messages.
  std::function<std::string(const std::string&)> label = [](const std::string& o) {
    return "--" + o;
  };
  GpuSourceOptions gpu;
  // The node's network, disk and scheduler figures (a node's sampler only).
  NodeFigureOptions nodeFigures;
  NativeStackOptions stacks;
  MemoryWatchOptions memory;
  GpuIdleOptions gpuIdle;
};

class Monitor : public JobObserver {
 public:
  // Binds the endpoint and opens the metrics file and the TensorBoard event file, so a busy port,
  // an unwritable file or a directory another writer holds is a usage error before any worker
  // starts (InvalidArgument). Starts nothing else.
  Monitor(MonitorOptions options, MonitorContext context);
  ~Monitor() override;
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  // Starts the monitor thread; `control` receives --stall-action stop.
  void start(JobControl* control);
  // Ends the thread. A last sample is not taken, but the ranks' last reports are read, so that
  // their final records (an evaluation at the end) reach the file. Idempotent.
  void stop();

  int metricsPort() const { return endpoint_ ? endpoint_->port() : -1; }

  // JobObserver (the supervisor's thread).
  void attemptStarted(int attempt, int worldSize) override;
  void workerStarted(int rank, int localRank, pid_t pid) override;
  void workerEnded(int rank) override;
  void teardownStarted() override;
  void attemptEnded(int attempt) override;

 private:
  void threadMain();
  void tick(double now);
  bool connectStore();
  // `final`: the job has ended, so trainer records of a rank whose node is still unknown are
  // written with the best name there is rather than kept for later.
  void pollStore(double now, bool final = false);
  // pollStore's steps: the ranks' progress reports; the agents' records of their nodes (a job
  // of several nodes); the trainers' records, into the file and the endpoint.
  void readProgress(double now);
  void readAgentRecords(double now);
  void writeTrainerRecords(bool final);
  std::optional<std::string> nodeOf(int rank, const progress::RankReport& report,
                                    const std::map<int, std::string>& nodeOfRank) const;
  void sample(double now);
  void answerStackRequest();
  void checkStall(double now);
  std::map<int, std::string> stacksOf(const std::vector<int>& ranks);
  void writeRecords(const std::vector<Record>& records);
  void say(const std::string& text);

  const MonitorOptions options_;
  const MonitorContext context_;
  std::unique_ptr<metrics::PrometheusServer> endpoint_;
  int metricsFd_ = -1;
  std::shared_ptr<metrics::TensorBoardSink> tensorboard_;  // --tensorboard-dir
  JobControl* control_ = nullptr;

  // Shared with the supervisor's thread.
  std::mutex mutex_;
  std::condition_variable wake_;          // with mutex_: stop
  bool stopping_ = false;                 // guarded by mutex_
  int attempt_ = 0;                       // guarded by mutex_
  int worldSize_ = 0;                     // guarded by mutex_
  bool attemptChanged_ = false;           // guarded by mutex_
  bool tearingDown_ = false;              // guarded by mutex_
  std::map<int, WorkerProcess> workers_;  // guarded by mutex_: live workers by rank
  bool workersChanged_ = false;           // guarded by mutex_
  std::vector<int> ended_;                // guarded by mutex_: ranks ended since the last tick

  // Monitor thread only.
  std::thread thread_;
  ProcessSampler sampler_;
  NodeFigureSampler nodeFigures_;
  std::unique_ptr<GpuSource> gpu_;
  bool gpuOpened_ = false;
  MemoryWatch memory_;
  GpuIdleWatch gpuIdle_;
  StallDetector stall_;
  std::shared_ptr<store::Store> store_;  // the current round's view
  bool storeUsable_ = true;              // false after it failed once: no more tries
  int64_t lastVersion_ = -1;
  std::map<int, progress::RankReport> reports_;  // this attempt's latest, by rank
  std::map<int, uint64_t> recordsWritten_;       // rank -> its last trainer record in the file
  std::map<int, uint64_t> recordsMissed_;        // rank -> trainer records the file misses
  std::map<int, std::string> nodeNames_;         // node rank -> its name (the agents' records)
  std::map<int, double> nodeRecordTimes_;        // remote node -> time of its records last written
  int64_t stacksAnswered_ = 0;                   // agent: the last stack request answered
  int currentAttempt_ = 0;
  int currentWorldSize_ = 0;
  bool currentTearingDown_ = false;
  std::map<int, WorkerProcess> currentWorkers_;
  double nextSample_ = 0;
  double nextStatus_ = 0;
  NodeSample lastNode_;
  double workersSince_ = -1;  // when workers ran with no report yet (steady seconds); -1: not so
  bool toldSilent_ = false;   // the "no rank publishes progress" note was printed
  std::vector<int> stalledRanks_;  // those the current stall's report blames

  // What a scrape answers (thread-safe itself).
  JobView view_;
};

}  // namespace dtrain::launcher::monitor
