// The Coordinator while a round runs: results, heartbeats, lost sessions, nodes waiting to join
// (Note [Coordinator loop]).
#include "dtrain/base/error.h"
#include "fault.h"
#include "launcher/cluster/master/coordinator.h"
#include "launcher/seconds.h"
#include "launcher/supervisor/output.h"

namespace dtrain::launcher {

// One round while it runs (superviseRound).
struct Coordinator::RoundWatch {
  struct Dead {
    std::string why;
    bool deadline = false;
    double at = 0;
  };
  RoundWatch(const RoundPlan& p, const std::map<std::string, JoinInfo>& j)
      : plan(p), joins(j), start(Clock::now()) {}
  bool open(const std::string& node) const {
    return plan.find(node) != nullptr && results.count(node) == 0 && dead.count(node) == 0;
  }

  const RoundPlan& plan;
  const std::map<std::string, JoinInfo>& joins;  // the plan's nodes' joins
  const Clock::time_point start;
  std::map<std::string, AttemptResult> results;
  std::map<std::string, Dead> dead;
  std::map<std::string, JoinInfo> waiting;  // joined the next round meanwhile
  int signalSeen = 0;
  bool signalFirst = false;
  bool stopSeen = false;
  Clock::time_point stopAt;
  std::string deadlineStop;  // this round was stopped for a deadline (stopForDeadline)
  std::string growth;        // this round was stopped to take in the waiting nodes
};

AttemptResult Coordinator::superviseRound(const RoundPlan& plan,
                                          const std::map<std::string, JoinInfo>& joins,
                                          std::vector<std::string>* reported,
                                          std::vector<std::string>* waiting, std::string* growth) {
  RoundWatch w(plan, joins);
  for (const auto& n : plan.nodes) tracker_.watch(n.node, w.start);
  bool moved = true;
  while (!roundStep(w, moved)) {
    auto until = nextHeartbeatRead_;
    if (w.stopSeen) {
      until = std::min(until,
                       after(w.stopAt, options_.gracePeriod + options_.heartbeatTimeout + 5));
    }
    moved = awaitEvents(until);
  }
  AttemptResult all = roundOutcome(w, reported);
  for (const auto& [node, j] : w.waiting) waiting->push_back(node);
  *growth = w.growth;
  if (options_.observer) options_.observer->attemptEnded(plan.round);
  return all;
}

bool Coordinator::stopRound(int round, const std::string& why) {
  store::Bytes now = store_->compareSet(keys::stop(round), {}, store::toBytes(why));
  store_->add(keys::events(), 1);  // the next look reads the stop key, as an agent's would be
  return store::toString(now) == why;
}

bool Coordinator::roundStep(RoundWatch& w, bool eventsMoved) {
  const auto now = Clock::now();
  noteStopRequests(w);
  if (eventsMoved) readRoundKeys(w, now);
  noteLostNodes(w, now);
  growIfWaiting(w);
  if (w.results.size() + w.dead.size() == w.plan.nodes.size()) return true;
  const double reportWithin = options_.gracePeriod + options_.heartbeatTimeout + 5;
  if (w.stopSeen && now > after(w.stopAt, reportWithin)) {
    for (const auto& n : w.plan.nodes) {
      if (!w.open(n.node)) continue;
      noteDead(w, n.node,
               fmt::format("its agent did not report within {:g} s of the stop", reportWithin),
               true);
    }
    return true;
  }
  return false;
}

void Coordinator::noteStopRequests(RoundWatch& w) {
  if (w.deadlineStop.empty()) {
    std::string why;
    {
      std::lock_guard<std::mutex> g(mutex_);
      why.swap(deadline_);
    }
    if (!why.empty() && stopRound(w.plan.round, fmt::format("a deadline passed: {}", why))) {
      w.deadlineStop = why;
    }
  }
  if (int sig = signal_.load(); sig != 0 && w.signalSeen == 0) {
    w.signalSeen = sig;
    w.signalFirst = stopRound(w.plan.round,
                              fmt::format("launch (the master, {}) received {}", options_.self.host,
                                          fault::signalName(sig)));
  }
}

void Coordinator::noteDead(RoundWatch& w, const std::string& node, const std::string& why,
                           bool deadline) {
  w.dead[node] = RoundWatch::Dead{why, deadline, secondsSince(w.start)};
  tracker_.forget(node);
}

void Coordinator::readRoundKeys(RoundWatch& w, Clock::time_point now) {
  const int round = w.plan.round;
  std::vector<std::string> open;
  std::vector<std::string> joiners;  // who may join the next round: open nodes (another agent)
                                     // and nodes neither planned nor waiting
  for (const auto& e : options_.nodes) {
    if (w.open(e.node)) open.push_back(e.node);
    if (w.open(e.node) || (w.plan.find(e.node) == nullptr && w.waiting.count(e.node) == 0)) {
      joiners.push_back(e.node);
    }
  }
  // One request: the open nodes' results, the next round's joins, the stop key.
  std::vector<std::string> ks;
  for (const auto& n : open) ks.push_back(keys::result(round, n));
  for (const auto& n : joiners) ks.push_back(keys::join(round + 1, n));
  ks.push_back(keys::stop(round));
  const auto values = store_->tryMultiGet(ks);
  for (size_t i = 0; i < open.size(); ++i) {
    if (!values[i]) continue;
    w.results[open[i]] = decodeResult(store::toString(*values[i]));
    tracker_.forget(open[i]);
  }
  for (size_t i = 0; i < joiners.size(); ++i) {
    const auto& v = values[open.size() + i];
    if (!v) continue;
    const std::string& node = joiners[i];
    JoinInfo j = decodeJoin(store::toString(*v));
    NodeState& s = nodes_[node];
    if (!s.staleNonce.empty() && j.nonce == s.staleNonce) continue;
    auto planned = w.joins.find(node);
    if (planned != w.joins.end()) {
      // A planned node's agent joins the next round only after the decision: this is another
      // agent, started again on that node, so the one in the plan is gone.
      if (w.open(node) && j.nonce != planned->second.nonce) {
        const std::string why = fmt::format("its agent was started again (a new launch on {} "
                                            "took node {} over)",
                                            j.host, node);
        noteDead(w, node, why, false);
        stopRound(round, fmt::format("node {} ({}): {}", node, w.plan.find(node)->label, why));
      }
      continue;
    }
    s.lost = false;
    tracker_.watch(node, now);
    say(fmt::format("launch: node {} ({}, {}) waits to join (round {})", node,
                    expected(node)->label, j.host, round + 1));
    w.waiting.emplace(node, std::move(j));
  }
  if (values.back() && !w.stopSeen) {
    w.stopSeen = true;
    w.stopAt = now;
    if (options_.observer) options_.observer->teardownStarted();
    say(fmt::format("launch: stopping round {} on every node: {}", round,
                    store::toString(*values.back())));
    logStoreLoad(now, fmt::format("round {} stopped", round));
  }
}

void Coordinator::noteLostNodes(RoundWatch& w, Clock::time_point now) {
  const RoundPlan& plan = w.plan;
  for (const auto& g : goneSince()) {
    if (w.open(g.node)) {
      noteDead(w, g.node, g.why, false);
      stopRound(plan.round,
                fmt::format("node {} ({}): {}", g.node, plan.find(g.node)->label, g.why));
      continue;
    }
    auto waiting = w.waiting.find(g.node);
    markLost(g.node, g.why, waiting != w.waiting.end() ? waiting->second.nonce : "", true);
    if (waiting != w.waiting.end()) w.waiting.erase(waiting);
  }
  for (const auto& [node, quiet] : readHeartbeats(now)) {
    if (const PlannedNode* n = plan.find(node); n != nullptr && w.open(node)) {
      noteDead(w, node,
               fmt::format("its agent stopped answering heartbeats: silent for {:.1f} s "
                           "(--heartbeat-timeout {:g})",
                           quiet, options_.heartbeatTimeout),
               true);
      stopRound(plan.round,
                fmt::format("node {} ({}) on {} went silent", node, n->label, n->address));
      continue;
    }
    auto waiting = w.waiting.find(node);
    if (waiting == w.waiting.end()) continue;
    const std::string why = fmt::format("it waited to join and went silent ({:.1f} s without a "
                                        "heartbeat)",
                                        quiet);
    say(fmt::format("launch: node {} ({}) dropped: {}", node, expected(node)->label, why));
    markLost(node, why, waiting->second.nonce, false);
    w.waiting.erase(waiting);
  }
}

void Coordinator::growIfWaiting(RoundWatch& w) {
  const size_t planned = w.plan.nodes.size();
  if (w.stopSeen || !w.growth.empty() || w.waiting.empty() ||
      planned >= static_cast<size_t>(options_.maxNodes)) {
    return;
  }
  std::string who;
  for (const auto& [node, j] : w.waiting) {
    who += fmt::format("{}node {} ({})", who.empty() ? "" : ", ", node, expected(node)->label);
  }
  const size_t target = std::min(planned + w.waiting.size(),
                                 static_cast<size_t>(options_.maxNodes));
  const std::string why = fmt::format(
      "{} wait{} to join: the job grows from {} to {} nodes (elastic --nnodes {}:{})", who,
      w.waiting.size() == 1 ? "s" : "", planned, target, options_.minNodes, options_.maxNodes);
  if (stopRound(w.plan.round, why)) w.growth = why;
}

AttemptResult Coordinator::roundOutcome(const RoundWatch& w, std::vector<std::string>* reported) {
  AttemptResult all;
  all.attempt = w.plan.round;
  for (const auto& n : w.plan.nodes) {
    auto r = w.results.find(n.node);
    if (r != w.results.end()) {
      reported->push_back(n.node);
      for (auto worker : r->second.workers) {
        if (worker.host.empty()) worker.host = n.label;
        all.workers.push_back(worker);
      }
      if (r->second.launcherSignal != 0 && all.launcherSignal == 0) {
        all.launcherSignal = r->second.launcherSignal;
        all.signalBeforeFailure = r->second.signalBeforeFailure;
      }
      continue;
    }
    {
      std::lock_guard<std::mutex> g(mutex_);
      goneToRestartCandidates_.push_back(n.node);
      lost_.insert(n.node);
    }
    auto found = w.dead.find(n.node);
    const RoundWatch::Dead d = found != w.dead.end() ? found->second : RoundWatch::Dead{};
    auto join = w.joins.find(n.node);
    markLost(n.node, d.why, join != w.joins.end() ? join->second.nonce : "", false);
    for (int i = 0; i < n.localWorldSize; ++i) {
      WorkerOutcome lost;
      lost.rank = n.rankOffset + i;
      lost.localRank = i;
      lost.state = WorkerOutcome::State::Lost;
      lost.lostReason = fmt::format("its node {} ({}{}) was lost: {}", n.node, n.label,
                                    n.address == n.label ? "" : ", " + n.address, d.why);
      lost.lostToDeadline = d.deadline;
      lost.host = n.label;
      lost.endSeconds = d.at;
      all.workers.push_back(lost);
    }
  }
  if (w.signalSeen != 0) {
    all.launcherSignal = w.signalSeen;
    all.signalBeforeFailure = w.signalFirst;
  }
  all.deadlineStop = w.deadlineStop;
  return all;
}

}  // namespace dtrain::launcher
