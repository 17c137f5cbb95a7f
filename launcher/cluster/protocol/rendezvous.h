#pragma once
// The agent <-> master protocol of a multi-node job, on the job's store: key names, the records
// agents and the master exchange (JSON), and the pure decisions (rank assignment, heartbeat
// bookkeeping). The Coordinator (coordinator.h) and the agent (agent.h) do the I/O.
// See Note [Rendezvous protocol]; docs/design.md describes it for other tools.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/supervisor/failure_report.h"

namespace dtrain::launcher {

// Note [Rendezvous protocol]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// The master (the launch that hosts the store) is the only writer of decisions; agents write
// facts about themselves. Keys of round R live under "round<R>/launch/" (the workers' own keys of
// that round are under "round<R>/" too, so nothing crosses rounds); job-wide keys under "launch/".
//   launch/state                   master: where the job is -- "R gather", "R run" and plan R
//                                  (Note [Plan in the state]), "R decided" (decision R is
//                                  written), "end". Agents watch it (waitChanged): one key tells
//                                  every node what to do
//   launch/events                  agents: a counter, add(1) after each write the master acts on
//                                  (a join, a result, a stop); the master watches it instead of
//                                  polling every node's keys
//   launch/heartbeat/<node>        agent: a counter it increments every --heartbeat-interval; the
//                                  master reads every node's at once (tryMultiGet)
//   launch/claim/<node>            agent: {"nonce", "pid", "host"} by compareSet, "released" at
//                                  its end (see Note [Node claims])
//   launch/end                     master: {"code": N, "message": "..."} -- every agent exits N
//   launch/ended/<node>            agent: it read launch/end (the master waits, bounded, for the
//                                  nodes that joined before its store may go)
//   round<R>/launch/join/<node>    agent: JoinInfo (host, address, workers, versions, nonce)
//   round<R>/launch/plan           master: RoundPlan (who is in the round, ranks, MASTER_ADDR/PORT,
//                                  every node's host and address), for tools and people
//   round<R>/launch/stop           first writer wins (compareSet): why the round is stopping (a
//                                  worker failed on node N, node N went silent, a node waits to
//                                  join, a signal); the master writes it before its decision when
//                                  nobody did ("round R is over"), so every agent's heartbeat
//                                  thread stops waiting on it at once
//   round<R>/launch/result/<node>  agent: its workers' outcomes after the round, for the report
//   round<R>/launch/decision       master: "restart" or "end <code>"
//   round<R>/launch/ack/<node>     agent: it read the decision; after the last one the master
//                                  waits (bounded) for these before its store may go
// <node> is the node's id: its index in the host list (fan-out) or its --node-rank (manual), so
// it is stable across restarts (DTRAIN_NODE_ID). An agent joins the round launch/state names, or
// the next one when that round's plan is out: a node that comes late (elastic), or whose agent
// was started again, waits for the next round instead of replaying finished ones; the master
// sees its join while the round runs and -- below --nnodes MAX -- stops the round through the
// workers' preemption path (SIGTERM, exit 75) to grow the job, a restart not counted against
// --max-restarts. Heartbeats are judged on the master's clock only: a node is silent when its
// counter has not changed for --heartbeat-timeout seconds, so clocks of different nodes never
// need to agree; a node that joined and went silent (during the rendezvous, or while it waits to
// join) is dropped within that bound.

// Note [Node claims]
// ~~~~~~~~~~~~~~~~~~
// Two launches given the same --node-rank must not both run its ranks. Before anything else an
// agent claims its node id: compareSet(launch/claim/<node>, absent, {nonce, pid, host}). If
// another claim is there, the claimant watches that node's heartbeat counter (waitChanged) for
// --heartbeat-timeout: it moves -> the holder is alive, and the claimant exits 2 naming the node
// rank and both hosts; it stays still -> the holder is gone (killed, its host lost), and the
// claimant takes the claim over (compareSet from the holder's value), so an agent started again
// by hand gets its node back. An agent releases its claim when it ends; a fan-out master
// releases a lost node's claim before it starts that node's agent again.

// Protocol 4: launch/state, launch/events, launch/claim and the join's nonce; the master reads
// heartbeats, joins and results with tryMultiGet and waits with waitChanged (store opcodes 9, 10);
// since 4 the "run" state carries the plan (Note [Plan in the state]).
constexpr int kProtocolVersion = 4;

namespace keys {
std::string state();
std::string events();
std::string heartbeat(const std::string& node);
std::string claim(const std::string& node);
std::string end();
std::string endAck(const std::string& node);
std::string join(int round, const std::string& node);
std::string plan(int round);
std::string stop(int round);
std::string result(int round, const std::string& node);
std::string decision(int round);
std::string ack(int round, const std::string& node);
}  // namespace keys

// The round's keys of Note [Membership epochs] (runtime/base/membership.h), with the round's
// prefix ("round<R>/..."): the master writes the epoch, the workers add to its counters, and an
// agent reads it to learn whether the round went on without its node (Note [Left out of a
// running round] in agent.cpp).
std::string epochStoreKey(int round);
std::string formedStoreKey(int round, int epoch);
std::string readyStoreKey(int round, int epoch);

// The class of a request on the job's store by its first key, for the store's counts: 0 the
// agents' heartbeats, 1 monitoring (the ranks' progress, the nodes' samples and stacks: every
// key under "monitor/" of a round), 2 the rest (rendezvous, rounds, the workers' own keys).
enum StoreRequestClass : size_t {
  kHeartbeatRequests = 0,
  kMonitoringRequests = 1,
  kOtherRequests = 2
};
constexpr size_t kStoreRequestClasses = 3;
size_t storeRequestClass(const std::string& key);

struct PlannedNode {
  std::string node;
  int nodeRank = 0;
  int rankOffset = 0;
  int localWorldSize = 1;
  std::string host;
  std::string label;
  std::string address;
};

struct RoundPlan {
  int round = 0;
  std::string runId;
  int worldSize = 0;
  std::string masterAddr;
  int masterPort = 0;
  std::vector<PlannedNode> nodes;  // in node-rank order
  // > 0 (launch/state only): the plan as membership epoch `epoch` of the running round sees it,
  // written when a node was taken in live (Note [Joining a running round] in
  // launcher/cluster/master/node_loss.h).
  int epoch = 0;
  const PlannedNode* find(const std::string& node) const;
};

// launch/state. Note [Plan in the state]: "R run" carries round R's plan after a newline, every
// field but the nodes' host, label and address (what an agent needs to start its workers), so
// the answer to an agent's waitChanged is all it reads to start: one wake-up and no second
// request, which is what 256 agents woken at once on a loaded machine wait for. The full plan is
// round<R>/launch/plan, for tools and people.
struct JobPhase {
  enum Kind { Gather = 0, Run = 1, Decided = 2, Ended = 3 };
  int round = 0;
  Kind kind = Gather;
  std::optional<RoundPlan> plan;  // kind == Run: the round's plan as the state carries it
  // At or past round `r`'s phase `k` (an ended job is past everything).
  bool reached(int r, Kind k) const {
    return kind == Ended || round > r || (round == r && kind >= k);
  }
};
std::string encodePhase(const JobPhase& p);
// Absent or malformed: round 0, gathering. A "run" state whose plan is malformed throws Error
// (the master writes it; every node runs the same launch version).
JobPhase decodePhase(const std::string& text);

// launch/claim/<node>.
struct NodeClaim {
  std::string nonce;
  int64_t pid = 0;
  std::string host;
};
constexpr const char* kReleasedClaim = "released";
std::string encodeClaim(const NodeClaim& c);
// A value that is not a claim (released, malformed) has an empty nonce.
NodeClaim decodeClaim(const std::string& text);

struct JoinInfo {
  std::string node;       // node id
  int requestedRank = 0;  // host-list index or --node-rank
  std::string host;       // its host name
  std::string label;      // as the host list names it (fan-out), else the host name
  std::string address;    // its address toward the store: MASTER_ADDR when it is node 0
  int localWorldSize = 1;
  std::vector<int> gpus;  // CUDA_VISIBLE_DEVICES slots, empty: inherited
  std::string launchVersion;
  int protocolVersion = kProtocolVersion;
  std::string nonce;  // its agent's claim (Note [Node claims]): which agent wrote it
  // A problem that keeps this node from running (its program is missing, no usable interface):
  // the master ends the job with errorCode, naming the node.
  std::string error;
  int errorCode = 0;
};

std::string encodeJoin(const JoinInfo& j);
JoinInfo decodeJoin(const std::string& text);
std::string encodePlan(const RoundPlan& p);
RoundPlan decodePlan(const std::string& text);
// An agent's outcome of one round; stderr tails and messages survive any bytes.
std::string encodeResult(const AttemptResult& r);
AttemptResult decodeResult(const std::string& text);
std::string encodeEnd(int code, const std::string& message);
std::pair<int, std::string> decodeEnd(const std::string& text);

// Pure: the round's plan from the joins (any order). Node ranks follow requestedRank; at most
// maxNodes are taken (the lowest requested ranks); global ranks are prefix sums of the workers;
// MASTER_ADDR is node rank 0's address.
RoundPlan assignRanks(int round, std::vector<JoinInfo> joins, int maxNodes, int masterPort);

// A version mismatch between `mine` (the master's) and `j`, as a message naming both versions and
// both hosts; empty when they agree.
std::string versionMismatch(const JoinInfo& mine, const JoinInfo& j);

// Heartbeat bookkeeping on one clock: a node is silent once its counter has not changed for
// `timeout`. Pure, so tests feed it times.
class HeartbeatTracker {
 public:
  using Clock = std::chrono::steady_clock;
  explicit HeartbeatTracker(std::chrono::milliseconds timeout) : timeout_(timeout) {}
  // Starts watching `node` at `now` (a node is given the full timeout from here); a node watched
  // already keeps what was seen of it.
  void watch(const std::string& node, Clock::time_point now);
  bool watching(const std::string& node) const { return nodes_.count(node) != 0; }
  // The nodes watched, in order.
  std::vector<std::string> nodes() const;
  void forget(const std::string& node);
  // A value read from the node's heartbeat key (nullopt: the key is absent).
  void observe(const std::string& node, const std::optional<std::string>& value,
               Clock::time_point now);
  // Nodes silent at `now`, with how long.
  std::vector<std::pair<std::string, double>> silent(Clock::time_point now) const;

 private:
  struct Entry {
    std::optional<std::string> value;
    Clock::time_point changed;
  };
  std::chrono::milliseconds timeout_;
  std::map<std::string, Entry> nodes_;
};

}  // namespace dtrain::launcher
