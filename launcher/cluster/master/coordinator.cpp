#include "launcher/cluster/master/coordinator.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "launcher/exit_codes.h"
#include "launcher/seconds.h"
#include "launcher/supervisor/output.h"

namespace dtrain::launcher {

namespace {

using Clock = std::chrono::steady_clock;
// The longest sleep of the master between looks at what happens in this process (signals, lost
// sessions, a stall stop); the store's news wakes it at once (Note [Coordinator loop]).
constexpr std::chrono::milliseconds kTick{100};
// How often every watched node's heartbeat counter is read, at most (a quarter of
// --heartbeat-timeout when that is shorter).
constexpr std::chrono::milliseconds kHeartbeatRead{500};
// At most this long (or --heartbeat-timeout, if shorter) the master waits for the agents to
// acknowledge the job's last decision before its store may go.
constexpr double kAckSeconds = 10;
// How often the store's load is logged (DTRAIN_VERBOSE=1).
constexpr double kStoreLoadSeconds = 5;

}  // namespace

Coordinator::Coordinator(std::shared_ptr<store::Store> store, CoordinatorOptions options)
    : store_(std::move(store)),
      options_(std::move(options)),
      heartbeatRead_(std::min(kHeartbeatRead, millis(options_.heartbeatTimeout / 4))),
      tracker_(millis(options_.heartbeatTimeout)) {
  for (const auto& e : options_.nodes) nodes_[e.node];
}

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

void Coordinator::stopForDeadline(const std::string& reason) {
  std::lock_guard<std::mutex> g(mutex_);
  if (deadline_.empty()) deadline_ = reason;
}

const ExpectedNode* Coordinator::expected(const std::string& node) const {
  for (const auto& e : options_.nodes) {
    if (e.node == node) return &e;
  }
  return nullptr;
}

void Coordinator::setPhase(int round, JobPhase::Kind kind, const RoundPlan* plan) {
  JobPhase p;
  p.round = round;
  p.kind = kind;
  if (plan) p.plan = *plan;
  store_->setString(keys::state(), encodePhase(p));
  store_->flush();
}

bool Coordinator::awaitEvents(Clock::time_point until) {
  const auto now = Clock::now();
  auto slice = std::chrono::duration_cast<std::chrono::milliseconds>(until - now);
  slice = std::clamp(slice, std::chrono::milliseconds(1), kTick);
  bool moved = false;
  try {
    eventsSeen_ = store_->waitChanged(keys::events(), eventsSeen_, slice);
    moved = true;
  } catch (const TimeoutError&) {
  }
  logStoreLoad(Clock::now());
  return moved;
}

std::vector<std::pair<std::string, double>> Coordinator::readHeartbeats(
    Clock::time_point now, const std::string& alsoKey, std::optional<store::Bytes>* also) {
  if (now < nextHeartbeatRead_) return {};
  nextHeartbeatRead_ = now + heartbeatRead_;
  const std::vector<std::string> nodes = tracker_.nodes();
  if (nodes.empty() && alsoKey.empty()) return {};
  std::vector<std::string> ks;
  for (const auto& n : nodes) ks.push_back(keys::heartbeat(n));
  if (!alsoKey.empty()) ks.push_back(alsoKey);
  const auto values = store_->tryMultiGet(ks);
  if (!alsoKey.empty() && also) *also = values.back();
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (values[i]) tracker_.observe(nodes[i], store::toString(*values[i]), now);
  }
  auto silent = tracker_.silent(now);
  for (const auto& s : silent) tracker_.forget(s.first);
  return silent;
}

std::map<std::string, JoinInfo> Coordinator::readJoins(int round,
                                                       const std::vector<std::string>& nodes) {
  std::map<std::string, JoinInfo> out;
  if (nodes.empty()) return out;
  std::vector<std::string> ks;
  for (const auto& n : nodes) ks.push_back(keys::join(round, n));
  const auto values = store_->tryMultiGet(ks);
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!values[i]) continue;
    JoinInfo j = decodeJoin(store::toString(*values[i]));
    const NodeState& s = nodes_[nodes[i]];
    if (!s.staleNonce.empty() && j.nonce == s.staleNonce) continue;  // the lost agent's
    out.emplace(nodes[i], std::move(j));
  }
  return out;
}

void Coordinator::markLost(const std::string& node, const std::string& why,
                           const std::string& nonce, bool gone) {
  NodeState& s = nodes_[node];
  s.lost = true;
  s.gone = s.gone || gone;
  s.why = why;
  if (!nonce.empty()) s.staleNonce = nonce;
  tracker_.forget(node);
}

void Coordinator::logStoreLoad(Clock::time_point now, const std::string& when) {
  if (!options_.storeRequests || (when.empty() && now < nextStoreLog_)) return;
  if (when.empty()) nextStoreLog_ = after(now, kStoreLoadSeconds);
  const std::vector<uint64_t> c = options_.storeRequests();
  uint64_t total = 0;
  for (uint64_t v : c) total += v;
  DTRAIN_LOG(Info,
             "launch: store requests so far ({}) at t={:.6f}: {} (heartbeats {}, monitoring "
             "{}, the rest {})",
             when.empty() ? "periodic" : when, monotonicSeconds(), total, c.size() > 0 ? c[0] : 0,
             c.size() > 1 ? c[1] : 0, c.size() > 2 ? c[2] : 0);
}

