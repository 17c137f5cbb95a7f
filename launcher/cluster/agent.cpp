#include "launcher/cluster/agent.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>

#include "dtrain/base/error.h"
#include "dtrain/base/fault.h"
#include "dtrain/base/logging.h"
#include "dtrain/base/tcp_store.h"
#include "env_contract.h"
#include "launcher/cluster/heartbeat_thread.h"
#include "launcher/cluster/nccl_env.h"
#include "launcher/cluster/rendezvous.h"
#include "launcher/exit_codes.h"
#include "launcher/job/job.h"
#include "launcher/job/program.h"
#include "launcher/monitor/monitor.h"
#include "launcher/seconds.h"
#include "launcher/supervisor/output.h"
#include "launcher/supervisor/supervisor.h"
#include "net/net_interface.h"
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

// The value of `key`, waiting until `deadline`; throws AgentExit when the master ended the job,
// the heartbeat thread lost the store or launch was signalled meanwhile.
std::string awaitKey(store::Store& store, HeartbeatThread& heartbeat, const AgentSetup& setup,
                     const std::string& key, Clock::time_point deadline, const std::string& what) {
  while (true) {
    if (int sig = takePendingSignal()) {
      if (setup.onSignal) setup.onSignal(sig);
      throw AgentExit{128 + sig, fmt::format("received {} while waiting for {}",
                                             fault::signalName(sig), what)};
    }
    try {
      if (store.check({key})) return store.getString(key);
      if (store.check({keys::end()})) {
        auto [code, message] = decodeEnd(store.getString(keys::end()));
        try {
          store.setString(keys::endAck(setup.node), "1");
          store.flush();
        } catch (const Error&) {
          // The master went on without it (it waits for acknowledgements only so long).
        }
        throw AgentExit{code, message};
      }
      if (std::string why = heartbeat.lost(); !why.empty()) throw AgentExit{125, why};
      store.wait({key}, Millis(250));
      return store.getString(key);
    } catch (const TimeoutError&) {
    } catch (const NetworkError& e) {
      throw AgentExit{125, fmt::format("lost the store at {} while waiting for {}: {}",
                                       store.describe(), what, e.what())};
    }
    if (Clock::now() >= deadline) {
      throw AgentExit{kExitDeadline, fmt::format("timed out waiting for {} (key \"{}\" on the "
                                                 "store at {})", what, key, store.describe())};
    }
  }
}

}  // namespace

