#pragma once
// The master's side of a multi-node job: runs in the launch that hosts the store (the fan-out
// master, or node rank 0 of a manual job). Per round it gathers the agents' joins (bounded by
// --rdzv-timeout; elastic MIN:MAX goes on with the nodes that came), refuses a version mismatch,
// publishes the plan (ranks, world size, MASTER_ADDR/PORT), watches heartbeats and results,
// stops the round on the first failure anywhere, then decides: restart while the budget lasts,
// or end -- printing the whole job's root-cause report with the host of every worker.
// See Note [Rendezvous protocol] in rendezvous.h.

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "dtrain/base/store.h"
#include "launcher/cluster/rendezvous.h"
#include "launcher/supervisor/job_observer.h"

namespace dtrain::launcher {

struct ExpectedNode {
  std::string node;       // node id
  std::string label;      // how the user names it (host list entry, or "node rank R")
  int requestedRank = 0;
};

struct CoordinatorOptions {
  std::vector<ExpectedNode> nodes;  // at most maxNodes; joins from others are ignored
  int minNodes = 1;
  int maxNodes = 1;
  double rdzvTimeout = 900;
  double heartbeatTimeout = 30;
  double gracePeriod = 30;
  int maxRestarts = 0;
  int masterPort = 0;
  std::string runId;
  JoinInfo self;               // the master's host and versions, for the version check
  std::string storeWhere;      // "10.0.0.1:29400", for messages
  std::string logHint;
  // Called on the coordinator's thread when takeGoneNodes() has nodes to start again.
  std::function<void()> wake;
  // Told of each round (its world size) and of its teardown: the master's monitor, which may
  // stop the job through JobControl (--stall-action stop). May be null.
  JobObserver* observer = nullptr;
};

class Coordinator : public JobControl {
 public:
  Coordinator(std::shared_ptr<store::Store> store, CoordinatorOptions options);

  // Runs rounds until the job ends; prints the report (stderr) and returns launch's exit code,
  // which every agent also receives (launch/end).
  int run();

  // Thread-safe. The master received `signo`: stop the round (every node's workers get SIGTERM),
  // then end the job with 128+signo.
  void requestStop(int signo);
  // Thread-safe. A deadline passed (the monitor's --stall-action stop): stop the round on every
  // node; the job ends with 124, without a restart.
  void stopForDeadline(const std::string& reason) override;
  // Thread-safe. A node's agent is gone for sure (its ssh session or process ended): a node that
  // has not joined fails the rendezvous at once instead of at the timeout; a running one stops
  // the round without waiting for its heartbeat to go quiet.
  void nodeGone(const std::string& node, const std::string& why);
  // Nodes whose agents are gone, for the master to start again before the next round.
  std::vector<std::string> takeGoneNodes();
  // Nodes lost (silent, or their agent gone) in the last round and not started again: the master
  // does not wait for their sessions at the end.
  std::set<std::string> lostNodes();

 private:
  struct Gone {
    std::string node;
    std::string why;
  };
  struct Gathering;
  struct RoundWatch;

  // The rendezvous of round `round`: the joins, or none when the job ended (*endCode).
  std::vector<JoinInfo> gatherJoins(int round, int* endCode);
  // One look at the rendezvous -- a signal, lost nodes, new joins; true once it is over
  // (complete, or the job ended: g.endCode).
  bool rendezvousStep(Gathering& g);
  // Reads the joins that came; true when one ends the job (a version mismatch, a node that
  // cannot run).
  bool readJoins(Gathering& g);
  // True when the joins so far decide the rendezvous: enough nodes (all, or -- elastic -- the
  // minimum once the rest are lost or the timeout passed), or too few ever to be enough.
  bool rendezvousDecided(Gathering& g);
  // "node 0 (a), node 2 (c)": the joined nodes, or the others -- with why, when they are lost.
  std::string listing(const Gathering& g, bool joinedOnes) const;

  // `reported`: the nodes that reported their workers' outcomes (the others were lost).
  AttemptResult superviseRound(const RoundPlan& plan, std::vector<std::string>* reported);
  // One look at the running round; true once every node reported or is lost.
  bool roundStep(RoundWatch& w);
  // A deadline stop (stopForDeadline) or a signal to the master: stops the round.
  void noteStopRequests(RoundWatch& w);
  // Results, heartbeats and nodes gone: a lost or silent node stops the round.
  void noteLostNodes(RoundWatch& w, std::chrono::steady_clock::time_point now);
  // The round's outcome, every worker with its host; a lost node's workers are Lost.
  AttemptResult roundOutcome(const RoundWatch& w, std::vector<std::string>* reported);
  // Writes round `round`'s stop key unless someone did; true when `why` is the one written.
  bool stopRound(int round, const std::string& why);
  // Ends the job with `code` (launch/end), then waits (bounded) until the nodes of `awaitAcks`
  // acknowledged it.
  int end(int code, const std::string& message, const std::vector<std::string>& awaitAcks);
  // Waits until every key of `acks` is there, at most --heartbeat-timeout (10 s at most).
  void awaitAcknowledgements(const std::vector<std::string>& acks, const std::string& what);
  // Writes round `round`'s decision ("restart" / "end <code>"), its stop key first; then waits
  // (bounded) until the nodes of `awaitAcks` acknowledged it.
  void decide(int round, const std::string& decision, const std::vector<std::string>& awaitAcks);
  // Gone events not seen yet (each is seen once: by the rendezvous or by the round it ends).
  std::vector<Gone> goneSince();

  std::shared_ptr<store::Store> store_;
  CoordinatorOptions options_;
  std::atomic<int> signal_{0};
  std::mutex mutex_;
  std::string deadline_;         // guarded by mutex_: stopForDeadline's reason, taken per round
  std::vector<Gone> gone_;       // guarded by mutex_; append-only
  size_t goneSeen_ = 0;          // guarded by mutex_
  std::vector<std::string> goneToRestart_;  // guarded by mutex_
  std::vector<std::string> goneToRestartCandidates_;  // lost in this round; guarded by mutex_
  std::set<std::string> lost_;                         // guarded by mutex_
};

}  // namespace dtrain::launcher
