#pragma once
// The master's side of a multi-node job: runs in the launch that hosts the store (the fan-out
// master, or node rank 0 of a manual job). Per round it gathers the agents' joins (bounded by
// --rdzv-timeout; elastic MIN:MAX goes on with the nodes that came), refuses a version mismatch,
// publishes the plan (ranks, world size, MASTER_ADDR/PORT), watches heartbeats and results,
// stops the round on the first failure anywhere, then decides: restart while the budget lasts,
// or end -- printing the whole job's root-cause report with the host of every worker.
// See Note [Rendezvous protocol] in rendezvous.h.

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "dtrain/store.h"
#include "launcher/rendezvous.h"

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
};

class Coordinator {
 public:
  Coordinator(std::shared_ptr<store::Store> store, CoordinatorOptions options);

  // Runs rounds until the job ends; prints the report (stderr) and returns launch's exit code,
  // which every agent also receives (launch/end).
  int run();

  // Thread-safe. The master received `signo`: stop the round (every node's workers get SIGTERM),
  // then end the job with 128+signo.
  void requestStop(int signo);
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
  std::vector<JoinInfo> gatherJoins(int round, int* endCode);
  AttemptResult superviseRound(const RoundPlan& plan);
  int end(int code, const std::string& message);
  // Gone events not seen yet (each is seen once: by the rendezvous or by the round it ends).
  std::vector<Gone> goneSince();

  std::shared_ptr<store::Store> store_;
  CoordinatorOptions options_;
  std::atomic<int> signal_{0};
  std::mutex mutex_;
  std::vector<Gone> gone_;       // guarded by mutex_; append-only
  size_t goneSeen_ = 0;          // guarded by mutex_
  std::vector<std::string> goneToRestart_;  // guarded by mutex_
  std::vector<std::string> goneToRestartCandidates_;  // lost in this round; guarded by mutex_
  std::set<std::string> lost_;                         // guarded by mutex_
};

}  // namespace dtrain::launcher
