#include "launcher/cluster/protocol/rendezvous.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dtrain/base/error.h"
#include "membership.h"
#include "parse_int.h"

namespace dtrain::launcher {

using nlohmann::json;

namespace keys {
std::string state() { return "launch/state"; }
std::string events() { return "launch/events"; }
std::string heartbeat(const std::string& node) { return "launch/heartbeat/" + node; }
std::string claim(const std::string& node) { return "launch/claim/" + node; }
std::string end() { return "launch/end"; }
std::string endAck(const std::string& node) { return "launch/ended/" + node; }
std::string join(int round, const std::string& node) {
  return fmt::format("round{}/launch/join/{}", round, node);
}
std::string plan(int round) { return fmt::format("round{}/launch/plan", round); }
std::string stop(int round) { return fmt::format("round{}/launch/stop", round); }
std::string result(int round, const std::string& node) {
  return fmt::format("round{}/launch/result/{}", round, node);
}
std::string decision(int round) { return fmt::format("round{}/launch/decision", round); }
std::string ack(int round, const std::string& node) {
  return fmt::format("round{}/launch/ack/{}", round, node);
}
}  // namespace keys

std::string epochStoreKey(int round) {
  return fmt::format("round{}/{}", round, membership::epochKey());
}

std::string formedStoreKey(int round, int epoch) {
  return fmt::format("round{}/{}", round, membership::formedKey(epoch));
}

std::string readyStoreKey(int round, int epoch) {
  return fmt::format("round{}/{}", round, membership::readyKey(epoch));
}

namespace {

// Stderr lines and messages may hold any bytes: invalid UTF-8 becomes U+FFFD, never an exception.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json parse(const std::string& text, const char* what) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    DTRAIN_THROW(Error,
                 "launch: malformed {} record on the store ({}); HINT: every node must run "
                 "the same launch version",
                 what, e.what());
  }
}

template <typename T>
T field(const json& j, const char* name, const char* what) {
  try {
    return j.at(name).get<T>();
  } catch (const json::exception& e) {
    DTRAIN_THROW(Error, "launch: {} record lacks a valid \"{}\" ({})", what, name, e.what());
  }
}

// What the full plan and the plan in launch/state share: run id, world size, MASTER_ADDR/PORT.
json planHeader(const RoundPlan& p) {
  json v = {{"run_id", p.runId},
            {"world_size", p.worldSize},
            {"master_addr", p.masterAddr},
            {"master_port", p.masterPort}};
  if (p.epoch > 0) v["epoch"] = p.epoch;
  return v;
}

void readPlanHeader(const json& v, const char* what, RoundPlan* p) {
  p->runId = field<std::string>(v, "run_id", what);
  p->worldSize = field<int>(v, "world_size", what);
  p->masterAddr = field<std::string>(v, "master_addr", what);
  p->masterPort = field<int>(v, "master_port", what);
  if (v.contains("epoch")) p->epoch = field<int>(v, "epoch", what);
}

}  // namespace

const PlannedNode* RoundPlan::find(const std::string& node) const {
  for (const auto& n : nodes) {
    if (n.node == node) return &n;
  }
  return nullptr;
}

size_t storeRequestClass(const std::string& key) {
  static const std::string kHeartbeat = keys::heartbeat("");
  if (key.compare(0, kHeartbeat.size(), kHeartbeat) == 0) return kHeartbeatRequests;
  // "round<N>/monitor/...", or "monitor/..." in a store without rounds.
  size_t at = 0;
  if (key.compare(0, 5, "round") == 0) {
    at = key.find('/');
    if (at == std::string::npos) return kOtherRequests;
    ++at;
  }
  return key.compare(at, 8, "monitor/") == 0 ? kMonitoringRequests : kOtherRequests;
}

