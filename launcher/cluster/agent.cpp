#include "launcher/cluster/agent.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "dtrain/base/error.h"
#include "dtrain/base/fault.h"
#include "dtrain/base/logging.h"
#include "dtrain/base/tcp_store.h"
#include "env_contract.h"
#include "launcher/cluster/nccl_env.h"
#include "launcher/cluster/rendezvous.h"
#include "launcher/job/job.h"
#include "launcher/job/launch_args.h"
#include "launcher/job/program.h"
#include "launcher/monitor/monitor.h"
#include "launcher/supervisor/output.h"
#include "launcher/supervisor/supervisor.h"
#include "net/net_interface.h"
#include "parse_int.h"

namespace dtrain::launcher {

const char* launcherVersion();

namespace {

using Clock = std::chrono::steady_clock;
using store::Millis;
// The job monitor (launcher/monitor); this file's own Monitor is the heartbeat thread below.
namespace jobmon = ::dtrain::launcher::monitor;

Millis millis(double seconds) { return Millis(static_cast<int64_t>(seconds * 1000)); }

void say(const std::string& line) {
  std::string text = line + "\n";
  writeAll(STDERR_FILENO, text.data(), text.size());
}

// True once stdin (the master's pipe, or its ssh channel) has ended; reads and drops what came.
bool stdinEnded() {
  pollfd p{STDIN_FILENO, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  char buf[256];
  ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
}

// Note [Agent monitor]
// ~~~~~~~~~~~~~~~~~~~~
// One thread per agent, on a store connection of its own (the main thread's may sit in a long
// wait): it increments the node's heartbeat counter every --heartbeat-interval and in between
// waits on the current round's stop key, so another node's failure reaches this node's workers
// within one store round trip. Waits are cut into slices of at most 100 ms (a server answers a
// wait at its deadline, so a slice also proves the store alive). It wakes the supervisor through
// an eventfd when the stop key appears, when the store has not answered for --heartbeat-timeout
// ("lost the store"), or when stdin ends (the master, or its ssh session, is gone).
//
// The master writes every round's stop key before its decision (Note [Rendezvous protocol]), so
// after a round the monitor is not in a store wait but in pause() on a condition variable, and
// the agent ends without waiting out a slice. A wake belongs to one round: setRound() and the
// monitor's "stop seen, wake" step hold mutex_, and setRound() discards a wake left from the
// round before, so a late stop of round R never stops round R+1's workers.
class Monitor {
 public:
  Monitor(store::TcpStoreOptions options, std::string node, const LaunchConfig& config,
          bool watchStdin)
      : options_(std::move(options)), node_(std::move(node)), interval_(millis(config.heartbeatInterval)),
        timeout_(millis(config.heartbeatTimeout)), watchStdin_(watchStdin) {
    wakeFd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    DTRAIN_CHECK(wakeFd_ >= 0, "launch: eventfd failed: {}", std::strerror(errno));
    thread_ = std::thread([this] { loop(); });
  }
  ~Monitor() {
    {
      std::lock_guard<std::mutex> g(mutex_);
      quit_ = true;
    }
    changed_.notify_all();
    if (thread_.joinable()) thread_.join();
    ::close(wakeFd_);
  }

  int wakeFd() const { return wakeFd_; }
  // The round whose stop key wakes wakeFd() from now on; a wake left from an earlier round is
  // discarded.
  void setRound(int round) {
    {
      std::lock_guard<std::mutex> g(mutex_);
      round_ = round;
      uint64_t stale = 0;
      (void)!::read(wakeFd_, &stale, sizeof stale);
    }
    changed_.notify_all();
  }
  // Why this node must stop on its own (store lost, master gone); empty while all is well.
  std::string lost() {
    std::lock_guard<std::mutex> g(mutex_);
    return lost_;
  }

 private:
  void wake() {
    uint64_t one = 1;
    (void)!::write(wakeFd_, &one, sizeof one);
  }
  void fail(const std::string& why) {
    {
      std::lock_guard<std::mutex> g(mutex_);
      if (lost_.empty()) lost_ = why;
    }
    wake();
  }
  // Sleeps up to `d`; returns early when the round changes or the agent ends.
  void pause(Millis d, int round) {
    std::unique_lock<std::mutex> g(mutex_);
    changed_.wait_for(g, d, [&] { return quit_ || round_ != round; });
  }
  int round() {
    std::lock_guard<std::mutex> g(mutex_);
    return round_;
  }
  bool quitting() {
    std::lock_guard<std::mutex> g(mutex_);
    return quit_;
  }

  void loop() {
    const std::string where = fmt::format("{}:{}", options_.host, options_.port);
    const Millis slice = std::min<Millis>(interval_, Millis(100));
    std::unique_ptr<store::TcpStore> store;
    auto lastOk = Clock::now();
    auto lastBeat = Clock::time_point{};
    int stopSeen = -1;
    while (!quitting()) {
      if (watchStdin_ && stdinEnded()) {
        fail("the master's launch is gone (its ssh session or pipe closed)");
        return;
      }
      const int round = this->round();
      try {
        if (!store) store = std::make_unique<store::TcpStore>(options_);
        if (Clock::now() - lastBeat >= interval_) {
          store->add(keys::heartbeat(node_), 1);
          lastBeat = lastOk = Clock::now();
        }
        if (round < 0 || stopSeen == round) {
          pause(slice, round);
          continue;
        }
        const auto asked = Clock::now();
        try {
          store->wait({keys::stop(round)}, slice);
          stopSeen = round;
          std::lock_guard<std::mutex> g(mutex_);
          if (round_ == round) wake();
        } catch (const TimeoutError&) {
          // The server answers a wait at its deadline; a partitioned one does not.
          if (Clock::now() - asked > slice + Millis(1000)) throw;
        }
        lastOk = Clock::now();
      } catch (const Error& e) {
        if (quitting()) return;
        if (Clock::now() - lastOk >= timeout_) {
          fail(fmt::format("lost the store at {}: no answer for {:.1f} s ({})", where,
                           std::chrono::duration<double>(Clock::now() - lastOk).count(), e.what()));
          return;
        }
        store.reset();  // reconnect on the next turn
        pause(Millis(100), round);
      }
    }
  }

  store::TcpStoreOptions options_;
  std::string node_;
  Millis interval_;
  Millis timeout_;
  bool watchStdin_;
  int wakeFd_ = -1;
  std::mutex mutex_;
  std::condition_variable changed_;  // round_ or quit_ changed
  bool quit_ = false;                // guarded by mutex_
  int round_ = -1;                   // guarded by mutex_
  std::string lost_;                 // guarded by mutex_
  std::thread thread_;
};

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
// the monitor lost the store or launch was signalled meanwhile.
std::string awaitKey(store::Store& store, Monitor& monitor, const AgentSetup& setup,
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
      if (std::string why = monitor.lost(); !why.empty()) throw AgentExit{125, why};
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

remote::Records agentPlanRecords(const AgentSetup& s) {
  remote::Records r;
  for (const auto& [name, value] : s.config.appliedOptions) r.emplace_back("option", name + "=" + value);
  r.emplace_back("node", s.node);
  r.emplace_back("requested-rank", std::to_string(s.requestedRank));
  r.emplace_back("label", s.label);
  r.emplace_back("slots", std::to_string(s.slots));
  std::string gpus;
  for (int g : s.gpus) gpus += (gpus.empty() ? "" : ",") + std::to_string(g);
  r.emplace_back("gpus", gpus);
  r.emplace_back("store", s.storeAddr + ":" + std::to_string(s.storePort));
  r.emplace_back("token", s.token);
  for (const auto& [key, value] : s.forwarded) r.emplace_back("env", key + "=" + value);
  return r;
}

AgentSetup agentSetupFromRecords(const remote::Records& records, const LaunchConfig& base) {
  AgentSetup s;
  s.config = base;
  s.watchStdin = true;
  auto number = [](const std::string& name, const std::string& v) {
    int64_t n = 0;
    DTRAIN_CHECK_ARG(parseInt64(v, &n) && n >= 0 && n <= 1 << 20, "agent plan: {} \"{}\" is not "
                     "a number", name, v);
    return static_cast<int>(n);
  };
  for (const auto& [name, value] : records) {
    if (name == "option") {
      size_t eq = value.find('=');
      DTRAIN_CHECK_ARG(eq != std::string::npos, "agent plan: option record \"{}\"", value);
      const std::string option = value.substr(0, eq);
      applyLaunchOption(s.config, option, value.substr(eq + 1), "--" + option + " (from the master)");
    } else if (name == "node") {
      s.node = value;
    } else if (name == "requested-rank") {
      s.requestedRank = number(name, value);
    } else if (name == "label") {
      s.label = value;
    } else if (name == "slots") {
      s.slots = number(name, value);
    } else if (name == "gpus") {
      if (!value.empty()) s.gpus = parseRankList(value, "agent plan gpus");
    } else if (name == "store") {
      std::tie(s.storeAddr, s.storePort) = parseEndpoint(value, "agent plan store");
    } else if (name == "mode") {
      s.mode = value;
    } else if (name == "master") {
      s.master = value;
    } else if (name == "token") {
      s.token = value;
    } else if (name == "env") {
      size_t eq = value.find('=');
      DTRAIN_CHECK_ARG(eq != std::string::npos && eq > 0, "agent plan: env record without '='");
      s.forwarded[value.substr(0, eq)] = value.substr(eq + 1);
    } else {
      DTRAIN_THROW(InvalidArgument, "agent plan: unknown record \"{}\"; HINT: the master runs "
                   "another launch version", name);
    }
  }
  s.config.agent = true;
  DTRAIN_CHECK_ARG(!s.node.empty() && !s.storeAddr.empty() && s.storePort > 0,
                   "agent plan: no node id or store endpoint");
  return s;
}

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
  Monitor monitor(mo, setup.node, config, setup.watchStdin);

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
  std::unique_ptr<jobmon::Monitor> watcher;
  std::unique_ptr<Supervisor> supervisor;
  bool temporaryDir = false;
  int code = 125;
  try {
    for (int round = 0;; ++round) {
      store->setString(keys::join(round, setup.node), encodeJoin(join));
      store->flush();
      const RoundPlan plan = decodePlan(
          awaitKey(*store, monitor, setup, keys::plan(round),
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
          jobmon::MonitorContext mc;
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
          watcher = std::make_unique<jobmon::Monitor>(config.monitor, mc);
          jp.observer = watcher.get();
          supervisor = std::make_unique<Supervisor>(std::move(jp));
          watcher->start(nullptr);
        }
        supervisor->setNode(node);
        monitor.setRound(round);
        AttemptHooks hooks;
        hooks.stopFd = monitor.wakeFd();
        hooks.onTeardown = [&](const std::string& why) {
          try {
            store->compareSet(keys::stop(round), {}, store::toBytes(why));
          } catch (const Error&) {
            // The store is gone: the monitor says so, and the master sees this node go silent.
          }
        };
        result = supervisor->runAttempt(round, hooks);
        for (auto& w : result.workers) w.host = label;
        if (std::string why = monitor.lost(); !why.empty()) throw AgentExit{125, why};
        try {
          store->setString(keys::result(round, setup.node), encodeResult(result));
          store->flush();
        } catch (const NetworkError& e) {
          // The store went with its host while this round's workers ended (they lost it first):
          // the same cause the monitor reports when it notices first.
          throw AgentExit{125, fmt::format("lost the store at {} while reporting round {}'s "
                                           "result: {}", store->describe(), round, e.what())};
        }
      }
      const std::string decision =
          awaitKey(*store, monitor, setup, keys::decision(round),
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
