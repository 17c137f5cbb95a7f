#include "launcher/cluster/coordinator.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "dtrain/base/error.h"
#include "dtrain/base/fault.h"
#include "dtrain/base/logging.h"
#include "launcher/exit_codes.h"
#include "launcher/seconds.h"
#include "launcher/supervisor/output.h"

namespace dtrain::launcher {

namespace {

using Clock = std::chrono::steady_clock;
// How often the master looks at heartbeats, lost sessions and signals. Joins and results do not
// wait for it: the master blocks on the keys it still needs (see waitFor).
constexpr std::chrono::milliseconds kTick{50};
// At most this long (or --heartbeat-timeout, if shorter) the master waits for the agents to
// acknowledge the job's last decision before its store may go.
constexpr double kAckSeconds = 10;

// Blocks until every key of `keys` is there or one tick passed: the last join (or result) of a
// round wakes the master at once, not at its next tick.
void waitFor(store::Store& store, const std::vector<std::string>& keys) {
  if (keys.empty()) {
    std::this_thread::sleep_for(kTick);
    return;
  }
  try {
    store.wait(keys, kTick);
  } catch (const TimeoutError&) {
  }
}

}  // namespace

Coordinator::Coordinator(std::shared_ptr<store::Store> store, CoordinatorOptions options)
    : store_(std::move(store)), options_(std::move(options)) {}

void Coordinator::requestStop(int signo) {
  int none = 0;
  signal_.compare_exchange_strong(none, signo);
}

void Coordinator::nodeGone(const std::string& node, const std::string& why) {
  std::lock_guard<std::mutex> g(mutex_);
  gone_.push_back({node, why});
}

std::set<std::string> Coordinator::lostNodes() {
  std::lock_guard<std::mutex> g(mutex_);
  return lost_;
}

std::vector<std::string> Coordinator::takeGoneNodes() {
  std::lock_guard<std::mutex> g(mutex_);
  return std::exchange(goneToRestart_, {});
}

std::vector<Coordinator::Gone> Coordinator::goneSince() {
  std::lock_guard<std::mutex> g(mutex_);
  std::vector<Gone> out(gone_.begin() + static_cast<std::ptrdiff_t>(goneSeen_), gone_.end());
  goneSeen_ = gone_.size();
  return out;
}

int Coordinator::end(int code, const std::string& message,
                     const std::vector<std::string>& awaitAcks) {
  if (!message.empty()) say("launch: job failed: " + message + fmt::format(" (exit code {})", code));
  store_->setString(keys::end(), encodeEnd(code, message));
  store_->flush();
  std::vector<std::string> acks;
  for (const auto& node : awaitAcks) acks.push_back(keys::endAck(node));
  awaitAcknowledgements(acks, "the job's end");
  return code;
}

void Coordinator::awaitAcknowledgements(const std::vector<std::string>& acks,
                                        const std::string& what) {
  // The store must outlive the agents' reading of the last word (node rank 0 of a manual job
  // stops it as soon as run() returns): wait for their acknowledgements, for a while.
  if (acks.empty()) return;
  try {
    store_->wait(acks, millis(std::min(options_.heartbeatTimeout, kAckSeconds)));
  } catch (const TimeoutError& e) {
    DTRAIN_LOG(Info, "launch: not every node acknowledged {}: {}", what, e.what());
  }
}

// One round's rendezvous while it is gathered (gatherJoins).
struct Coordinator::Gathering {
  int round = 0;
  Clock::time_point deadline;
  std::map<std::string, JoinInfo> joined;
  std::map<std::string, std::string> gone;  // node -> why it is lost
  std::vector<std::string> heard;  // nodes whose join was read: they wait for the master's word
  std::optional<int> endCode;      // the job ended during the rendezvous, with this code
  bool waiting(const std::string& node) const {
    return joined.count(node) == 0 && gone.count(node) == 0;
  }
};

std::vector<JoinInfo> Coordinator::gatherJoins(int round, int* endCode) {
  Gathering g;
  g.round = round;
  g.deadline = after(Clock::now(), options_.rdzvTimeout);
  while (!rendezvousStep(g)) {
    std::vector<std::string> missing;
    for (const auto& e : options_.nodes) {
      if (g.waiting(e.node)) missing.push_back(keys::join(round, e.node));
    }
    waitFor(*store_, missing);
  }
  if (g.endCode) {
    *endCode = *g.endCode;
    return {};
  }
  std::vector<JoinInfo> out;
  for (auto& [node, j] : g.joined) out.push_back(j);
  return out;
}

bool Coordinator::rendezvousStep(Gathering& g) {
  if (int sig = signal_.load()) {
    g.endCode = end(128 + sig, fmt::format("launch received {} while waiting for the nodes "
                                           "(round {})", fault::signalName(sig), g.round), g.heard);
    return true;
  }
  for (const auto& gone : goneSince()) {
    g.joined.erase(gone.node);
    g.gone[gone.node] = gone.why;
  }
  return readJoins(g) || rendezvousDecided(g);
}

bool Coordinator::readJoins(Gathering& g) {
  for (const auto& e : options_.nodes) {
    if (!g.waiting(e.node)) continue;
    const std::string key = keys::join(g.round, e.node);
    if (!store_->check({key})) continue;
    JoinInfo j = decodeJoin(store_->getString(key));
    g.heard.push_back(e.node);
    if (std::string m = versionMismatch(options_.self, j); !m.empty()) {
      g.endCode = end(kExitInfrastructure, m, g.heard);
      return true;
    }
    if (!j.error.empty()) {
      g.endCode = end(j.errorCode != 0 ? j.errorCode : kExitInfrastructure,
                      fmt::format("node {} ({}) cannot run: {}", e.node, e.label, j.error),
                      g.heard);
      return true;
    }
    g.joined[e.node] = j;
  }
  return false;
}

bool Coordinator::rendezvousDecided(Gathering& g) {
  const size_t pending = options_.nodes.size() - g.joined.size() - g.gone.size();
  if (g.joined.size() + pending < static_cast<size_t>(options_.minNodes)) {
    g.endCode = end(kExitInfrastructure,
                    fmt::format("rendezvous round {}: only {} of the {} nodes needed can join; "
                                "joined: {}; the others: {}", g.round, g.joined.size() + pending,
                                options_.minNodes, listing(g, true), listing(g, false)),
                    g.heard);
    return true;
  }
  const bool timedOut = Clock::now() >= g.deadline;
  if (g.joined.size() == static_cast<size_t>(options_.maxNodes) ||
      ((pending == 0 || timedOut) && g.joined.size() >= static_cast<size_t>(options_.minNodes))) {
    if (g.joined.size() < options_.nodes.size()) {
      say(fmt::format("launch: rendezvous round {}: {} of {} nodes joined{}; going on with "
                      "them (elastic --nnodes {}:{}); missing: {}",
                      g.round, g.joined.size(), options_.nodes.size(),
                      timedOut ? fmt::format(" within {:g} s", options_.rdzvTimeout) : "",
                      options_.minNodes, options_.maxNodes, listing(g, false)));
    }
    return true;
  }
  if (timedOut) {
    g.endCode = end(kExitDeadline,
                    fmt::format("rendezvous timed out after {:g} s (--rdzv-timeout) in round {}: "
                                "{} of {} nodes joined; joined: {}; missing: {}. HINT: is launch "
                                "running on the missing nodes, and can they reach the store at {}?",
                                options_.rdzvTimeout, g.round, g.joined.size(), options_.minNodes,
                                listing(g, true), listing(g, false), options_.storeWhere),
                    g.heard);
    return true;
  }
  return false;
}

std::string Coordinator::listing(const Gathering& g, bool joinedOnes) const {
  std::string out;
  for (const auto& e : options_.nodes) {
    if ((g.joined.count(e.node) != 0) != joinedOnes) continue;
    if (!out.empty()) out += ", ";
    out += fmt::format("node {} ({})", e.node, e.label);
    if (!joinedOnes) out += g.gone.count(e.node) ? ": " + g.gone.at(e.node) : ": not joined yet";
  }
  return out.empty() ? std::string("none") : out;
}

// One round while it runs (superviseRound).
struct Coordinator::RoundWatch {
  struct Dead {
    std::string why;
    bool deadline = false;
    double at = 0;
  };
  RoundWatch(const RoundPlan& p, std::chrono::milliseconds heartbeatTimeout)
      : plan(p), start(Clock::now()), tracker(heartbeatTimeout) {}
  bool open(const std::string& node) const {
    return results.count(node) == 0 && dead.count(node) == 0;
  }

