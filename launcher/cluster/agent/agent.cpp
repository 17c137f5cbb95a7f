#include "launcher/cluster/agent/agent.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "dtrain/base/tcp_store.h"
#include "env_contract.h"
#include "fault.h"
#include "launcher/cluster/agent/heartbeat_thread.h"
#include "launcher/cluster/protocol/rendezvous.h"
#include "launcher/exit_codes.h"
#include "launcher/monitor/monitor.h"
#include "launcher/monitor/node_figure_options.h"
#include "launcher/node/job_resources.h"
#include "launcher/node/nccl_env.h"
#include "launcher/node/node_probe.h"
#include "launcher/node/program.h"
#include "launcher/seconds.h"
#include "launcher/supervisor/output.h"
#include "launcher/supervisor/supervisor.h"
#include "membership.h"
#include "net/socket.h"
#include "parse_int.h"

namespace dtrain::launcher {

const char* launcherVersion();

namespace {

using Clock = std::chrono::steady_clock;
using store::Millis;

// An error that ends this agent with `code` after saying `message`.
struct AgentExit {
  int code;
  std::string message;
};

// A signal of kForwardedSignals that arrived while no attempt runs (they are blocked: the
// supervisor reads them from its signalfd during an attempt); 0 when none.
int takePendingSignal() {
  sigset_t pending;
  sigemptyset(&pending);
  if (::sigpending(&pending) != 0) return 0;
  for (int s : kForwardedSignals) {
    if (sigismember(&pending, s)) {
      sigset_t one;
      sigemptyset(&one);
      sigaddset(&one, s);
      timespec zero{0, 0};
      return ::sigtimedwait(&one, nullptr, &zero) == s ? s : 0;
    }
  }
  return 0;
}

// Note [Agent steps]
// ~~~~~~~~~~~~~~~~~~
// runAgent() is these steps, in this order: compose the workers' environment (this node's under
// the master's forwarded one); probe the node (Note [Node probe] -- a problem goes to the master in
// the join, so the job ends naming this node instead of waiting for it); connect to the store;
// start the heartbeat thread; then per round: join, wait for the plan, run this node's attempt
// when it is in the plan (the Supervisor and this node's monitor are made for the first one),
// report its result (or, the round having gone on without this node, join again: Note [Left
// out of a running round]), wait for the master's decision and acknowledge it; finally stop the
// workers' supervision and remove a temporary job directory.
class Agent {
 public:
  Agent(const AgentSetup& setup, const EnvMap& environment);
  int run();

 private:
  void probeThisNode();
  store::TcpStoreOptions storeOptions() const;
  // The exit code when this node could not connect; nullopt once store_ is connected.
  std::optional<int> connectStore();
  NodeContext nodeContext() const;
  // Note [Node claims]: takes this node's id, or throws AgentExit (exit 2) when a live agent
  // holds it; releaseClaim() gives it back at the end.
  void claimNode();
  void releaseClaim();
  // True when the claim's holder beats within --heartbeat-timeout.
  bool holderAlive(const NodeClaim& holder);
  int runRounds();
  void join(int round);
  // This node's attempt of round `round`; false when the round went on without this node while
  // it ran (Note [Left out of a running round]): nothing reported, the caller joins again.
  bool runRound(int round, const RoundPlan& plan, const PlannedNode& mine);
  // Note [Left out of a running round]: round `round`'s latest membership epoch when it leaves
  // this node out; nullopt while this node is a member, or no epoch was written.
  std::optional<membership::Epoch> leftOutOf(int round);
  void startSupervisor(const RoundPlan& plan);
  monitor::MonitorContext monitorContext(const RoundPlan& plan) const;
  void report(int round, const AttemptResult& result);
  void acknowledge(int round);
  // The master acts on what this agent wrote: launch/events.
  void notifyMaster();
  void stopSupervision();
  // Watches launch/state until the job reached round `round`'s phase `kind` (or ended: then it
  // throws AgentExit with the job's code, as when a decision of an earlier round ends it). Also
  // throws AgentExit when the heartbeat thread lost the store, launch was signalled, or the
  // rendezvous of `round` outlasted --rdzv-timeout.
  JobPhase awaitPhase(int round, JobPhase::Kind kind, const std::string& what);
  // `now` is round `round` - 1 running with a plan that took this node in live (Note [Joining a
  // running round] in launcher/cluster/master/node_loss.h).
  bool takenInLive(const JobPhase& now, int round) const;
  // Throws AgentExit with the job's end (launch/end), acknowledging it.
  [[noreturn]] void followEnd();
  // Throws AgentExit when round `round`'s decision ended the job (acknowledged already).
  void followDecision(int round, const std::string& decision);

