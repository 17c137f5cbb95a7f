#pragma once
// The agent <-> master protocol of a multi-node job, on the job's store: key names, the records
// agents and the master exchange (JSON), and the pure decisions (rank assignment, heartbeat
// bookkeeping). The Coordinator (coordinator.h) and the agent (agent.h) do the I/O.
// See Note [Rendezvous protocol]; docs/design.md describes it for other tools.

#include <chrono>
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
//   launch/heartbeat/<node>        agent: a counter it increments every --heartbeat-interval
//   launch/end                     master: {"code": N, "message": "..."} -- every agent exits N
//   launch/ended/<node>            agent: it read launch/end (the master waits, bounded, for the
//                                  nodes that joined before its store may go)
//   round<R>/launch/join/<node>    agent: JoinInfo (host, address, workers, versions)
//   round<R>/launch/plan           master: RoundPlan (who is in the round, ranks, MASTER_ADDR/PORT)
//   round<R>/launch/stop           first writer wins (compareSet): why the round is stopping (a
//                                  worker failed on node N, node N went silent, a signal); the
//                                  master writes it before its decision when nobody did ("round R
//                                  is over"), so every agent's heartbeat thread stops waiting on
//                                  it at once
//   round<R>/launch/result/<node>  agent: its workers' outcomes after the round, for the report
//   round<R>/launch/decision       master: "restart" or "end <code>"
//   round<R>/launch/ack/<node>     agent: it read the decision; after the last one the master
//                                  waits (bounded) for these before its store may go
// <node> is the node's id: its index in the host list (fan-out) or its --node-rank (manual), so
// node ranks stay stable across restarts. An agent that is not in a round's plan (elastic: it
// came late) waits for the next round. Heartbeats are judged on the master's clock only: a node
// is silent when its counter has not changed for --heartbeat-timeout seconds, so clocks of
// different nodes never need to agree.

constexpr int kProtocolVersion = 2;

namespace keys {
std::string heartbeat(const std::string& node);
std::string end();
std::string endAck(const std::string& node);
std::string join(int round, const std::string& node);
std::string plan(int round);
std::string stop(int round);
std::string result(int round, const std::string& node);
std::string decision(int round);
std::string ack(int round, const std::string& node);
}  // namespace keys

struct JoinInfo {
  std::string node;           // node id
  int requestedRank = 0;      // host-list index or --node-rank
  std::string host;           // its host name
  std::string label;          // as the host list names it (fan-out), else the host name
  std::string address;        // its address toward the store: MASTER_ADDR when it is node 0
  int localWorldSize = 1;
  std::vector<int> gpus;      // CUDA_VISIBLE_DEVICES slots, empty: inherited
  std::string launchVersion;
  int protocolVersion = kProtocolVersion;
  // A problem that keeps this node from running (its program is missing, no usable interface):
  // the master ends the job with errorCode, naming the node.
  std::string error;
  int errorCode = 0;
};

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
  const PlannedNode* find(const std::string& node) const;
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
  // Starts watching `node` at `now` (a node is given the full timeout from here).
  void watch(const std::string& node, Clock::time_point now);
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
