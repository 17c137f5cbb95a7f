// The Coordinator while a round runs: results, heartbeats, lost sessions, nodes waiting to join
// (Note [Coordinator loop]).
#include <algorithm>
#include <set>

#include "dtrain/base/error.h"
#include "fault.h"
#include "launcher/cluster/master/coordinator.h"
#include "launcher/seconds.h"
#include "launcher/supervisor/output.h"
#include "parse_int.h"

namespace dtrain::launcher {

namespace {

// A worker of node `n`, which reported, gone with its node (Note [Node loss]): Lost, and not a
// root cause.
void loseWithNode(WorkerOutcome& worker, const PlannedNode& n, const std::string& why) {
  worker.state = WorkerOutcome::State::Lost;
  worker.lostReason = fmt::format("its node {} ({}) was lost: {}", n.node, n.label, why);
  worker.leftBehind = true;
}

// The report's line for node `n`, lost (`why`) and gone on without.
std::string lostLine(const PlannedNode& n, const std::string& why) {
  return fmt::format("launch: node {} ({}) was lost: {}", n.node, n.label, why);
}

// The workers of node `n`, which never reported, as Lost (`why`), ended `at` seconds into the
// round.
void addUnreported(const PlannedNode& n, const std::string& why, bool leftBehind, bool deadline,
                   double at, std::vector<WorkerOutcome>* out) {
  for (int i = 0; i < n.localWorldSize; ++i) {
    WorkerOutcome lost;
    lost.rank = n.rankOffset + i;
    lost.localRank = i;
    lost.state = WorkerOutcome::State::Lost;
    lost.lostReason = fmt::format("its node {} ({}{}) was lost: {}", n.node, n.label,
                                  n.address == n.label ? "" : ", " + n.address, why);
    lost.lostToDeadline = deadline;
    lost.leftBehind = leftBehind;
    lost.host = n.label;
    lost.endSeconds = at;
    out->push_back(lost);
  }
}

}  // namespace

// One round while it runs (superviseRound).
struct Coordinator::RoundWatch {
  struct Dead {
    std::string why;
    bool deadline = false;
    double at = 0;
  };
  RoundWatch(const RoundPlan& p, const std::map<std::string, JoinInfo>& j)
      : plan(p), joins(j), start(Clock::now()), epoch(epochOfPlan(p)) {}
  bool open(const std::string& node) const {
    return plan.find(node) != nullptr && results.count(node) == 0 && dead.count(node) == 0;
  }