  const AgentSetup& setup_;
  const EnvMap& environment_;
  LaunchConfig config_;
  const std::string host_;   // this machine's name
  const std::string label_;  // this node as the host list names it, else host_
  const std::string me_;     // "launch (node 1, gpu2)": how this agent's messages begin
  EnvMap effective_;         // what the workers inherit
  JoinInfo join_;
  NodeProbe probe_;
  std::unique_ptr<store::TcpStore> store_;
  std::unique_ptr<HeartbeatThread> heartbeat_;
  NodeContext node_;
  // This node's part of watching the job (Note [Monitor roles] in launcher/monitor/monitor.h):
  // sample, warn, publish to the store; created with the supervisor, destroyed after it.
  std::unique_ptr<monitor::Monitor> watcher_;
  std::unique_ptr<Supervisor> supervisor_;
  bool temporaryDir_ = false;
  store::Bytes claim_;      // this agent's claim of its node (Note [Node claims])
  store::Bytes phaseSeen_;  // launch/state as last read
  JobPhase phase_;          // ... and decoded (once per value: it may carry a plan)
};

Agent::Agent(const AgentSetup& setup, const EnvMap& environment)
    : setup_(setup),
      environment_(environment),
      config_(setup.config),
      host_(net::hostName()),
      label_(setup.label.empty() ? host_ : setup.label),
      me_(fmt::format("launch (node {}, {})", setup.node, label_)),
      effective_(composeEnvironment(environment, setup.forwarded)) {
  if (!config_.linePrefixGiven) config_.linePrefixTemplate = kDefaultMultiNodeLinePrefixTemplate;
  dtrain::log::setTag(fmt::format("[launch node {}]", setup.node));
}

int Agent::run() {
  probeThisNode();
  blockLauncherSignals();
  if (std::optional<int> code = connectStore()) return *code;
  node_ = nodeContext();
  int code = kExitInfrastructure;
  try {
    claimNode();
    heartbeat_ = std::make_unique<HeartbeatThread>(
        storeOptions(), setup_.node, millis(config_.heartbeatInterval),
        millis(config_.heartbeatTimeout), setup_.watchStdin);
    code = runRounds();
  } catch (const AgentExit& e) {
    code = e.code;
    if (!e.message.empty()) say(fmt::format("{}: {} (exit {})", me_, e.message, e.code));
  } catch (const Error& e) {
    code = kExitInfrastructure;
    say(fmt::format("{}: {} (exit 125)", me_, e.what()));
  }
  stopSupervision();
  releaseClaim();
  return code;
}

void Agent::probeThisNode() {
  join_.node = setup_.node;
  join_.requestedRank = setup_.requestedRank;
  join_.host = host_;
  join_.label = label_;
  join_.gpus = setup_.gpus;
  join_.launchVersion = launcherVersion();
  ProbeRequest request;
  request.label = label_;
  request.slots = setup_.slots;
  request.gpus = setup_.gpus;
  request.storeAddr = setup_.storeAddr;
  try {
    probe_ = probeNode(config_, effective_, request);
    join_.localWorldSize = probe_.localWorldSize;
    join_.address = probe_.address;
  } catch (const ProgramNotFound& e) {
    join_.error = e.what();
    join_.errorCode = kExitNotFound;
  } catch (const ProgramNotExecutable& e) {
    join_.error = e.what();
    join_.errorCode = kExitNotExecutable;
  } catch (const Error& e) {
    join_.error = e.what();
    join_.errorCode = dynamic_cast<const InvalidArgument*>(&e) ? kExitUsage : kExitInfrastructure;
  }
}

store::TcpStoreOptions Agent::storeOptions() const {
  store::TcpStoreOptions so;
  so.host = setup_.storeAddr;
  so.port = static_cast<uint16_t>(setup_.storePort);
  so.token = setup_.token;
  so.timeout = millis(std::max(config_.heartbeatTimeout, 1.0));
  // The first connection may wait for the store's host as long as the rendezvous does (a manual
  // node 0 may start last), in attempts of at most a second, so a signal or the master's end is
  // seen meanwhile; a refusal (another job's store, a different token) is final. A connection
  // lost later is the store lost: a reconnect gets --heartbeat-timeout, never the rendezvous
  // timeout.
  so.connectTimeout = millis(std::min(config_.heartbeatTimeout, 1.0));
  return so;
}

std::optional<int> Agent::connectStore() {
  const store::TcpStoreOptions so = storeOptions();
  const auto deadline = Clock::now() + millis(config_.rdzvTimeout);
  std::string lastError;
  while (true) {
    try {
      store_ = std::make_unique<store::TcpStore>(so);
      return std::nullopt;
    } catch (const NetworkError& e) {
      lastError = e.what();
    } catch (const TimeoutError& e) {
      lastError = e.what();
    } catch (const Error& e) {
      say(fmt::format("{}: the store at {}:{} refused this node: {} (exit 125)", me_, so.host,
                      so.port, e.what()));
      return kExitInfrastructure;
    }
    if (int sig = takePendingSignal()) {
      if (setup_.onSignal) setup_.onSignal(sig);
      say(fmt::format("{}: received {} while connecting to the store at {}:{}", me_,
                      fault::signalName(sig), so.host, so.port));
      return 128 + sig;
    }
    if (setup_.watchStdin && stdinEnded()) {
      say(fmt::format("{}: the master's launch is gone (its ssh session or pipe closed) while "
                      "this node was connecting to the store at {}:{} (exit 125)",
                      me_, so.host, so.port));
      return kExitInfrastructure;
    }
    if (Clock::now() >= deadline) {
      say(fmt::format("{}: cannot reach the store at {}:{} within {:g} s (--rdzv-timeout): {}", me_,
                      so.host, so.port, config_.rdzvTimeout, lastError));
      return kExitDeadline;
    }
  }
}

// What every round of this node shares; the round's plan adds ranks and MASTER_ADDR/PORT.
NodeContext Agent::nodeContext() const {
  NodeContext node;
  node.host = label_;
  int64_t id = 0;
  node.nodeId = parseInt64(setup_.node, &id) ? static_cast<int>(id)
                                             : 0;  // host-list index, --node-rank
  node.cpuCount = probe_.cpuCount;
  node.storeAddr = setup_.storeAddr;
  node.storePort = setup_.storePort;
  node.storeToken = setup_.token;
  node.gpuSlots = setup_.gpus;
  node.inherited = environment_;
  node.localWorldSize = join_.localWorldSize;
  node.overlay = setup_.forwarded;
  for (const auto& [k, v] : ncclEnvironment(config_.nccl, probe_.iface, effective_)) {
    node.overlay[k] = v;
  }
  return node;
}

void Agent::claimNode() {
  NodeClaim mine;
  mine.nonce = newRunId() + newRunId();
  mine.pid = ::getpid();
  mine.host = host_;
  join_.nonce = mine.nonce;
  claim_ = store::toBytes(encodeClaim(mine));
  const std::string key = keys::claim(setup_.node);
  while (true) {
    const store::Bytes now = store_->compareSet(key, {}, claim_);
    if (now == claim_) return;
    const NodeClaim holder = decodeClaim(store::toString(now));
    if (!holder.nonce.empty() && holderAlive(holder)) {
      throw AgentExit{
          kExitUsage,
          fmt::format(
              "{} is held by another launch, alive on host {} (pid {}: its heartbeat moves); this "
              "launch on {} (pid {}) was given the same one. HINT: give every node its own "
              "--node-rank, 0 to {}",
              setup_.label.empty() ? fmt::format("--node-rank {}", setup_.node)
                                   : fmt::format("node {}", setup_.node),
              holder.host, holder.pid, host_, ::getpid(), config_.maxNodes - 1)};
    }
    // Released, or its holder went silent: take it over, unless someone else was quicker.
    if (store_->compareSet(key, now, claim_) == claim_) {
      if (!holder.nonce.empty()) {
        say(fmt::format("{}: took node {} over from a silent launch on {} (pid {})", me_,
                        setup_.node, holder.host, holder.pid));
      }
      return;
    }
  }
}

bool Agent::holderAlive(const NodeClaim& holder) {
  const std::string beat = keys::heartbeat(setup_.node);
  const store::Bytes seen = store_->tryMultiGet({beat})[0].value_or(store::Bytes{});
  const auto deadline = after(Clock::now(), config_.heartbeatTimeout);
  DTRAIN_LOG(Info,
             "launch: node {} is claimed by a launch on {} (pid {}); watching its heartbeat "
             "for up to {:g} s",
             setup_.node, holder.host, holder.pid, config_.heartbeatTimeout);
  while (Clock::now() < deadline) {
    if (int sig = takePendingSignal()) {
      if (setup_.onSignal) setup_.onSignal(sig);
      throw AgentExit{128 + sig, fmt::format("received {} while waiting for node {}'s claim",
                                             fault::signalName(sig), setup_.node)};
    }
    const auto slice = std::min(std::chrono::duration_cast<Millis>(deadline - Clock::now()),
                                Millis(1000));
    try {
      store_->waitChanged(beat, seen, std::max(slice, Millis(1)));
      return true;
    } catch (const TimeoutError&) {
    }
  }
  return false;
}

void Agent::releaseClaim() {
  if (claim_.empty() || !store_) return;
  try {
    store_->compareSet(keys::claim(setup_.node), claim_, store::toBytes(kReleasedClaim));
    store_->flush();
  } catch (const Error&) {
    // The store is gone: nobody can claim the node any more anyway.
  }
}

void Agent::notifyMaster() { store_->add(keys::events(), 1); }

void Agent::join(int round) {
  // Stamped before the join is sent: on a loaded machine an agent can wait long to run again
  // after its add returns, and a stamp taken then would put its join after the plan it led to.
  const double sent = monotonicSeconds();
  store_->setString(keys::join(round, setup_.node), encodeJoin(join_));
  notifyMaster();
  DTRAIN_LOG(Info, "launch: round {}: joined at t={:.6f}", round, sent);
}

// Rounds until the master's decision ends the job; returns its exit code.
int Agent::runRounds() {
  // Note [Rendezvous protocol]: join the round being gathered, or -- its plan being out -- the
  // next one; never a finished one.
  JobPhase now = decodePhase(
      store::toString(store_->tryMultiGet({keys::state()})[0].value_or(store::Bytes{})));
  if (now.kind == JobPhase::Ended) followEnd();
  int round = now.kind == JobPhase::Gather ? now.round : now.round + 1;
  while (true) {
    join(round);
    now = awaitPhase(round, JobPhase::Run, fmt::format("round {}'s plan from the master", round));
    // Note [Joining a running round]: the round in progress took this node in.
    if (takenInLive(now, round)) round = now.round;
    if (now.round > round || now.kind == JobPhase::Decided) {
      round = now.kind == JobPhase::Gather ? now.round : now.round + 1;  // it passed without us
      continue;
    }
    if (!now.plan) {
      throw AgentExit{kExitInfrastructure, fmt::format("round {}'s \"{}\" on the store at {} "
                                                       "carries no plan (HINT: every node must "
                                                       "run the same launch version)",
                                                       round, keys::state(), store_->describe())};
    }
    const RoundPlan& plan = *now.plan;  // Note [Plan in the state]
    const PlannedNode* mine = plan.find(setup_.node);
    DTRAIN_LOG(Info, "launch: round {}: plan read at t={:.6f}: {}", round, monotonicSeconds(),
               mine ? fmt::format("node rank {} of {}, world size {}{}", mine->nodeRank,
                                  plan.nodes.size(), plan.worldSize,
                                  plan.epoch > 0 ? fmt::format(", taken in live in membership "
                                                               "epoch {}",
                                                               plan.epoch)
                                                 : "")
                    : fmt::format("not among its {} nodes; waiting to join round {}",
                                  plan.nodes.size(), round + 1));
    if (!mine) {
      ++round;
      continue;
    }
    if (!runRound(round, plan, *mine)) {
      // Note [Left out of a running round]: this agent joins again as a new one would.
      join_.nonce = newRunId() + newRunId();
      ++round;
      continue;
    }
    awaitPhase(round, JobPhase::Decided,
               fmt::format("the master's decision after round {}", round));
    const std::string decision = store_->getString(keys::decision(round));
    acknowledge(round);
    followDecision(round, decision);
    ++round;
  }
}

JobPhase Agent::awaitPhase(int round, JobPhase::Kind kind, const std::string& what) {
  std::optional<Clock::time_point> deadline;  // only while `round` is being gathered
  int decisionRead = -1;
  while (true) {
    if (int sig = takePendingSignal()) {
      if (setup_.onSignal) setup_.onSignal(sig);
      throw AgentExit{
          128 + sig, fmt::format("received {} while waiting for {}", fault::signalName(sig), what)};
    }
    if (std::string why = heartbeat_->lost(); !why.empty()) {
      throw AgentExit{kExitInfrastructure, why};
    }
    const JobPhase& now = phase_;
    if (now.kind == JobPhase::Ended) followEnd();
    if (!phaseSeen_.empty() && now.reached(round, kind)) return now;
    if (kind == JobPhase::Run && takenInLive(now, round)) return now;
    if (now.kind == JobPhase::Decided && now.round < round && now.round != decisionRead) {
      // Waiting to join: the round before may have ended the job.
      decisionRead = now.round;
      const std::string decision = store_->getString(keys::decision(now.round));
      if (decision != "restart") acknowledge(now.round);
      followDecision(now.round, decision);
    }
    if (!deadline && now.round == round && now.kind == JobPhase::Gather) {
      deadline = after(Clock::now(), config_.rdzvTimeout + config_.heartbeatTimeout);
    }
    if (deadline && Clock::now() >= *deadline) {
      throw AgentExit{kExitDeadline, fmt::format("timed out waiting for {} (key \"{}\" on the "
                                                 "store at {})",
                                                 what, keys::state(), store_->describe())};
    }
    try {
      // A slice at most, so that a signal is seen meanwhile.
      phaseSeen_ = store_->waitChanged(keys::state(), phaseSeen_, Millis(1000));
      phase_ = decodePhase(store::toString(phaseSeen_));
    } catch (const TimeoutError&) {
    } catch (const NetworkError& e) {
      throw AgentExit{kExitInfrastructure, fmt::format("lost the store at {} while waiting for {}: "
                                                       "{}",
                                                       store_->describe(), what, e.what())};
    }
  }
}

bool Agent::takenInLive(const JobPhase& now, int round) const {
  return now.kind == JobPhase::Run && now.round == round - 1 && now.plan && now.plan->epoch > 0 &&
         now.plan->find(setup_.node) != nullptr;
}

void Agent::followEnd() {
  auto [code, message] = decodeEnd(store_->getString(keys::end()));
  try {
    store_->setString(keys::endAck(setup_.node), "1");
    store_->flush();
  } catch (const Error&) {
    // The master went on without it (it waits for acknowledgements only so long).
  }
  throw AgentExit{code, message};
}

void Agent::followDecision(int round, const std::string& decision) {
  if (decision == "restart") return;
  int64_t code = kExitInfrastructure;
  if (decision.rfind("end ", 0) == 0) parseInt64(decision.substr(4), &code);
  DTRAIN_LOG(Info, "launch: round {}: the master ended the job with {}", round, code);
  throw AgentExit{static_cast<int>(code), ""};
}

// Note [Left out of a running round]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Under --on-node-loss continue the master can go on without a node whose agent is alive: a
// partition healed before this agent's --heartbeat-timeout ran out (the master's ran out first,
// or the agent's is longer), or its agent stalled. Its workers then read the round's epoch, find
// themselves out of it and end with an error that is no program bug (the runtime's
// MembershipChanged: "the launcher went on without this node"). So the agent reads the epoch
// before it writes the round's stop key for a failed worker, and after the attempt: when the
// round's latest epoch leaves this node out, it writes neither the stop key (that would stop the
// survivors, and with the failed worker left behind with its node the job would end 0 after a
// few steps) nor a result (the master watches the node no more in this round; once the node is
// taken back in, a result of the old attempt would be read as the new one's), says so in one
// line and, after one more heartbeat has reached the store, joins again as a new agent would --
// a new nonce, the next round: under --on-node-join live the master takes it back into the
// running round (Note [Joining a running round] in launcher/cluster/master/node_loss.h), else it
// waits for the next round.
std::optional<membership::Epoch> Agent::leftOutOf(int round) {
  if (config_.onNodeLoss != OnNodeLoss::Continue) return std::nullopt;
  const auto value = store_->tryMultiGet({epochStoreKey(round)})[0];
  if (!value) return std::nullopt;
  membership::Epoch e = membership::decodeEpoch(store::toString(*value));
  for (const auto& n : e.nodes) {
    if (n.node == setup_.node) return std::nullopt;
  }
  return e;
}

// This node's attempt of round `round`: its workers as the plan numbers them.
bool Agent::runRound(int round, const RoundPlan& plan, const PlannedNode& mine) {
  node_.nodeRank = mine.nodeRank;
  node_.numNodes = static_cast<int>(plan.nodes.size());
  node_.rankOffset = mine.rankOffset;
  node_.worldSize = plan.worldSize;
  node_.joinEpoch = plan.epoch;
  node_.masterAddr = plan.masterAddr;
  node_.masterPort = plan.masterPort;
  if (!supervisor_) startSupervisor(plan);
  supervisor_->setNode(node_);
  heartbeat_->setRound(round);
  AttemptHooks hooks;
  hooks.stopFd = heartbeat_->wakeFd();
  hooks.signalLosesNode = config_.onNodeLoss == OnNodeLoss::Continue;
  hooks.onTeardown = [this, round](const std::string& why) {
    try {
      if (leftOutOf(round)) return;  // Note [Left out of a running round]
      store_->compareSet(keys::stop(round), {}, store::toBytes(why));
      notifyMaster();
    } catch (const Error&) {
      // The store is gone: the heartbeat thread says so, and the master sees this node go silent.
    }
  };
  AttemptResult result = supervisor_->runAttempt(round, hooks);
  std::optional<membership::Epoch> out;
  try {
    out = leftOutOf(round);
  } catch (const Error&) {
    // The store is gone: report() says so.
  }
  if (out) {
    say(fmt::format("{}: round {} went on without this node in membership epoch {} ({}); its "
                    "workers ended; joining again{}",
                    me_, round, out->epoch, out->why,
                    config_.onNodeJoin == OnNodeJoin::Live
                        ? " (--on-node-join live)"
                        : fmt::format(" for round {}", round + 1)));
    // The master watches this node's heartbeat again once it is taken back in: a beat first,
    // from a connection that came through whatever left the node out.
    heartbeat_->awaitNextBeat(millis(config_.heartbeatTimeout + config_.heartbeatInterval));
    if (std::string why = heartbeat_->lost(); !why.empty()) {
      throw AgentExit{kExitInfrastructure, why};
    }
    return false;
  }
  for (auto& w : result.workers) w.host = label_;
  report(round, result);
  return true;
}

void Agent::startSupervisor(const RoundPlan& plan) {
  node_.runId = plan.runId;
  temporaryDir_ = config_.logDir.empty();
  node_.jobDir = jobDirFor(config_.logDir, effective_, node_.runId);
  JobPlan jp;
  jp.config = config_;
  jp.command = probe_.command;
  jp.node = node_;
  jp.logAllStreams = !temporaryDir_;
  jp.temporaryJobDir = temporaryDir_;
  jp.logHint = fmt::format("not kept on {} (HINT: pass --log-dir DIR to keep every "
                           "worker's output)",
                           label_);
  watcher_ = std::make_unique<monitor::Monitor>(config_.monitor, monitorContext(plan));
  jp.observer = watcher_.get();
  supervisor_ = std::make_unique<Supervisor>(std::move(jp));
  watcher_->start(nullptr);
}

monitor::MonitorContext Agent::monitorContext(const RoundPlan& plan) const {
  monitor::MonitorContext mc;
  mc.runId = plan.runId;
  mc.node = label_;
  int64_t id = -1;
  mc.nodeRank = parseInt64(setup_.node, &id) && id >= 0 && id < (1 << 20)
                    ? static_cast<int>(id)
                    : -1;  // node ids are host-list indices
  mc.numNodes = static_cast<int>(plan.nodes.size());
  mc.samplesNode = true;
  mc.aggregates = false;
  mc.localWorldSize = node_.localWorldSize;
  mc.worldSize = plan.worldSize;
  mc.maxRestarts = config_.maxRestarts;
  mc.storeHost = setup_.storeAddr;
  mc.storePort = setup_.storePort;
  mc.storeToken = setup_.token;
  mc.label = [this](const std::string& o) { return optionLabel(config_, o); };
  mc.nodeFigures = nodeFigureOptions(config_, node_);
  return mc;
}

void Agent::report(int round, const AttemptResult& result) {
  if (std::string why = heartbeat_->lost(); !why.empty()) throw AgentExit{kExitInfrastructure, why};
  if (!result.nodeLost.empty()) {
    // The master's epoch line carries its t= too: their difference is the time to go on.
    say(fmt::format("{}: round {}: reporting node_lost at t={:.6f}: {}", me_, round,
                    monotonicSeconds(), result.nodeLost));
  }
  try {
    store_->setString(keys::result(round, setup_.node), encodeResult(result));
    notifyMaster();
  } catch (const NetworkError& e) {
    // The store went with its host while this round's workers ended (they lost it first):
    // the same cause the heartbeat thread reports when it notices first.
    throw AgentExit{kExitInfrastructure, fmt::format("lost the store at {} while reporting round "
                                                     "{}'s result: {}",
                                                     store_->describe(), round, e.what())};
  }
}

void Agent::acknowledge(int round) {
  try {
    store_->setString(keys::ack(round, setup_.node), "1");
    store_->flush();
  } catch (const Error&) {
    // The master went on without it (it waits for acknowledgements only so long).
  }
}

void Agent::stopSupervision() {
  if (watcher_) watcher_->stop();
  supervisor_.reset();
  watcher_.reset();
  if (temporaryDir_ && !node_.jobDir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(node_.jobDir, ec);
  }
}

}  // namespace

EnvMap composeEnvironment(const EnvMap& environment, const EnvMap& forwarded) {
  EnvMap effective = environment;
  for (auto it = effective.begin(); it != effective.end();) {
    it = it->first.rfind(env::kLaunchOptionPrefix, 0) == 0 ? effective.erase(it) : std::next(it);
  }
  for (const auto& [k, v] : forwarded) effective[k] = v;
  return effective;
}

int runAgent(const AgentSetup& setup, const EnvMap& environment) {
  return Agent(setup, environment).run();
}

}  // namespace dtrain::launcher
