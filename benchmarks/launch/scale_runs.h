#pragma once
// One run of launch_scale_bench (scale_bench.cpp): N simulated nodes under launch
// (testing/launcher_sim/launcher_sim.h) or under torchrun's c10d rendezvous, and what was measured.

#include <string>
#include <vector>

namespace dtrain::bench {

struct ScaleOptions {
  std::string launch;
  std::string worker;
  std::string python = DTRAIN_PYTHON;
  std::string torchrun = DTRAIN_TORCHRUN;
  double heartbeatInterval = 5;  // launch's default
  double heartbeatTimeout = 10;
  double settleSeconds = 6;   // before it: every worker's progress, every agent's first sample
  double steadySeconds = 15;  // the window the steady-state figures are taken over
  int restartSteps = 5;       // seconds the workers run after the elastic restart
  std::string keepLogs;       // a directory: every agent's output as node<K>.log, per run
};

// Seconds unless said otherwise; -1 where not measured.
struct LaunchRun {
  int nodes = 0;
  bool ok = false;
  std::string failure;
  double allStartedToPlans = -1;          // the last agent started -> every agent holds its plan
  double lastJoinToPlans = -1;            // the last join -> every agent holds its plan
  double planToWorkers = -1;              // the last plan read -> every worker started
  double rendezvousRequestsPerNode = -1;  // until round 0's plan is out, / N
  double heartbeatsPerSecond = -1;        // steady state, store requests by class
  double monitoringPerSecond = -1;
  double restPerSecond = -1;
  double masterCpu = -1;  // fractions of one core, steady state
  double storeCpu = -1;
  double agentsCpu = -1;             // every agent together (node 0's agent threads too)
  double detect = -1;                // SIGKILL of one agent -> the master names it
  double killToWorkersStopped = -1;  // the SIGKILL -> every other worker has SIGTERM
  double restart = -1;  // the master names it -> every remaining agent holds round 1's plan
  double restartRequestsPerNode = -1;  // round 0 stopped -> round 1 planned, / (N - 1)
  double exitToMaster = -1;            // the last worker done -> the master's launch exited
};

struct TorchrunRun {
  int nodes = 0;
  bool ok = false;
  std::string failure;
  double allStartedToRanks = -1;  // the last agent started -> every agent has its rank
  double lastJoinToRanks = -1;    // the last join attempt -> every agent has its rank
  double ranksToWorkers = -1;     // -> every worker started
  double cpuPerAgent = -1;        // seconds, median (its worker included)
  double rssPerAgent = -1;        // MiB, median of the largest resident set
};

LaunchRun runLaunchScale(const ScaleOptions& o, int nodes);
TorchrunRun runTorchrunScale(const ScaleOptions& o, int nodes);

}  // namespace dtrain::bench