int runAgent(const AgentSetup& setup, const EnvMap& environment) {
  LaunchConfig config = setup.config;
  if (!config.linePrefixGiven) config.linePrefixTemplate = kDefaultMultiNodeLinePrefixTemplate;
  const std::string host = hostName();
  const std::string label = setup.label.empty() ? host : setup.label;
  const std::string me = fmt::format("launch (node {}, {})", setup.node, label);
  dtrain::log::setTag(fmt::format("[launch node {}]", setup.node));

  // What the workers will inherit: this node's environment under the master's forwarded one.
  EnvMap effective = environment;
  for (auto it = effective.begin(); it != effective.end();) {
    it = it->first.rfind(env::kLaunchOptionPrefix, 0) == 0 ? effective.erase(it) : std::next(it);
  }
  for (const auto& [k, v] : setup.forwarded) effective[k] = v;

  JoinInfo join;
  join.node = setup.node;
  join.requestedRank = setup.requestedRank;
  join.host = host;
  join.label = label;
  join.gpus = setup.gpus;
  join.launchVersion = launcherVersion();

  // Node facts. A problem here is reported to the master through the join record, so the job
  // ends naming this node instead of waiting for it.
  WorkerCommand command;
  InterfaceChoice iface;
  const int cpus = usableCpus();
  try {
    auto pathIt = effective.find("PATH");
    command = resolveWorkerCommand(workerCommandLine(config),
                                   pathIt != effective.end() ? pathIt->second : "/usr/bin:/bin",
                                   label);
    join.localWorldSize = setup.slots > 0          ? setup.slots
                          : !setup.gpus.empty()    ? static_cast<int>(setup.gpus.size())
                                                   : resolveNproc(config.nprocPerNode, cpus,
                                                                  visibleGpus(effective));
    iface = resolveSocketInterface(config.nccl, true, setup.storeAddr,
                                   optionLabel(config, "nccl-socket-ifname"));
    join.address = net::chooseBindAddress("", "the store's address", setup.storeAddr).address;
    if (!config.logDir.empty()) checkWritableDir(config.logDir, optionLabel(config, "log-dir"));
  } catch (const ProgramNotFound& e) {
    join.error = e.what();
    join.errorCode = 127;
  } catch (const ProgramNotExecutable& e) {
    join.error = e.what();
    join.errorCode = 126;
  } catch (const Error& e) {
    join.error = e.what();
    join.errorCode = dynamic_cast<const InvalidArgument*>(&e) ? 2 : 125;
  }

  blockLauncherSignals();
  store::TcpStoreOptions so;
  so.host = setup.storeAddr;
  so.port = static_cast<uint16_t>(setup.storePort);
  so.token = setup.token;
  so.timeout = millis(std::max(config.heartbeatTimeout, 1.0));
  // The first connection may wait for the store's host as long as the rendezvous does (a manual
  // node 0 may start last), in attempts of at most a second, so a signal or the master's end is
  // seen meanwhile; a refusal (another job's store, a different token) is final. A connection
  // lost later is the store lost: a reconnect gets --heartbeat-timeout, never the rendezvous
  // timeout.
  so.connectTimeout = millis(std::min(config.heartbeatTimeout, 1.0));
  std::unique_ptr<store::TcpStore> store;
  const auto connectDeadline = Clock::now() + millis(config.rdzvTimeout);
  std::string lastError;
  while (!store) {
    try {
      store = std::make_unique<store::TcpStore>(so);
      break;
    } catch (const NetworkError& e) {
      lastError = e.what();
    } catch (const TimeoutError& e) {
      lastError = e.what();
    } catch (const Error& e) {
      say(fmt::format("{}: the store at {}:{} refused this node: {} (exit 125)", me, so.host,
                      so.port, e.what()));
      return 125;
    }
    if (int sig = takePendingSignal()) {
      if (setup.onSignal) setup.onSignal(sig);
      say(fmt::format("{}: received {} while connecting to the store at {}:{}", me,
                      fault::signalName(sig), so.host, so.port));
      return 128 + sig;
    }
    if (setup.watchStdin && stdinEnded()) {
      say(fmt::format("{}: the master's launch is gone (its ssh session or pipe closed) while "
                      "this node was connecting to the store at {}:{} (exit 125)",
                      me, so.host, so.port));
      return 125;
    }
    if (Clock::now() >= connectDeadline) {
      say(fmt::format("{}: cannot reach the store at {}:{} within {:g} s (--rdzv-timeout): {}", me,
                      so.host, so.port, config.rdzvTimeout, lastError));
      return kExitDeadline;
    }
  }
  store::TcpStoreOptions mo = so;
  mo.connectTimeout = so.connectTimeout;
  HeartbeatThread heartbeat(mo, setup.node, millis(config.heartbeatInterval),
                            millis(config.heartbeatTimeout), setup.watchStdin);

  NodeContext node;
  node.host = label;
  node.cpuCount = cpus;
  node.storeAddr = setup.storeAddr;
  node.storePort = setup.storePort;
  node.storeToken = setup.token;
  node.gpuSlots = setup.gpus;
  node.inherited = environment;
  node.localWorldSize = join.localWorldSize;
  node.overlay = setup.forwarded;
  for (const auto& [k, v] : ncclEnvironment(config.nccl, iface, effective)) node.overlay[k] = v;

  // This node's part of watching the job (Note [Monitor roles] in launcher/monitor/monitor.h):
  // sample, warn, publish to the store; created with the supervisor, destroyed after it.
  std::unique_ptr<monitor::Monitor> watcher;
  std::unique_ptr<Supervisor> supervisor;
  bool temporaryDir = false;
  int code = 125;
  try {
    for (int round = 0;; ++round) {
      store->setString(keys::join(round, setup.node), encodeJoin(join));
      store->flush();
      const RoundPlan plan = decodePlan(
          awaitKey(*store, heartbeat, setup, keys::plan(round),
                   Clock::now() + millis(config.rdzvTimeout + config.heartbeatTimeout),
                   fmt::format("round {}'s plan from the master", round)));
      const PlannedNode* mine = plan.find(setup.node);
      AttemptResult result;
      if (mine) {
        node.nodeRank = mine->nodeRank;
        node.numNodes = static_cast<int>(plan.nodes.size());
        node.rankOffset = mine->rankOffset;
        node.worldSize = plan.worldSize;
        node.masterAddr = plan.masterAddr;
        node.masterPort = plan.masterPort;
        if (!supervisor) {
          node.runId = plan.runId;
          temporaryDir = config.logDir.empty();
          node.jobDir = jobDirFor(config.logDir, effective, node.runId);
          JobPlan jp;
          jp.config = config;
          jp.command = command;
          jp.node = node;
          jp.logAllStreams = !temporaryDir;
          jp.temporaryJobDir = temporaryDir;
          jp.logHint = fmt::format("not kept on {} (HINT: pass --log-dir DIR to keep every "
                                   "worker's output)", label);
          monitor::MonitorContext mc;
          mc.runId = plan.runId;
          mc.node = label;
          int64_t id = -1;
          mc.nodeRank = parseInt64(setup.node, &id) && id >= 0 && id < (1 << 20)
                            ? static_cast<int>(id) : -1;  // node ids are host-list indices
          mc.numNodes = static_cast<int>(plan.nodes.size());
          mc.samplesNode = true;
          mc.aggregates = false;
          mc.localWorldSize = node.localWorldSize;
          mc.worldSize = plan.worldSize;
          mc.maxRestarts = config.maxRestarts;
          mc.storeHost = setup.storeAddr;
          mc.storePort = setup.storePort;
          mc.storeToken = setup.token;
          mc.label = [&config](const std::string& o) { return optionLabel(config, o); };
          watcher = std::make_unique<monitor::Monitor>(config.monitor, mc);
          jp.observer = watcher.get();
          supervisor = std::make_unique<Supervisor>(std::move(jp));
          watcher->start(nullptr);
        }
        supervisor->setNode(node);
        heartbeat.setRound(round);
        AttemptHooks hooks;
        hooks.stopFd = heartbeat.wakeFd();
        hooks.onTeardown = [&](const std::string& why) {
          try {
            store->compareSet(keys::stop(round), {}, store::toBytes(why));
          } catch (const Error&) {
            // The store is gone: the heartbeat thread says so, and the master sees this node go silent.
          }
        };
        result = supervisor->runAttempt(round, hooks);
        for (auto& w : result.workers) w.host = label;
        if (std::string why = heartbeat.lost(); !why.empty()) throw AgentExit{125, why};
        try {
          store->setString(keys::result(round, setup.node), encodeResult(result));
          store->flush();
        } catch (const NetworkError& e) {
          // The store went with its host while this round's workers ended (they lost it first):
          // the same cause the heartbeat thread reports when it notices first.
          throw AgentExit{125, fmt::format("lost the store at {} while reporting round {}'s "
                                           "result: {}", store->describe(), round, e.what())};
        }
      }
      const std::string decision =
          awaitKey(*store, heartbeat, setup, keys::decision(round),
                   Clock::now() + millis(config.gracePeriod + 2 * config.heartbeatTimeout +
                                         config.rdzvTimeout),
                   fmt::format("the master's decision after round {}", round));
      try {
        store->setString(keys::ack(round, setup.node), "1");
        store->flush();
      } catch (const Error&) {
        // The master went on without it (it waits for acknowledgements only so long).
      }
      if (decision == "restart") continue;
      int64_t c = 125;
      if (decision.rfind("end ", 0) == 0) parseInt64(decision.substr(4), &c);
      code = static_cast<int>(c);
      break;
    }
  } catch (const AgentExit& e) {
    code = e.code;
    say(fmt::format("{}: {} (exit {})", me, e.message, e.code));
  } catch (const Error& e) {
    code = 125;
    say(fmt::format("{}: {} (exit 125)", me, e.what()));
  }
  if (watcher) watcher->stop();
  supervisor.reset();
  watcher.reset();
  if (temporaryDir && !node.jobDir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(node.jobDir, ec);
  }
  return code;
}

}  // namespace dtrain::launcher