int Coordinator::end(int code, const std::string& message,
                     const std::vector<std::string>& awaitAcks) {
  if (!message.empty())
    say("launch: job failed: " + message + fmt::format(" (exit code {})", code));
  store_->setString(keys::end(), encodeEnd(code, message));
  setPhase(0, JobPhase::Ended);
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

void Coordinator::decide(int round, const std::string& decision,
                         const std::vector<std::string>& awaitAcks) {
  // The round's stop key first, when no failure wrote it: every agent's heartbeat thread stops
  // waiting on it at once (Note [Heartbeat thread] in heartbeat_thread.h), so the agents end
  // without a wait slice.
  store_->compareSet(keys::stop(round), {},
                     store::toBytes(fmt::format("round {} is over ({})", round, decision)));
  store_->setString(keys::decision(round), decision);
  setPhase(round, JobPhase::Decided);
  logStoreLoad(Clock::now(), fmt::format("round {} decided", round));
  std::vector<std::string> acks;
  for (const auto& node : awaitAcks) acks.push_back(keys::ack(round, node));
  awaitAcknowledgements(acks, fmt::format("the decision of round {}", round));
}

void Coordinator::restartLostNodes() {
  if (!options_.startsAgents) return;
  std::vector<std::string> restart;
  {
    std::lock_guard<std::mutex> g(mutex_);
    goneToRestart_ = goneToRestartCandidates_;
    for (const auto& n : goneToRestart_) lost_.erase(n);
    restart = goneToRestart_;
  }
  for (const auto& n : restart) {
    // Its new agent may claim the node at once (Note [Node claims]); the lost one's joins stay
    // stale, and the next rendezvous waits for the new one.
    const auto claim = store_->tryMultiGet({keys::claim(n)})[0];
    if (claim) store_->compareSet(keys::claim(n), *claim, store::toBytes(kReleasedClaim));
    nodes_[n].lost = false;
    nodes_[n].gone = false;
  }
}

int Coordinator::run() {
  std::vector<AttemptResult> attempts;
  for (int round = 0;; ++round) {
    setPhase(round, JobPhase::Gather);
    int code = 0;
    std::vector<JoinInfo> joins = gatherJoins(round, &code);
    if (joins.empty()) return code;
    RoundPlan plan = assignRanks(round, joins, options_.maxNodes, options_.masterPort);
    plan.runId = options_.runId;
    std::map<std::string, JoinInfo> joinOf;
    for (auto& j : joins) joinOf.emplace(j.node, j);
    DTRAIN_LOG(Info, "launch: round {}: {} nodes, world size {}, MASTER_ADDR {}:{}", round,
               plan.nodes.size(), plan.worldSize, plan.masterAddr, plan.masterPort);
    {
      std::lock_guard<std::mutex> g(mutex_);
      goneToRestartCandidates_.clear();
      deadline_.clear();  // a stop asked for in the last round belongs to it
    }
    if (options_.observer) options_.observer->attemptStarted(round, plan.worldSize);
    store_->setString(keys::plan(round), encodePlan(plan));
    setPhase(round, JobPhase::Run, &plan);
    logStoreLoad(Clock::now(), fmt::format("round {} planned", round));
    std::vector<std::string> reported;
    std::vector<std::string> waiting;
    std::string growth;
    attempts.push_back(superviseRound(plan, joinOf, &reported, &waiting, &growth));
    const AttemptResult& r = attempts.back();
    const bool failed = rootCauseIndex(r.workers) >= 0;
    const bool interrupted = r.launcherSignal != 0 || !r.deadlineStop.empty();
    const bool stoppedByUs = std::any_of(r.workers.begin(), r.workers.end(),
                                         [](const WorkerOutcome& w) { return w.stoppedByLaunch; });
    if (!growth.empty() && !failed && !interrupted && stoppedByUs) {
      say(fmt::format("launch: round {} stopped to grow the job ({}); restarting with the nodes "
                      "waiting to join (not counted against --max-restarts)",
                      round, growth));
      decide(round, "restart", {});
      continue;
    }
    if (failed && !interrupted && restartsUsed_ < options_.maxRestarts) {
      ++restartsUsed_;
      std::string line = formatRestartLine(r, restartsUsed_, options_.maxRestarts);
      writeAll(STDERR_FILENO, line.data(), line.size());
      restartLostNodes();
      if (options_.wake) options_.wake();
      decide(round, "restart", {});
      continue;
    }
    code = launcherExitCode(r);
    if (code == 0) {
      for (const auto& line : leftOut_) say(line);
    } else {
      ReportContext ctx;
      ctx.host = options_.self.host;
      ctx.runId = options_.runId;
      ctx.maxRestarts = options_.maxRestarts;
      ctx.gracePeriod = options_.gracePeriod;
      ctx.logHint = options_.logHint;
      std::string report = formatFailureReport(ctx, attempts);
      writeAll(STDERR_FILENO, report.data(), report.size());
    }
    reported.insert(reported.end(), waiting.begin(), waiting.end());
    decide(round, fmt::format("end {}", code), reported);
    return code;
  }
}

}  // namespace dtrain::launcher
