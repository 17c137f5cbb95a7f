#include "launcher/cluster/coordinator.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
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

std::vector<JoinInfo> Coordinator::gatherJoins(int round, int* endCode) {
  const auto start = Clock::now();
  const auto deadline = after(start, options_.rdzvTimeout);
  std::map<std::string, JoinInfo> joined;
  std::map<std::string, std::string> gone;
  std::vector<std::string> heard;  // nodes whose join was read: they wait for the master's word
  // "node 0 (a), node 2 (c)": the joined nodes, or the others -- with why, when they are lost.
  auto listing = [&](bool joinedOnes) {
    std::string out;
    for (const auto& e : options_.nodes) {
      if ((joined.count(e.node) != 0) != joinedOnes) continue;
      if (!out.empty()) out += ", ";
      out += fmt::format("node {} ({})", e.node, e.label);
      if (!joinedOnes) out += gone.count(e.node) ? ": " + gone[e.node] : ": not joined yet";
    }
    return out.empty() ? std::string("none") : out;
  };
  while (true) {
    if (int sig = signal_.load()) {
      *endCode = end(128 + sig, fmt::format("launch received {} while waiting for the nodes "
                                            "(round {})", fault::signalName(sig), round), heard);
      return {};
    }
    for (const auto& g : goneSince()) {
      joined.erase(g.node);
      gone[g.node] = g.why;
    }
    for (const auto& e : options_.nodes) {
      if (joined.count(e.node) || gone.count(e.node)) continue;
      const std::string key = keys::join(round, e.node);
      if (!store_->check({key})) continue;
      JoinInfo j = decodeJoin(store_->getString(key));
      heard.push_back(e.node);
      if (std::string m = versionMismatch(options_.self, j); !m.empty()) {
        *endCode = end(125, m, heard);
        return {};
      }
      if (!j.error.empty()) {
        *endCode = end(j.errorCode != 0 ? j.errorCode : 125,
                       fmt::format("node {} ({}) cannot run: {}", e.node, e.label, j.error), heard);
        return {};
      }
      joined[e.node] = j;
    }
    const size_t pending = options_.nodes.size() - joined.size() - gone.size();
    if (joined.size() + pending < static_cast<size_t>(options_.minNodes)) {
      *endCode = end(125, fmt::format("rendezvous round {}: only {} of the {} nodes needed can "
                                      "join; joined: {}; the others: {}",
                                      round, joined.size() + pending, options_.minNodes,
                                      listing(true), listing(false)), heard);
      return {};
    }
    const bool timedOut = Clock::now() >= deadline;
    if (joined.size() == static_cast<size_t>(options_.maxNodes) ||
        ((pending == 0 || timedOut) && joined.size() >= static_cast<size_t>(options_.minNodes))) {
      if (joined.size() < options_.nodes.size()) {
        say(fmt::format("launch: rendezvous round {}: {} of {} nodes joined{}; going on with "
                        "them (elastic --nnodes {}:{}); missing: {}",
                        round, joined.size(), options_.nodes.size(),
                        timedOut ? fmt::format(" within {:g} s", options_.rdzvTimeout) : "",
                        options_.minNodes, options_.maxNodes, listing(false)));
      }
      break;
    }
    if (timedOut) {
      *endCode = end(kExitDeadline,
                     fmt::format("rendezvous timed out after {:g} s (--rdzv-timeout) in round {}: "
                                 "{} of {} nodes joined; joined: {}; missing: {}. HINT: is launch "
                                 "running on the missing nodes, and can they reach the store at {}?",
                                 options_.rdzvTimeout, round, joined.size(), options_.minNodes,
                                 listing(true), listing(false), options_.storeWhere), heard);
      return {};
    }
    std::vector<std::string> missing;
    for (const auto& e : options_.nodes) {
      if (!joined.count(e.node) && !gone.count(e.node)) missing.push_back(keys::join(round, e.node));
    }
    waitFor(*store_, missing);
  }
  std::vector<JoinInfo> out;
  for (auto& [node, j] : joined) out.push_back(j);
  return out;
}

