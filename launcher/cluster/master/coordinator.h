#pragma once
// The master's side of a multi-node job: runs in the launch that hosts the store (the fan-out
// master, or node rank 0 of a manual job). Per round it gathers the agents' joins (bounded by
// --rdzv-timeout; elastic MIN:MAX goes on with the nodes that came, not waiting for nodes known
// lost), refuses a version mismatch, publishes the plan (ranks, world size, MASTER_ADDR/PORT),
// watches heartbeats and results, stops the round on the first failure anywhere -- or to grow an
// elastic job when a node waits to join -- then decides: restart while the budget lasts (growth
// is free), or end, printing the whole job's root-cause report with the host of every worker.
// It reads every node's keys in one request and sleeps on one counter between looks; see
// Note [Coordinator loop] and Note [Rendezvous protocol] in rendezvous.h.

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dtrain/base/store.h"
#include "launcher/cluster/master/node_loss.h"
#include "launcher/cluster/protocol/rendezvous.h"
#include "launcher/supervisor/job_observer.h"

namespace dtrain::launcher {

// Note [Coordinator loop]
// ~~~~~~~~~~~~~~~~~~~~~~~
// The coordinator never polls per node. Its one wait is waitChanged on launch/events, the counter
// every agent bumps after a join, a result or a stop: the last join (or result) of a round wakes
// it at once. When the counter moved it reads what it needs of every node in one tryMultiGet (the
// joins of the round; the results of the nodes still running, the joins of the next round -- a
// node waiting to join -- and the stop key). Every heartbeat-read period (500 ms, or a quarter of
// --heartbeat-timeout when that is shorter) it reads every watched node's heartbeat counter, again
// in one request, so a silent node is named within the timeout + one period. Its wait is cut at
// kTick (100 ms) for what happens in this process: a signal, a fan-out session's end, a stall
// stop. Steady state, a round of N nodes costs the master about 12 requests a second whatever N.

struct ExpectedNode {
  std::string node;   // node id
  std::string label;  // how the user names it (host list entry, or "node rank R")
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
  // A lost node of the running round: restart, or go on without it (Note [Node loss] in
  // node_loss.h), at most maxReforms times per reformWindow seconds.
  OnNodeLoss onNodeLoss = OnNodeLoss::Restart;
  // A node waiting to join below maxNodes: restart the round with it, or take it into the
  // running round (Note [Joining a running round] in node_loss.h).
  OnNodeJoin onNodeJoin = OnNodeJoin::Restart;
  int maxReforms = kDefaultMaxReforms;
  double reformWindow = kDefaultReformWindowSeconds;
  // The node whose loss takes the store and this coordinator with it (node rank 0 of a manual
  // job); empty when this launch hosts them apart from every node (fan-out).
  std::string storeNode;
  int masterPort = 0;
  std::string runId;
  JoinInfo self;           // the master's host and versions, for the version check
  std::string storeWhere;  // "10.0.0.1:29400", for messages
  std::string logHint;
  // The master starts lost nodes' agents again before a restart (fan-out): then they are waited
  // for as any other node; else (manual) a lost node is not waited for by an elastic job.
  bool startsAgents = false;
  // Called on the coordinator's thread when takeGoneNodes() has nodes to start again.
  std::function<void()> wake;
  // Told of each round (its world size) and of its teardown: the master's monitor, which may
  // stop the job through JobControl (--stall-action stop). May be null.
  JobObserver* observer = nullptr;
  // The store server's request counts so far (heartbeats, monitoring, the rest), logged every
  // kStoreLoadSeconds at DTRAIN_VERBOSE=1; null: not logged.
  std::function<std::vector<uint64_t>()> storeRequests;
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
  // Nodes whose agents are gone, for the master to start again before the next round (their
  // claims are released already).
  std::vector<std::string> takeGoneNodes();
  // Nodes lost (silent, or their agent gone) in the last round and not started again: the master
  // does not wait for their sessions at the end.
  std::set<std::string> lostNodes();