  // The round's plan and its nodes' joins; under --on-node-join live the nodes taken in are
  // added (admitLive).
  RoundPlan plan;
  std::map<std::string, JoinInfo> joins;
  const Clock::time_point start;
  std::map<std::string, AttemptResult> results;
  std::map<std::string, Dead> dead;
  std::map<std::string, JoinInfo> waiting;  // joined the next round meanwhile
  int signalSeen = 0;
  bool signalFirst = false;
  bool stopSeen = false;
  Clock::time_point stopAt;
  bool agentStop = false;    // an agent wrote the stop key, for a reason of its own
  std::string deadlineStop;  // this round was stopped for a deadline (stopForDeadline)
  std::string growth;        // this round was stopped to take in the waiting nodes
  // Note [Node loss]: the round's current membership epoch (0: its plan), the nodes it went on
  // without (with the cause and epoch, for the report), a re-form in progress and its deadline,
  // and whether a loss fell back to the restart path.
  membership::Epoch epoch;
  std::map<std::string, std::string> leftOut;
  // Workers of a left-out node whose id came back and was taken in again (Note [Joining a
  // running round]): Lost, for the report.
  std::vector<WorkerOutcome> retired;
  bool reforming = false;
  Clock::time_point reformDeadline;
  // A join whose epoch is written but not in effect: the nodes taken in, until their ranks are
  // ready (Note [Joining a running round]); empty otherwise.
  std::set<std::string> joining;
  // The nodes the epoch in progress takes in, until the members have re-formed with them (Note
  // [Joins at step boundaries] in runtime/comm/world_reform.cpp: at their next step boundary).
  std::set<std::string> newcomers;
  std::string joiningWho;  // "node 2 (h3)", for the lines that follow it
  Clock::time_point joinedAt;
  // Newcomers whose join a loss cancelled (cancelJoin), with their local world sizes: taken in
  // again once the survivors have re-formed (admitLive).
  std::map<std::string, int> carried;
  // Left-out nodes whose agent the master starts again (planRejoin): whether the last session
  // has ended, and when to start the next.
  struct Rejoin {
    bool sessionEnded = false;
    Clock::time_point next;
  };
  std::map<std::string, Rejoin> rejoin;
  bool fellBack = false;
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
  if (store::toString(now) != why) return false;
  stopWritten_ = why;
  return true;
}

bool Coordinator::goOnWithout(RoundWatch& w, const std::string& node, LossKind kind,
                              const std::string& given) {
  // A cause quoted from elsewhere (ssh's "closed by remote host.") goes inside a sentence.
  std::string cause = given;
  while (!cause.empty() && (cause.back() == '.' || cause.back() == ' ')) cause.pop_back();
  if (options_.onNodeLoss != OnNodeLoss::Continue || w.stopSeen || w.fellBack) return false;
  const auto now = Clock::now();
  const PlannedNode* n = w.plan.find(node);
  const std::string who = fmt::format("node {} ({})", node, n ? n->label : node);
  // Note [Joining a running round]: a join not in effect yet is called off first; then a lost
  // newcomer costs the members nothing, and a lost member is a loss among them.
  if (!w.joining.empty()) cancelJoin(w, who + " " + cause);
  if (w.carried.erase(node) != 0) {
    w.leftOut[node] = fmt::format("{}; it was lost while joining round {}, before it was taken "
                                  "in",
                                  cause, w.plan.round);
    say(fmt::format("launch: round {} goes on without {}: {}; it had not been taken in yet",
                    w.plan.round, who, cause));
    planRejoin(w, node, kind == LossKind::AgentGone);
    return true;
  }
  NodeLossFacts f;
  f.kind = kind;
  f.nodesLeft = 0;
  for (const auto& m : w.epoch.nodes) f.nodesLeft += m.node != node ? 1 : 0;
  f.minNodes = options_.minNodes;
  f.reformInProgress = w.reforming;
  f.reformsInWindow = reformsWithin(reforms_, now, options_.reformWindow);
  f.maxReforms = options_.maxReforms;
  f.reformWindow = options_.reformWindow;
  f.hostsStore = !options_.storeNode.empty() && node == options_.storeNode;
  const NodeLossDecision d = decideNodeLoss(options_.onNodeLoss, f);
  if (!d.goOn) {
    w.fellBack = true;
    say(fmt::format("launch: round {} cannot go on without {} ({}): {}; falling back to the "
                    "restart path (--max-restarts {})",
                    w.plan.round, who, cause, d.why, options_.maxRestarts));
    return false;
  }
  const membership::Epoch next = epochWithout(w.epoch, {node}, who + " " + cause);
  store_->setString(epochStoreKey(w.plan.round), membership::encodeEpoch(next));
  store_->flush();
  const double writtenAt = monotonicSeconds();  // the agent's node_lost line has its t= too
  reforms_.push_back(now);
  w.epoch = next;
  w.reforming = true;
  w.reformDeadline = after(now, options_.heartbeatTimeout + kReformSeconds);
  w.leftOut[node] = fmt::format("{}; the job went on without it in epoch {} of round {}", cause,
                                next.epoch, w.plan.round);
  say(fmt::format("launch: round {} goes on without {}: {}; epoch {}: {} node{}, {} rank{} "
                  "(written at t={:.6f})",
                  w.plan.round, who, cause, next.epoch, next.nodes.size(),
                  next.nodes.size() == 1 ? "" : "s", next.worldSize, next.worldSize == 1 ? "" : "s",
                  writtenAt));
  planRejoin(w, node, kind == LossKind::AgentGone);
  logStoreLoad(now, fmt::format("round {} epoch {}", w.plan.round, next.epoch));
  return true;
}

bool Coordinator::cancelJoin(RoundWatch& w, const std::string& cause) {
  // Note [Membership epochs]: one add both cancels the join and says whether it had taken effect.
  const int64_t before = store_->add(readyStoreKey(w.plan.round, w.epoch.epoch),
                                     -membership::kJoinCancelled) +
                         membership::kJoinCancelled;
  if (before >= w.epoch.joining) {
    // Every newcomer counted: the members are re-forming with them (its deadline from now on, as
    // when the master reads the counter complete).
    w.joining.clear();
    w.reformDeadline = after(Clock::now(), options_.heartbeatTimeout + kReformSeconds);
    return false;
  }
  for (const auto& node : w.joining) {
    const membership::EpochNode* m = nullptr;
    for (const auto& e : w.epoch.nodes) {
      if (e.node == node) m = &e;
    }
    if (m != nullptr) w.carried[node] = m->localWorldSize;
  }
  // The members' epoch, under the cancelled one's number: the next epoch written is newer still.
  membership::Epoch members = epochWithout(w.epoch, w.joining, w.epoch.why);
  members.epoch = w.epoch.epoch;
  say(fmt::format("launch: round {}: the join of {} in epoch {} is called off ({} of {} "
                  "rank{} ready): {}",
                  w.plan.round, w.joiningWho, w.epoch.epoch, std::max<int64_t>(before, 0),
                  w.epoch.joining, w.epoch.joining == 1 ? "" : "s", cause));
  w.epoch = members;
  w.joining.clear();
  w.newcomers.clear();
  w.reforming = false;
  return true;
}

void Coordinator::followReform(RoundWatch& w, Clock::time_point now) {
  if (!w.reforming || w.stopSeen) return;
  if (!w.newcomers.empty()) {
    // Every member reported while the newcomers were starting, or before its next step boundary
    // took them in (their last step ran on): only the newcomers' workers are left.
    bool membersLeft = false;
    for (const auto& m : w.epoch.nodes) {
      membersLeft = membersLeft || (w.newcomers.count(m.node) == 0 && w.open(m.node));
    }
    if (!membersLeft) {
      w.reforming = false;
      const std::string why =
          w.joining.empty()
              ? fmt::format("the members finished before they re-formed with {}", w.joiningWho)
              : fmt::format("the members finished before {} reached its first step", w.joiningWho);
      say(fmt::format("launch: round {}: {}; stopping its workers", w.plan.round, why));
      w.joining.clear();
      w.newcomers.clear();
      stopRound(w.plan.round, why);
      return;
    }
  }
  if (now <= w.reformDeadline) return;
  w.reforming = false;
  w.newcomers.clear();
  w.fellBack = true;
  const std::string why =
      !w.joining.empty()
          ? fmt::format("{} did not reach its first step within {:.0f} s of being taken in "
                        "(the larger of --rdzv-timeout and --heartbeat-timeout + {:g})",
                        w.joiningWho, secondsSince(w.joinedAt), kReformSeconds)
          : fmt::format(
                "the survivors did not re-form epoch {} within {:g} s (--heartbeat-timeout + {:g})",
                w.epoch.epoch, options_.heartbeatTimeout + kReformSeconds, kReformSeconds);
  say(fmt::format("launch: round {}: {}; falling back to the restart path (--max-restarts {})",
                  w.plan.round, why, options_.maxRestarts));
  stopRound(w.plan.round, why);
}

bool Coordinator::roundStep(RoundWatch& w, bool eventsMoved) {
  const auto now = Clock::now();
  noteStopRequests(w);
  if (eventsMoved) readRoundKeys(w, now);
  noteLostNodes(w, now);
  followReform(w, now);
  startLeftOutAgain(w, now);
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
  const bool live = options_.onNodeJoin == OnNodeJoin::Live;
  for (const auto& e : options_.nodes) {
    if (w.open(e.node)) open.push_back(e.node);
    // Under --on-node-join live a left-out node's id may come back with a new agent (a
    // replacement given the same --node-rank): it joins like a node never planned.
    const bool back = live && w.leftOut.count(e.node) != 0;
    if (w.open(e.node) ||
        ((w.plan.find(e.node) == nullptr || back) && w.waiting.count(e.node) == 0)) {
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
    const AttemptResult& r = w.results[open[i]] = decodeResult(store::toString(*values[i]));
    tracker_.forget(open[i]);
    // Its agent stopped its workers without stopping the round (Note [Node loss]): go on
    // without the node, or stop the round for it now.
    if (!r.nodeLost.empty() &&
        !goOnWithout(w, open[i], LossKind::WorkersSignaled, "lost its workers: " + r.nodeLost)) {
      stopRound(round, fmt::format("node {} ({}) lost its workers: {}", open[i],
                                   w.plan.find(open[i])->label, r.nodeLost));
    }
  }
  for (size_t i = 0; i < joiners.size(); ++i) {
    const auto& v = values[open.size() + i];
    if (!v) continue;
    const std::string& node = joiners[i];
    JoinInfo j = decodeJoin(store::toString(*v));
    NodeState& s = nodes_[node];
    if (!s.staleNonce.empty() && j.nonce == s.staleNonce) continue;
    auto planned = w.joins.find(node);
    const bool back = live && w.leftOut.count(node) != 0 && planned != w.joins.end() &&
                      j.nonce != planned->second.nonce;
    if (planned != w.joins.end() && !back) {
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
    const std::string why = store::toString(*values.back());
    // An agent's own reason (a worker's non-zero exit, its launch signalled) is never a lost
    // node: under --on-node-loss continue, say that this is the restart path (Note [Node loss]).
    if (why != stopWritten_) w.agentStop = true;
    const bool notALoss = options_.onNodeLoss == OnNodeLoss::Continue && !w.fellBack &&
                          why != stopWritten_;
    say(fmt::format("launch: stopping round {} on every node: {}{}", round, why,
                    notALoss ? " (not a lost node: --on-node-loss continue falls back to the "
                               "restart path)"
                             : ""));
    logStoreLoad(now, fmt::format("round {} stopped", round));
  }
}

void Coordinator::noteLostNodes(RoundWatch& w, Clock::time_point now) {
  const RoundPlan& plan = w.plan;
  for (const auto& g : goneSince()) {
    if (w.open(g.node)) {
      noteDead(w, g.node, g.why, false);
      if (!goOnWithout(w, g.node, LossKind::AgentGone, "lost its agent: " + g.why)) {
        stopRound(plan.round,
                  fmt::format("node {} ({}): {}", g.node, plan.find(g.node)->label, g.why));
      }
      continue;
    }
    auto waiting = w.waiting.find(g.node);
    markLost(g.node, g.why, waiting != w.waiting.end() ? waiting->second.nonce : "", true);
    if (waiting != w.waiting.end()) w.waiting.erase(waiting);
    if (auto r = w.rejoin.find(g.node); r != w.rejoin.end()) {
      r->second.sessionEnded = true;
      DTRAIN_LOG(Info, "launch: node {}'s agent could not come back yet: {}", g.node, g.why);
    }
  }
  // A pending join's ready counter, else a re-form's formed one: the formed one cannot move
  // before the ready one is complete.
  const bool pending = !w.joining.empty();
  std::optional<store::Bytes> counter;
  const auto silent = readHeartbeats(now,
                                     !w.reforming ? ""
                                     : pending    ? readyStoreKey(plan.round, w.epoch.epoch)
                                                  : formedStoreKey(plan.round, w.epoch.epoch),
                                     &counter);
  int64_t count = 0;
  const bool read = w.reforming && counter && parseInt64(store::toString(*counter), &count);
  if (read && pending && count >= w.epoch.joining) {
    say(fmt::format("launch: round {}: {} ready after {:.1f} s; epoch {} takes effect", plan.round,
                    w.joiningWho, secondsSince(w.joinedAt), w.epoch.epoch));
    w.joining.clear();
    w.reformDeadline = after(now, options_.heartbeatTimeout + kReformSeconds);
  } else if (read && !pending && count >= w.epoch.worldSize) {
    w.reforming = false;
    w.newcomers.clear();
    DTRAIN_LOG(Info, "launch: round {}: epoch {} re-formed ({} ranks) {:.3f} s into the round",
               plan.round, w.epoch.epoch, count, secondsSince(w.start));
  }
  for (const auto& [node, quiet] : silent) {
    if (const PlannedNode* n = plan.find(node); n != nullptr && w.open(node)) {
      const std::string why = fmt::format("its agent stopped answering heartbeats: silent for "
                                          "{:.1f} s (--heartbeat-timeout {:g})",
                                          quiet, options_.heartbeatTimeout);
      noteDead(w, node, why, true);
      if (!goOnWithout(
              w, node, LossKind::Silent,
              fmt::format("on {} went silent ({:.1f} s without a heartbeat)", n->address, quiet))) {
        stopRound(plan.round,
                  fmt::format("node {} ({}) on {} went silent", node, n->label, n->address));
      }
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
  if (options_.onNodeJoin == OnNodeJoin::Live) {
    admitLive(w);
    return;
  }
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

// Note [Joining a running round] (node_loss.h): the waiting nodes, up to --nnodes MAX, join the
// members in the next epoch; the state's plan, rewritten as the epoch sees the round, is what
// their agents start their workers from.
void Coordinator::admitLive(RoundWatch& w) {
  if (w.stopSeen || w.fellBack || w.reforming || (w.waiting.empty() && w.carried.empty()) ||
      w.epoch.nodes.size() >= static_cast<size_t>(options_.maxNodes)) {
    return;
  }
  // A member that reported has no workers left: the job is finishing, and a newcomer's workers
  // would wait for members that are gone. The node waits; the round's end ends it too. A
  // newcomer whose join a loss cancelled has its workers started: they are stopped.
  for (const auto& m : w.epoch.nodes) {
    if (w.results.count(m.node) == 0) continue;
    if (!w.carried.empty()) {
      std::string who;
      for (const auto& [node, size] : w.carried) {
        who += fmt::format("{}node {} ({})", who.empty() ? "" : ", ", node,
                           w.plan.find(node)->label);
      }
      const std::string why = fmt::format("the members finished before {} was taken in again", who);
      say(fmt::format("launch: round {}: {}; stopping its workers", w.plan.round, why));
      w.carried.clear();
      stopRound(w.plan.round, why);
    }
    return;
  }
  // Newcomers whose join a loss cancelled come first: their workers wait already.
  std::string again;
  std::vector<std::pair<std::string, int>> sizes;
  for (const auto& [node, size] : w.carried) {
    again += fmt::format("{}node {} ({})", again.empty() ? "" : ", ", node, expected(node)->label);
    sizes.emplace_back(node, size);
  }
  std::vector<std::pair<std::string, JoinInfo>> taken;
  for (auto it = w.waiting.begin();
       it != w.waiting.end() && w.epoch.nodes.size() + sizes.size() + taken.size() <
                                    static_cast<size_t>(options_.maxNodes);) {
    taken.emplace_back(it->first, it->second);
    it = w.waiting.erase(it);
  }
  std::string who = again;
  for (const auto& [node, j] : taken) {
    who += fmt::format("{}node {} ({})", who.empty() ? "" : ", ", node, expected(node)->label);
    sizes.emplace_back(node, j.localWorldSize);
  }
  const membership::Epoch next = epochWith(w.epoch, sizes, who + " joined");
  for (const auto& [node, size] : w.carried) {
    // Its place in the plan stays; its ranks follow the survivors'.
    size_t index = 0;
    while (w.plan.nodes[index].node != node) ++index;
    w.plan.nodes[index].rankOffset = next.rankOf(node, 0);
  }
  for (const auto& [node, j] : taken) {
    // A left-out node's id that came back takes its old place in the plan; a new one goes last.
    const bool back = w.plan.find(node) != nullptr;
    PlannedNode n{node,
                  back ? retire(w, node) : static_cast<int>(w.plan.nodes.size()),
                  next.rankOf(node, 0),
                  j.localWorldSize,
                  j.host,
                  j.label,  // as assignRanks labels a planned node
                  j.address};
    if (back) {
      w.plan.nodes[static_cast<size_t>(n.nodeRank)] = n;
    } else {
      w.plan.nodes.push_back(n);
    }
    w.joins[node] = j;
    w.rejoin.erase(node);
    tracker_.watch(node, Clock::now());
  }
  const auto now = Clock::now();
  store_->setString(epochStoreKey(w.plan.round), membership::encodeEpoch(next));
  const RoundPlan seen = planOfEpoch(w.plan, next);
  store_->setString(keys::plan(w.plan.round), encodePlan(seen));  // for tools and people
  setPhase(w.plan.round, JobPhase::Run, &seen);
  w.epoch = next;
  w.reforming = true;
  // Note [Joining a running round]: the members take the epoch in once the newcomers are ready.
  for (const auto& [node, j] : taken) w.joining.insert(node);
  for (const auto& [node, size] : w.carried) w.joining.insert(node);
  w.newcomers = w.joining;
  w.carried.clear();
  w.joiningWho = who;
  w.joinedAt = now;
  w.reformDeadline = after(
      now, std::max(options_.rdzvTimeout, options_.heartbeatTimeout + kReformSeconds));
  say(fmt::format("launch: round {} takes in {} live{} (--on-node-join live); epoch {}: {} node{}, "
                  "{} rank{}",
                  w.plan.round, who, again.empty() ? "" : " again", next.epoch, next.nodes.size(),
                  next.nodes.size() == 1 ? "" : "s", next.worldSize,
                  next.worldSize == 1 ? "" : "s"));
  logStoreLoad(now, fmt::format("round {} epoch {}", w.plan.round, next.epoch));
}

double Coordinator::rejoinPeriod() const { return std::max(1.0, options_.heartbeatTimeout); }

void Coordinator::planRejoin(RoundWatch& w, const std::string& node, bool sessionEnded) {
  if (options_.onNodeJoin != OnNodeJoin::Live || !options_.startsAgents) return;
  const double period = rejoinPeriod();
  w.rejoin[node] = RoundWatch::Rejoin{sessionEnded, after(Clock::now(), period)};
  const PlannedNode* n = w.plan.find(node);
  say(fmt::format("launch: node {} ({}): its agent is started again every {:g} s until it comes "
                  "back (--on-node-join live)",
                  node, n ? n->label : node, period));
}

void Coordinator::startLeftOutAgain(RoundWatch& w, Clock::time_point now) {
  if (w.rejoin.empty() || w.stopSeen || w.fellBack) return;
  // A member that reported has no workers left: the job is finishing.
  for (const auto& m : w.epoch.nodes) {
    if (w.results.count(m.node) != 0) return;
  }
  std::vector<std::string> start;
  for (auto& [node, r] : w.rejoin) {
    if (!r.sessionEnded || now < r.next || w.waiting.count(node) != 0) continue;
    r.sessionEnded = false;
    r.next = after(now, rejoinPeriod());
    start.push_back(node);
  }
  if (start.empty()) return;
  for (const auto& n : start) {
    // Its new agent claims the node at once (Note [Node claims]), as after a restart.
    const auto claim = store_->tryMultiGet({keys::claim(n)})[0];
    if (claim) store_->compareSet(keys::claim(n), *claim, store::toBytes(kReleasedClaim));
    nodes_[n].lost = false;
    nodes_[n].gone = false;
    DTRAIN_LOG(Info, "launch: starting node {}'s agent again (--on-node-join live)", n);
  }
  {
    std::lock_guard<std::mutex> g(mutex_);
    for (const auto& n : start) {
      lost_.erase(n);
      goneToRestart_.push_back(n);
    }
  }
  if (options_.wake) options_.wake();
}

int Coordinator::retire(RoundWatch& w, const std::string& node) {
  size_t index = 0;
  while (w.plan.nodes[index].node != node) ++index;
  const PlannedNode& n = w.plan.nodes[index];
  const std::string why = w.leftOut[node];
  leftOut_.push_back(lostLine(n, why));
  auto r = w.results.find(node);
  if (r != w.results.end()) {
    for (auto worker : r->second.workers) {
      if (worker.host.empty()) worker.host = n.label;
      loseWithNode(worker, n, why);
      w.retired.push_back(worker);
    }
  } else {
    auto d = w.dead.find(node);
    addUnreported(n, why, true, false, d != w.dead.end() ? d->second.at : 0, &w.retired);
  }
  w.results.erase(node);
  w.dead.erase(node);
  w.leftOut.erase(node);
  return static_cast<int>(index);
}

AttemptResult Coordinator::roundOutcome(const RoundWatch& w, std::vector<std::string>* reported) {
  AttemptResult all;
  all.attempt = w.plan.round;
  all.workers = w.retired;
  for (const auto& n : w.plan.nodes) {
    auto r = w.results.find(n.node);
    auto left = w.leftOut.find(n.node);
    if (left != w.leftOut.end()) {
      leftOut_.push_back(lostLine(n, left->second));
    }
    if (r != w.results.end()) {
      reported->push_back(n.node);
      for (auto worker : r->second.workers) {
        if (worker.host.empty()) worker.host = n.label;
        if (left != w.leftOut.end()) loseWithNode(worker, n, left->second);
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
    addUnreported(n, left != w.leftOut.end() ? left->second : d.why, left != w.leftOut.end(),
                  d.deadline, d.at, &all.workers);
  }
  if (w.signalSeen != 0) {
    all.launcherSignal = w.signalSeen;
    all.signalBeforeFailure = w.signalFirst;
  }
  all.deadlineStop = w.deadlineStop;
  // A round an agent stopped for a worker's failure never ends 0: should every failed worker be
  // left behind with its node by now (the stopping agent's node went out of the epoch meanwhile),
  // the earliest of them is the root cause again.
  if (w.agentStop && all.launcherSignal == 0 && all.deadlineStop.empty() &&
      rootCauseIndex(all.workers) < 0) {
    WorkerOutcome* first = nullptr;
    for (auto& worker : all.workers) {
      if (worker.leftBehind && worker.failed() && !worker.stoppedByLaunch &&
          (first == nullptr || worker.endSeconds < first->endSeconds)) {
        first = &worker;
      }
    }
    if (first != nullptr) first->leftBehind = false;
  }
  return all;
}

}  // namespace dtrain::launcher