std::string encodePhase(const JobPhase& p) {
  static const char* const kNames[] = {"gather", "run", "decided"};
  if (p.kind == JobPhase::Ended) return "end";
  std::string text = fmt::format("{} {}", p.round, kNames[p.kind]);
  if (p.kind == JobPhase::Run && p.plan) {
    // Note [Plan in the state]: the nodes as [node, node_rank, rank_offset, local_world_size].
    json nodes = json::array();
    for (const auto& n : p.plan->nodes) {
      nodes.push_back(json::array({n.node, n.nodeRank, n.rankOffset, n.localWorldSize}));
    }
    json v = planHeader(*p.plan);
    v["nodes"] = std::move(nodes);
    text += '\n';
    text += dump(v);
  }
  return text;
}

JobPhase decodePhase(const std::string& text) {
  JobPhase p;
  if (text == "end") {
    p.kind = JobPhase::Ended;
    return p;
  }
  const size_t newline = text.find('\n');
  const std::string head = text.substr(0, newline);
  const size_t space = head.find(' ');
  int64_t round = 0;
  if (space == std::string::npos || !parseInt64(head.substr(0, space), &round) || round < 0 ||
      round > (1 << 30)) {
    return p;
  }
  p.round = static_cast<int>(round);
  const std::string kind = head.substr(space + 1);
  p.kind = kind == "run" ? JobPhase::Run : kind == "decided" ? JobPhase::Decided : JobPhase::Gather;
  if (p.kind != JobPhase::Run || newline == std::string::npos) return p;
  const json v = parse(text.substr(newline + 1), "launch/state plan");
  RoundPlan& plan = p.plan.emplace();
  plan.round = p.round;
  readPlanHeader(v, "launch/state plan", &plan);
  for (const auto& n : field<json>(v, "nodes", "launch/state plan")) {
    if (!n.is_array() || n.size() != 4 || !n[0].is_string() || !n[1].is_number_integer() ||
        !n[2].is_number_integer() || !n[3].is_number_integer()) {
      DTRAIN_THROW(Error,
                   "launch: launch/state plan record has a malformed node entry ({}); "
                   "HINT: every node must run the same launch version",
                   dump(n));
    }
    PlannedNode pn;
    pn.node = n[0].get<std::string>();
    pn.nodeRank = n[1].get<int>();
    pn.rankOffset = n[2].get<int>();
    pn.localWorldSize = n[3].get<int>();
    plan.nodes.push_back(std::move(pn));
  }
  return p;
}

std::string encodeClaim(const NodeClaim& c) {
  return dump({{"nonce", c.nonce}, {"pid", c.pid}, {"host", c.host}});
}

NodeClaim decodeClaim(const std::string& text) {
  NodeClaim c;
  json v = json::parse(text, nullptr, false);
  if (!v.is_object()) return c;
  c.nonce = v.value("nonce", std::string());
  c.pid = v.value("pid", int64_t{0});
  c.host = v.value("host", std::string("unknown"));
  return c;
}

std::string encodeJoin(const JoinInfo& j) {
  return dump({{"node", j.node},
               {"requested_rank", j.requestedRank},
               {"host", j.host},
               {"label", j.label},
               {"address", j.address},
               {"local_world_size", j.localWorldSize},
               {"gpus", j.gpus},
               {"launch_version", j.launchVersion},
               {"protocol_version", j.protocolVersion},
               {"error", j.error},
               {"error_code", j.errorCode},
               {"nonce", j.nonce}});
}

JoinInfo decodeJoin(const std::string& text) {
  json v = parse(text, "join");
  JoinInfo j;
  // The versions first: a different protocol may have other fields.
  j.launchVersion = v.value("launch_version", std::string("unknown"));
  j.protocolVersion = v.value("protocol_version", 0);
  j.host = v.value("host", std::string("unknown"));
  j.node = v.value("node", std::string("?"));
  if (j.protocolVersion != kProtocolVersion) return j;
  j.requestedRank = field<int>(v, "requested_rank", "join");
  j.label = field<std::string>(v, "label", "join");
  j.address = field<std::string>(v, "address", "join");
  j.localWorldSize = field<int>(v, "local_world_size", "join");
  j.gpus = field<std::vector<int>>(v, "gpus", "join");
  j.error = field<std::string>(v, "error", "join");
  j.errorCode = field<int>(v, "error_code", "join");
  j.nonce = field<std::string>(v, "nonce", "join");
  return j;
}