 private:
  using Clock = std::chrono::steady_clock;
  struct Gone {
    std::string node;
    std::string why;
  };
  // What the coordinator knows of a node across rounds (its own thread only).
  struct NodeState {
    bool lost = false;       // silent or gone, and not heard from since: elastic does not wait
    bool gone = false;       // its agent ended for sure: this rendezvous cannot expect it
    std::string why;         // why it is lost
    std::string staleNonce;  // the agent that was lost: a join of its is not taken again
  };
  struct Gathering;
  struct RoundWatch;

  // --- coordinator.cpp: the rounds, the decisions, the shared looks at the store -------------
  void setPhase(int round, JobPhase::Kind kind, const RoundPlan* plan = nullptr);
  // Sleeps until launch/events moves (true) or `until`, at most kTick.
  bool awaitEvents(Clock::time_point until);
  // Every heartbeat-read period: every watched node's counter in one request -- and `alsoKey`
  // when given (a re-form's formed counter), its value into *also. The nodes silent for
  // --heartbeat-timeout, with how long; they are no longer watched.
  std::vector<std::pair<std::string, double>> readHeartbeats(
      Clock::time_point now, const std::string& alsoKey = "",
      std::optional<store::Bytes>* also = nullptr);
  // The joins of round `round` there now of `nodes`, leaving out those of a lost agent.
  std::map<std::string, JoinInfo> readJoins(int round, const std::vector<std::string>& nodes);
  void markLost(const std::string& node, const std::string& why, const std::string& nonce,
                bool gone);
  const ExpectedNode* expected(const std::string& node) const;
  // Logs the store's request counts so far: every kStoreLoadSeconds, or now with `when` (a round
  // planned, stopped, decided) -- what the scale benchmark reads.
  void logStoreLoad(Clock::time_point now, const std::string& when = "");
  // Ends the job with `code` (launch/end), then waits (bounded) until the nodes of `awaitAcks`
  // acknowledged it.
  int end(int code, const std::string& message, const std::vector<std::string>& awaitAcks);
  // Waits until every key of `acks` is there, at most --heartbeat-timeout (10 s at most).
  void awaitAcknowledgements(const std::vector<std::string>& acks, const std::string& what);
  // Writes round `round`'s decision ("restart" / "end <code>"), its stop key first; then waits
  // (bounded) until the nodes of `awaitAcks` acknowledged it.
  void decide(int round, const std::string& decision, const std::vector<std::string>& awaitAcks);
  // After a failed round with restarts left: the nodes lost in it are to be started again.
  void restartLostNodes();
  // Gone events not seen yet (each is seen once: by the rendezvous or by the round it ends).
  std::vector<Gone> goneSince();

  // --- coordinator_rendezvous.cpp ---------------------------------------------------------------
  // The rendezvous of round `round`: the joins, or none when the job ended (*endCode).
  std::vector<JoinInfo> gatherJoins(int round, int* endCode);
  // One look at the rendezvous; true once it is over (complete, or the job ended: g.endCode).
  bool rendezvousStep(Gathering& g, bool eventsMoved);
  // Takes the joins that came; true when one ends the job (a version mismatch, a node that
  // cannot run).
  bool takeJoins(Gathering& g);
  // True when the joins so far decide the rendezvous: enough nodes (all, or -- elastic -- the
  // minimum once the rest are lost or the timeout passed), or too few ever to be enough.
  bool rendezvousDecided(Gathering& g);
  // "node 0 (a), node 2 (c)": the joined nodes, or the others -- with why, when they are lost.
  std::string listing(const Gathering& g, bool joinedOnes) const;