AttemptResult Coordinator::superviseRound(const RoundPlan& plan, std::vector<std::string>* reported) {
  const auto start = Clock::now();
  const int round = plan.round;
  HeartbeatTracker tracker(millis(options_.heartbeatTimeout));
  for (const auto& n : plan.nodes) tracker.watch(n.node, start);
  std::map<std::string, AttemptResult> results;
  struct Dead {
    std::string why;
    bool deadline = false;
    double at = 0;
  };
  std::map<std::string, Dead> dead;
  int signalSeen = 0;
  bool signalFirst = false;
  bool stopSeen = false;
  Clock::time_point stopAt;
  std::string deadlineStop;  // this round was stopped for a deadline (stopForDeadline)
  auto stop = [&](const std::string& why) {
    store::Bytes now = store_->compareSet(keys::stop(round), {}, store::toBytes(why));
    return store::toString(now) == why;
  };
  auto planned = [&](const std::string& node) { return plan.find(node) != nullptr; };

  while (true) {
    const auto now = Clock::now();
    if (deadlineStop.empty()) {
      std::string why;
      {
        std::lock_guard<std::mutex> g(mutex_);
        why.swap(deadline_);
      }
      if (!why.empty() && stop(fmt::format("a deadline passed: {}", why))) deadlineStop = why;
    }
    if (int sig = signal_.load(); sig != 0 && signalSeen == 0) {
      signalSeen = sig;
      signalFirst = stop(fmt::format("launch (the master, {}) received {}", options_.self.host,
                                     fault::signalName(sig)));
    }
    for (const auto& g : goneSince()) {
      if (!planned(g.node) || results.count(g.node) || dead.count(g.node)) continue;
      dead[g.node] = Dead{g.why, false, secondsSince(start)};
      tracker.forget(g.node);
      stop(fmt::format("node {} ({}): {}", g.node, plan.find(g.node)->label, g.why));
    }
    for (const auto& n : plan.nodes) {
      if (results.count(n.node) || dead.count(n.node)) continue;
      const std::string key = keys::result(round, n.node);
      if (store_->check({key})) {
        results[n.node] = decodeResult(store_->getString(key));
        tracker.forget(n.node);
        continue;
      }
      tracker.observe(n.node, std::to_string(store_->add(keys::heartbeat(n.node), 0)), now);
    }
    for (const auto& [node, quiet] : tracker.silent(now)) {
      const PlannedNode* n = plan.find(node);
      dead[node] = Dead{fmt::format("its agent stopped answering heartbeats: silent for {:.1f} s "
                                    "(--heartbeat-timeout {:g})",
                                    quiet, options_.heartbeatTimeout),
                        true, secondsSince(start)};
      tracker.forget(node);
      stop(fmt::format("node {} ({}) on {} went silent", node, n->label, n->address));
    }
    if (!stopSeen && store_->check({keys::stop(round)})) {
      stopSeen = true;
      stopAt = now;
      if (options_.observer) options_.observer->teardownStarted();
      say(fmt::format("launch: stopping round {} on every node: {}", round,
                      store_->getString(keys::stop(round))));
    }
    if (results.size() + dead.size() == plan.nodes.size()) break;
    if (stopSeen && now > after(stopAt, options_.gracePeriod + options_.heartbeatTimeout + 5)) {
      for (const auto& n : plan.nodes) {
        if (results.count(n.node) || dead.count(n.node)) continue;
        dead[n.node] = Dead{fmt::format("its agent did not report within {:g} s of the stop",
                                        options_.gracePeriod + options_.heartbeatTimeout + 5),
                            true, secondsSince(start)};
      }
      break;
    }
    std::vector<std::string> missing;
    for (const auto& n : plan.nodes) {
      if (!results.count(n.node) && !dead.count(n.node)) missing.push_back(keys::result(round, n.node));
    }
    waitFor(*store_, missing);
  }

  AttemptResult all;
  all.attempt = round;
  for (const auto& n : plan.nodes) {
    auto r = results.find(n.node);
    if (r != results.end()) {
      reported->push_back(n.node);
      for (auto w : r->second.workers) {
        if (w.host.empty()) w.host = n.label;
        all.workers.push_back(w);
      }
      if (r->second.launcherSignal != 0 && all.launcherSignal == 0) {
        all.launcherSignal = r->second.launcherSignal;
        all.signalBeforeFailure = r->second.signalBeforeFailure;
      }
      continue;
    }
    const Dead& d = dead[n.node];
    {
      std::lock_guard<std::mutex> g(mutex_);
      goneToRestartCandidates_.push_back(n.node);
      lost_.insert(n.node);
    }
    for (int i = 0; i < n.localWorldSize; ++i) {
      WorkerOutcome w;
      w.rank = n.rankOffset + i;
      w.localRank = i;
      w.state = WorkerOutcome::State::Lost;
      w.lostReason = fmt::format("its node {} ({}{}) was lost: {}", n.node, n.label,
                                 n.address == n.label ? "" : ", " + n.address, d.why);
      w.lostToDeadline = d.deadline;
      w.host = n.label;
      w.endSeconds = d.at;
      all.workers.push_back(w);
    }
  }
  if (signalSeen != 0) {
    all.launcherSignal = signalSeen;
    all.signalBeforeFailure = signalFirst;
  }
  all.deadlineStop = deadlineStop;
  if (options_.observer) options_.observer->attemptEnded(round);
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