std::string encodePlan(const RoundPlan& p) {
  json nodes = json::array();
  for (const auto& n : p.nodes) {
    nodes.push_back({{"node", n.node},
                     {"node_rank", n.nodeRank},
                     {"rank_offset", n.rankOffset},
                     {"local_world_size", n.localWorldSize},
                     {"host", n.host},
                     {"label", n.label},
                     {"address", n.address}});
  }
  json v = planHeader(p);
  v["round"] = p.round;
  v["nodes"] = std::move(nodes);
  return dump(v);
}

RoundPlan decodePlan(const std::string& text) {
  json v = parse(text, "plan");
  RoundPlan p;
  p.round = field<int>(v, "round", "plan");
  readPlanHeader(v, "plan", &p);
  for (const auto& n : field<json>(v, "nodes", "plan")) {
    PlannedNode pn;
    pn.node = field<std::string>(n, "node", "plan");
    pn.nodeRank = field<int>(n, "node_rank", "plan");
    pn.rankOffset = field<int>(n, "rank_offset", "plan");
    pn.localWorldSize = field<int>(n, "local_world_size", "plan");
    pn.host = field<std::string>(n, "host", "plan");
    pn.label = field<std::string>(n, "label", "plan");
    pn.address = field<std::string>(n, "address", "plan");
    p.nodes.push_back(pn);
  }
  return p;
}

std::string encodeResult(const AttemptResult& r) {
  json workers = json::array();
  for (const auto& w : r.workers) {
    workers.push_back({{"rank", w.rank},
                       {"local_rank", w.localRank},
                       {"pid", w.pid},
                       {"state", static_cast<int>(w.state)},
                       {"exit_code", w.exitCode},
                       {"signal", w.signal},
                       {"core_dumped", w.coreDumped},
                       {"exec_errno", w.execErrno},
                       {"lost_reason", w.lostReason},
                       {"end_seconds", w.endSeconds},
                       {"stopped_by_launch", w.stoppedByLaunch},
                       {"was_stopped", w.wasStopped},
                       {"stderr_log", w.stderrLog},
                       {"stderr_tail", w.stderrTail},
                       {"error_file_message", w.errorFileMessage},
                       {"oom_note", w.oomNote},
                       {"host", w.host}});
  }
  json out = {{"attempt", r.attempt},
              {"launcher_signal", r.launcherSignal},
              {"signal_before_failure", r.signalBeforeFailure},
              {"workers", workers}};
  if (!r.nodeLost.empty()) out["node_lost"] = r.nodeLost;  // Note [Node loss]
  return dump(out);
}

AttemptResult decodeResult(const std::string& text) {
  json v = parse(text, "result");
  AttemptResult r;
  r.attempt = field<int>(v, "attempt", "result");
  r.launcherSignal = field<int>(v, "launcher_signal", "result");
  r.signalBeforeFailure = field<bool>(v, "signal_before_failure", "result");
  if (v.contains("node_lost")) r.nodeLost = field<std::string>(v, "node_lost", "result");
  for (const auto& j : field<json>(v, "workers", "result")) {
    WorkerOutcome w;
    w.rank = field<int>(j, "rank", "result");
    w.localRank = field<int>(j, "local_rank", "result");
    w.pid = field<int>(j, "pid", "result");
    int state = field<int>(j, "state", "result");
    DTRAIN_CHECK(state >= 0 && state <= static_cast<int>(WorkerOutcome::State::Lost),
                 "launch: result record has an unknown worker state {}", state);
    w.state = static_cast<WorkerOutcome::State>(state);
    w.exitCode = field<int>(j, "exit_code", "result");
    w.signal = field<int>(j, "signal", "result");
    w.coreDumped = field<bool>(j, "core_dumped", "result");
    w.execErrno = field<int>(j, "exec_errno", "result");
    w.lostReason = field<std::string>(j, "lost_reason", "result");
    w.endSeconds = field<double>(j, "end_seconds", "result");
    w.stoppedByLaunch = field<bool>(j, "stopped_by_launch", "result");
    w.wasStopped = field<bool>(j, "was_stopped", "result");
    w.stderrLog = field<std::string>(j, "stderr_log", "result");
    w.stderrTail = field<std::vector<std::string>>(j, "stderr_tail", "result");
    w.errorFileMessage = field<std::string>(j, "error_file_message", "result");
    w.oomNote = field<std::string>(j, "oom_note", "result");
    w.host = field<std::string>(j, "host", "result");
    r.workers.push_back(w);
  }
  return r;
}