  // --- coordinator_round.cpp -------------------------------------------------------------------
  // `reported`: the nodes that reported their workers' outcomes (the others were lost);
  // `waiting`: nodes that joined the next round meanwhile.
  AttemptResult superviseRound(const RoundPlan& plan, const std::map<std::string, JoinInfo>& joins,
                               std::vector<std::string>* reported,
                               std::vector<std::string>* waiting, std::string* growth);
  // One look at the running round; true once every node reported or is lost.
  bool roundStep(RoundWatch& w, bool eventsMoved);
  // A deadline stop (stopForDeadline) or a signal to the master: stops the round.
  void noteStopRequests(RoundWatch& w);
  // Nodes gone and silent: a lost node of the round stops it; a waiting one is dropped.
  void noteLostNodes(RoundWatch& w, Clock::time_point now);
  // Results, the next round's joins, the stop key: one request.
  void readRoundKeys(RoundWatch& w, Clock::time_point now);
  // A node waits to join and the job may grow: stop the round to take it in, or under
  // --on-node-join live take it into the running round (admitLive).
  void growIfWaiting(RoundWatch& w);
  void admitLive(RoundWatch& w);
  // Under --on-node-join live, when the master starts the agents (fan-out): a left-out node's
  // agent is started again every --heartbeat-timeout once its session has ended, until the node
  // is taken back in (Note [Joining a running round]). `sessionEnded`: its session is gone already.
  void planRejoin(RoundWatch& w, const std::string& node, bool sessionEnded);
  double rejoinPeriod() const;  // --heartbeat-timeout, at least 1 s
  void startLeftOutAgain(RoundWatch& w, Clock::time_point now);
  // A left-out node of the round taken in again: its old workers go to the report as Lost, its
  // records are cleared; returns its index in the round's plan.
  int retire(RoundWatch& w, const std::string& node);
  void noteDead(RoundWatch& w, const std::string& node, const std::string& why, bool deadline);
  // Note [Node loss]: node `node` of the running round is lost (`cause`, for the epoch's why).
  // True when the round goes on without it (the next epoch is written); false when the caller
  // stops the round as under --on-node-loss restart (the one line saying why is printed).
  bool goOnWithout(RoundWatch& w, const std::string& node, LossKind kind, const std::string& cause);
  // Note [Joining a running round]: a loss while a join is pending cancels the join (its ready
  // counter); true when it was cancelled -- the members' epoch is the round's again and the
  // newcomers wait to be taken in again (admitLive) -- false when every newcomer had counted
  // ready: the join took effect and a loss now is one during a re-form.
  bool cancelJoin(RoundWatch& w, const std::string& cause);
  // A re-form in progress: complete once its formed counter reached the epoch's world size;
  // not complete within --heartbeat-timeout + 30 s: the round stops (restart path).
  void followReform(RoundWatch& w, Clock::time_point now);
  // The round's outcome, every worker with its host; a lost node's workers are Lost.
  AttemptResult roundOutcome(const RoundWatch& w, std::vector<std::string>* reported);
  // Writes round `round`'s stop key unless someone did; true when `why` is the one written.
  bool stopRound(int round, const std::string& why);

  std::shared_ptr<store::Store> store_;
  CoordinatorOptions options_;
  const std::chrono::milliseconds heartbeatRead_;
  std::atomic<int> signal_{0};
  std::mutex mutex_;
  std::string deadline_;    // guarded by mutex_: stopForDeadline's reason, taken per round
  std::vector<Gone> gone_;  // guarded by mutex_; append-only
  size_t goneSeen_ = 0;     // guarded by mutex_
  std::vector<std::string> goneToRestart_;            // guarded by mutex_
  std::vector<std::string> goneToRestartCandidates_;  // lost in this round; guarded by mutex_
  std::set<std::string> lost_;                        // guarded by mutex_

  // The coordinator's thread only.
  std::map<std::string, NodeState> nodes_;
  HeartbeatTracker tracker_;
  Clock::time_point nextHeartbeatRead_{};
  store::Bytes eventsSeen_;
  int restartsUsed_ = 0;
  std::vector<Clock::time_point> reforms_;  // when each re-form of the job began
  std::string stopWritten_;                 // the last stop key this coordinator wrote
  // Each node a round went on without, for the last words of a job that ends 0.
  std::vector<std::string> leftOut_;
  Clock::time_point nextStoreLog_{};
};

}  // namespace dtrain::launcher