  const RoundPlan& plan;
  const Clock::time_point start;
  HeartbeatTracker tracker;
  std::map<std::string, AttemptResult> results;
  std::map<std::string, Dead> dead;
  int signalSeen = 0;
  bool signalFirst = false;
  bool stopSeen = false;
  Clock::time_point stopAt;
  std::string deadlineStop;  // this round was stopped for a deadline (stopForDeadline)
};

AttemptResult Coordinator::superviseRound(const RoundPlan& plan, std::vector<std::string>* reported) {
  RoundWatch w(plan, millis(options_.heartbeatTimeout));
  for (const auto& n : plan.nodes) w.tracker.watch(n.node, w.start);
  while (!roundStep(w)) {
    std::vector<std::string> missing;
    for (const auto& n : plan.nodes) {
      if (w.open(n.node)) missing.push_back(keys::result(plan.round, n.node));
    }
    waitFor(*store_, missing);
  }
  AttemptResult all = roundOutcome(w, reported);
  if (options_.observer) options_.observer->attemptEnded(plan.round);
  return all;
}

bool Coordinator::stopRound(int round, const std::string& why) {
  store::Bytes now = store_->compareSet(keys::stop(round), {}, store::toBytes(why));
  return store::toString(now) == why;
}

bool Coordinator::roundStep(RoundWatch& w) {
  const auto now = Clock::now();
  noteStopRequests(w);
  noteLostNodes(w, now);
  const int round = w.plan.round;
  if (!w.stopSeen && store_->check({keys::stop(round)})) {
    w.stopSeen = true;
    w.stopAt = now;
    if (options_.observer) options_.observer->teardownStarted();
    say(fmt::format("launch: stopping round {} on every node: {}", round,
                    store_->getString(keys::stop(round))));
  }
  if (w.results.size() + w.dead.size() == w.plan.nodes.size()) return true;
  const double reportWithin = options_.gracePeriod + options_.heartbeatTimeout + 5;
  if (w.stopSeen && now > after(w.stopAt, reportWithin)) {
    for (const auto& n : w.plan.nodes) {
      if (!w.open(n.node)) continue;
      w.dead[n.node] = RoundWatch::Dead{
          fmt::format("its agent did not report within {:g} s of the stop", reportWithin), true,
          secondsSince(w.start)};
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
    w.signalFirst = stopRound(w.plan.round, fmt::format("launch (the master, {}) received {}",
                                                        options_.self.host,
                                                        fault::signalName(sig)));
  }
}

void Coordinator::noteLostNodes(RoundWatch& w, Clock::time_point now) {
  const RoundPlan& plan = w.plan;
  for (const auto& g : goneSince()) {
    if (plan.find(g.node) == nullptr || !w.open(g.node)) continue;
    w.dead[g.node] = RoundWatch::Dead{g.why, false, secondsSince(w.start)};
    w.tracker.forget(g.node);
    stopRound(plan.round, fmt::format("node {} ({}): {}", g.node, plan.find(g.node)->label, g.why));
  }
  for (const auto& n : plan.nodes) {
    if (!w.open(n.node)) continue;
    const std::string key = keys::result(plan.round, n.node);
    if (store_->check({key})) {
      w.results[n.node] = decodeResult(store_->getString(key));
      w.tracker.forget(n.node);
      continue;
    }
    w.tracker.observe(n.node, std::to_string(store_->add(keys::heartbeat(n.node), 0)), now);
  }
  for (const auto& [node, quiet] : w.tracker.silent(now)) {
    const PlannedNode* n = plan.find(node);
    w.dead[node] = RoundWatch::Dead{fmt::format("its agent stopped answering heartbeats: silent "
                                                "for {:.1f} s (--heartbeat-timeout {:g})",
                                                quiet, options_.heartbeatTimeout),
                                    true, secondsSince(w.start)};
    w.tracker.forget(node);
    stopRound(plan.round, fmt::format("node {} ({}) on {} went silent", node, n->label, n->address));
  }
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

void Coordinator::decide(int round, const std::string& decision,
                         const std::vector<std::string>& awaitAcks) {
  // The round's stop key first, when no failure wrote it: every agent's heartbeat thread stops
  // waiting on it at once (Note [Heartbeat thread] in heartbeat_thread.h), so the agents end
  // without a wait slice.
  store_->compareSet(keys::stop(round), {},
                     store::toBytes(fmt::format("round {} is over ({})", round, decision)));
  store_->setString(keys::decision(round), decision);
  store_->flush();
  std::vector<std::string> acks;
  for (const auto& node : awaitAcks) acks.push_back(keys::ack(round, node));
  awaitAcknowledgements(acks, fmt::format("the decision of round {}", round));
}

void Coordinator::stopForDeadline(const std::string& reason) {
  std::lock_guard<std::mutex> g(mutex_);
  if (deadline_.empty()) deadline_ = reason;
}

int Coordinator::run() {
  std::vector<AttemptResult> attempts;
  for (int round = 0;; ++round) {
    int code = 0;
    std::vector<JoinInfo> joins = gatherJoins(round, &code);
    if (joins.empty()) return code;
    RoundPlan plan = assignRanks(round, joins, options_.maxNodes, options_.masterPort);
    plan.runId = options_.runId;
    std::string who;
    for (const auto& n : plan.nodes) {
      who += fmt::format("{}node{}={}({}, {} worker{})", who.empty() ? "" : " ", n.nodeRank,
                         n.label, n.address, n.localWorldSize, n.localWorldSize == 1 ? "" : "s");
    }
    DTRAIN_LOG(Info, "launch: round {}: {} nodes, world size {}, MASTER_ADDR {}:{}: {}", round,
               plan.nodes.size(), plan.worldSize, plan.masterAddr, plan.masterPort, who);
    {
      std::lock_guard<std::mutex> g(mutex_);
      goneToRestartCandidates_.clear();
    }
    {
      std::lock_guard<std::mutex> g(mutex_);
      deadline_.clear();  // a stop asked for in the last round belongs to it
    }
    if (options_.observer) options_.observer->attemptStarted(round, plan.worldSize);
    store_->setString(keys::plan(round), encodePlan(plan));
    store_->flush();
    std::vector<std::string> reported;
    attempts.push_back(superviseRound(plan, &reported));
    const AttemptResult& r = attempts.back();
    const bool failed = rootCauseIndex(r.workers) >= 0;
    if (failed && r.launcherSignal == 0 && r.deadlineStop.empty() && round < options_.maxRestarts) {
      std::string line = formatRestartLine(r, round + 1, options_.maxRestarts);
      writeAll(STDERR_FILENO, line.data(), line.size());
      {
        std::lock_guard<std::mutex> g(mutex_);
        goneToRestart_ = goneToRestartCandidates_;
        for (const auto& n : goneToRestart_) lost_.erase(n);
      }
      if (options_.wake) options_.wake();
      decide(round, "restart", {});
      continue;
    }
    code = launcherExitCode(r);
    if (code != 0) {
      ReportContext ctx;
      ctx.host = options_.self.host;
      ctx.runId = options_.runId;
      ctx.maxRestarts = options_.maxRestarts;
      ctx.gracePeriod = options_.gracePeriod;
      ctx.logHint = options_.logHint;
      std::string report = formatFailureReport(ctx, attempts);
      writeAll(STDERR_FILENO, report.data(), report.size());
    }
    decide(round, fmt::format("end {}", code), reported);
    return code;
  }
}

}  // namespace dtrain::launcher