std::string encodeEnd(int code, const std::string& message) {
  return dump({{"code", code}, {"message", message}});
}

std::pair<int, std::string> decodeEnd(const std::string& text) {
  json v = parse(text, "end");
  return {field<int>(v, "code", "end"), field<std::string>(v, "message", "end")};
}

RoundPlan assignRanks(int round, std::vector<JoinInfo> joins, int maxNodes, int masterPort) {
  std::sort(joins.begin(), joins.end(), [](const JoinInfo& a, const JoinInfo& b) {
    return a.requestedRank != b.requestedRank ? a.requestedRank < b.requestedRank : a.node < b.node;
  });
  if (static_cast<int>(joins.size()) > maxNodes) joins.resize(static_cast<size_t>(maxNodes));
  RoundPlan p;
  p.round = round;
  p.masterPort = masterPort;
  int offset = 0;
  for (size_t i = 0; i < joins.size(); ++i) {
    PlannedNode n;
    n.node = joins[i].node;
    n.nodeRank = static_cast<int>(i);
    n.rankOffset = offset;
    n.localWorldSize = joins[i].localWorldSize;
    n.host = joins[i].host;
    n.label = joins[i].label;
    n.address = joins[i].address;
    offset += n.localWorldSize;
    p.nodes.push_back(n);
  }
  p.worldSize = offset;
  if (!p.nodes.empty()) p.masterAddr = p.nodes[0].address;
  return p;
}

std::string versionMismatch(const JoinInfo& mine, const JoinInfo& j) {
  if (j.protocolVersion == mine.protocolVersion && j.launchVersion == mine.launchVersion) return "";
  return fmt::format("launch version mismatch: host {} (node {}) runs launch {} (protocol {}), the "
                     "master {} runs launch {} (protocol {}); HINT: install the same launch on "
                     "every node, or point --remote-launch at it",
                     j.host, j.node, j.launchVersion, j.protocolVersion, mine.host,
                     mine.launchVersion, mine.protocolVersion);
}

void HeartbeatTracker::watch(const std::string& node, Clock::time_point now) {
  nodes_.emplace(node, Entry{std::nullopt, now});
}

std::vector<std::string> HeartbeatTracker::nodes() const {
  std::vector<std::string> out;
  for (const auto& [node, e] : nodes_) out.push_back(node);
  return out;
}

void HeartbeatTracker::forget(const std::string& node) { nodes_.erase(node); }

void HeartbeatTracker::observe(const std::string& node, const std::optional<std::string>& value,
                               Clock::time_point now) {
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return;
  if (value && value != it->second.value) {
    it->second.value = value;
    it->second.changed = now;
  }
}

std::vector<std::pair<std::string, double>> HeartbeatTracker::silent(Clock::time_point now) const {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [node, e] : nodes_) {
    auto quiet = now - e.changed;
    if (quiet >= timeout_) {
      out.emplace_back(node, std::chrono::duration<double>(quiet).count());
    }
  }
  return out;
}

}  // namespace dtrain::launcher
