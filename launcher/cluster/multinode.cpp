#include "launcher/cluster/multinode.h"

#include <arpa/inet.h>
#include <limits.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/ranges.h>

#include "dtrain/base/error.h"
#include "dtrain/base/fault.h"
#include "dtrain/base/logging.h"
#include "dtrain/base/tcp_store.h"
#include "env_contract.h"
#include "launcher/cluster/coordinator.h"
#include "launcher/cluster/forwarded_env.h"
#include "launcher/cluster/preflight.h"
#include "launcher/cluster/remote/remote_command.h"
#include "launcher/cluster/remote/session.h"
#include "launcher/job/job.h"
#include "launcher/job/program.h"
#include "launcher/monitor/monitor.h"
#include "launcher/supervisor/supervisor.h"
#include "net/net_interface.h"

namespace dtrain::launcher {

const char* launcherVersion();

namespace {

// How long an agent may take to exit after the master's decision, before SIGTERM.
constexpr double kSessionGraceSeconds = 5;

// Options only the master acts on; the agents get the rest of the job's options.
bool masterOnlyOption(const std::string& name) {
  static const char* const kMasterOnly[] = {
      "hostfile",   "hosts",       "include",     "exclude",        "token-file",
      "ssh-port",   "ssh-identity", "ssh-config", "ssh-option",     "ssh-connect-timeout",
      "ssh-accept-new-host-keys",  "remote-launch", "remote-cwd",  "check",
      "dry-run",    "node-rank",   "nnodes",      "rdzv-endpoint",  "master-addr",
      "master-port", "agent",      "run-id",      "env",            "rdzv-backend",
      "standalone",
  };
  return std::find_if(std::begin(kMasterOnly), std::end(kMasterOnly),
                      [&](const char* o) { return name == o; }) != std::end(kMasterOnly);
}

std::string readTextFile(const std::string& path, const std::string& label) {
  std::ifstream in(path, std::ios::binary);
  DTRAIN_CHECK_ARG(in.good(), "{} {}: cannot read it: {}", label, quoteValue(path),
                   std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool isLocalAddress(const std::string& address) {
  return net::isLoopbackHost(address) || !net::interfaceOfAddress(address).empty();
}

// The hosts' addresses, in list order. Names are looked up at once on a few threads (a DNS
// answer may take a while, and hundreds of hosts one after the other would delay every ssh
// connection); addresses are taken as they are. The first host in list order that cannot be
// resolved is the error.
std::vector<std::string> resolveHosts(const std::vector<HostEntry>& hosts) {
  constexpr size_t kResolverThreads = 16;
  std::vector<std::string> names;
  std::vector<std::string> out(hosts.size());
  std::vector<std::exception_ptr> errors(hosts.size());
  std::vector<size_t> pending;
  for (size_t i = 0; i < hosts.size(); ++i) {
    names.push_back(hosts[i].host.substr(hosts[i].host.find('@') + 1));  // user@host
    in_addr a4{};
    if (::inet_pton(AF_INET, names[i].c_str(), &a4) == 1) {
      out[i] = names[i];
    } else {
      pending.push_back(i);
    }
  }
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k; (k = next++) < pending.size();) {
      const size_t i = pending[k];
      try {
        out[i] = resolveAddress(names[i], fmt::format("host {}", hosts[i].host));
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  if (pending.size() <= 1) {
    work();
  } else {
    std::vector<std::thread> threads;
    for (size_t t = 0; t < std::min(kResolverThreads, pending.size()); ++t) threads.emplace_back(work);
    for (auto& t : threads) t.join();
  }
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return out;
}

std::string selfPath() {
  char buf[PATH_MAX] = {};
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  DTRAIN_CHECK(n > 0, "launch: cannot read /proc/self/exe: {}", std::strerror(errno));
  return std::string(buf, static_cast<size_t>(n));
}

std::string currentDir() {
  char buf[PATH_MAX] = {};
  DTRAIN_CHECK(::getcwd(buf, sizeof buf) != nullptr, "launch: getcwd failed: {}",
               std::strerror(errno));
  return buf;
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

std::vector<std::string> environmentFor(const EnvMap& environment) {
  std::vector<std::string> out;
  for (const auto& [k, v] : environment) {
    if (k.rfind(env::kLaunchOptionPrefix, 0) == 0 || k == env::kStoreToken) continue;
    out.push_back(k + "=" + v);
  }
  return out;
}

}  // namespace

MultiNodePlan planMultiNode(const LaunchConfig& config, const EnvMap& environment) {
  MultiNodePlan plan;
  plan.fanOut = !config.hostfile.empty() || !config.hosts.empty();
  plan.runId = config.runId.empty() ? newRunId() : config.runId;
  plan.masterPort = config.masterPort > 0 ? config.masterPort : kDefaultMultiNodeMasterPort;
  plan.storePort = config.rdzvPort > 0 ? config.rdzvPort : kDefaultMultiNodeStorePort;
  plan.launchPath = config.remoteLaunch.empty() ? selfPath() : config.remoteLaunch;
  plan.cwd = config.remoteCwd.empty() ? currentDir() : config.remoteCwd;

  // The environment the agents get: docs/design.md's list, .dtrain_env, --env.
  std::vector<std::pair<std::string, std::string>> dotEnv;
  if (::access(kDotEnvFile, F_OK) == 0) {
    dotEnv = parseDotEnv(readTextFile(kDotEnvFile, "the environment file"),
                         currentDir() + "/" + kDotEnvFile);
  }
  // Fan-out: what the master forwards. Manual: every node has its own environment, and only
  // its .dtrain_env and --env are laid over it.
  plan.forwarded = forwardedEnvironment(plan.fanOut ? environment : EnvMap{}, dotEnv, config.env);

  if (plan.fanOut) {
    std::vector<HostEntry> hosts =
        config.hostfile.empty()
            ? parseHostsOption(config.hosts, optionLabel(config, "hosts"))
            : parseHostfile(readTextFile(config.hostfile, optionLabel(config, "hostfile")),
                            optionLabel(config, "hostfile") + " " + quoteValue(config.hostfile));
    const int defaultSlots =
        config.nprocPerNode.kind == NprocSpec::Kind::Count ? config.nprocPerNode.count : 0;
    hosts = applyHostFilters(
        hosts, config.include.empty() ? std::vector<HostFilterTerm>{}
                                      : parseHostFilter(config.include, optionLabel(config, "include")),
        config.exclude.empty() ? std::vector<HostFilterTerm>{}
                               : parseHostFilter(config.exclude, optionLabel(config, "exclude")),
        defaultSlots, optionLabel(config, "include"), optionLabel(config, "exclude"));
    // --nnodes N (or MIN:MAX) takes the first MAX hosts; by default every host of the list.
    const bool nnodesGiven = config.maxNodes > 1 || config.minNodes > 1;
    plan.maxNodes = nnodesGiven ? std::min<int>(config.maxNodes, static_cast<int>(hosts.size()))
                                : static_cast<int>(hosts.size());
    plan.minNodes = nnodesGiven ? config.minNodes : plan.maxNodes;
    DTRAIN_CHECK_ARG(plan.minNodes <= static_cast<int>(hosts.size()),
                     "{} {}: the host list has only {} host{}", optionLabel(config, "nnodes"),
                     plan.minNodes, hosts.size(), hosts.size() == 1 ? "" : "s");
    hosts.resize(static_cast<size_t>(plan.maxNodes));
    std::string firstRemote;
    const std::vector<std::string> addresses = resolveHosts(hosts);
    for (size_t i = 0; i < hosts.size(); ++i) {
      const HostEntry& h = hosts[i];
      PlannedHost p;
      p.entry = h;
      p.address = addresses[i];
      p.local = isLocalAddress(p.address);
      if (!p.local && firstRemote.empty()) firstRemote = p.address;
      plan.hosts.push_back(p);
    }
    if (!config.rdzvHost.empty()) {
      plan.storeAddr = resolveAddress(config.rdzvHost, optionLabel(config, "rdzv-endpoint"));
      DTRAIN_CHECK_ARG(isLocalAddress(plan.storeAddr),
                       "{} {}: the master hosts the store, but {} is not an address of this "
                       "host; HINT: give one of its addresses (`ip -4 addr`), or leave the option "
                       "out", optionLabel(config, "rdzv-endpoint"), config.rdzvHost, plan.storeAddr);
    } else if (!firstRemote.empty()) {
      plan.storeAddr = net::chooseBindAddress("", "the route toward the hosts", firstRemote).address;
    } else {
      plan.storeAddr = "127.0.0.1";
    }
    plan.hostsStore = true;
    plan.token = newJobToken();
    return plan;
  }

  // Manual: every node is started by hand (or by a scheduler) with the same options.
  plan.minNodes = config.minNodes;
  plan.maxNodes = config.maxNodes;
  plan.storeAddr = resolveAddress(config.rdzvHost, optionLabel(config, "rdzv-endpoint"));
  plan.hostsStore = config.nodeRank == 0;
  if (!config.tokenFile.empty()) {
    plan.token = trimmed(readTextFile(config.tokenFile, optionLabel(config, "token-file")));
    DTRAIN_CHECK_ARG(!plan.token.empty(), "{} {} is empty", optionLabel(config, "token-file"),
                     quoteValue(config.tokenFile));
  } else if (auto it = environment.find(env::kStoreToken); it != environment.end()) {
    plan.token = it->second;
  }
  DTRAIN_CHECK_ARG(!plan.token.empty() || net::isLoopbackHost(plan.storeAddr),
                   "a store at {} (off loopback) needs a job token, and neither --token-file nor "
                   "{} is given: anyone who reaches the port could join the job; HINT: make one "
                   "token and give it to every node, e.g. `openssl rand -hex 32 > job.token` (copy "
                   "it to each node), then `launch --token-file job.token ...`, or export {} on "
                   "every node",
                   plan.storeAddr, env::kStoreToken, env::kStoreToken);
  if (plan.hostsStore) {
    DTRAIN_CHECK_ARG(isLocalAddress(plan.storeAddr),
                     "{} {}: node rank 0 hosts the store, but {} is not an address of this host "
                     "({}); HINT: run node rank 0 on the host named by --rdzv-endpoint",
                     optionLabel(config, "rdzv-endpoint"), config.rdzvHost, plan.storeAddr,
                     hostName());
  }
  return plan;
}

AgentSetup agentSetupFor(const LaunchConfig& config, const MultiNodePlan& plan, int index) {
  AgentSetup s;
  s.config = config;
  s.config.appliedOptions.clear();
  for (const auto& [name, value] : config.appliedOptions) {
    if (!masterOnlyOption(name)) s.config.appliedOptions.emplace_back(name, value);
  }
  s.config.env.clear();  // in `forwarded`, with .dtrain_env
  s.node = std::to_string(index);
  s.requestedRank = index;
  if (plan.fanOut) {
    const PlannedHost& h = plan.hosts.at(static_cast<size_t>(index));
    s.label = h.entry.host;
    s.slots = h.entry.gpus.empty() ? h.entry.slots : 0;
    s.gpus = h.entry.gpus;
  }
  s.storeAddr = plan.storeAddr;
  s.storePort = plan.storePort;
  s.token = plan.token;
  s.forwarded = plan.forwarded;
  return s;
}

std::vector<std::string> agentCommand(const LaunchConfig& config, const MultiNodePlan& plan,
                                      int index) {
  const PlannedHost& h = plan.hosts.at(static_cast<size_t>(index));
  std::vector<std::string> argv{h.local ? selfPath() : plan.launchPath, "--agent", "--",
                                config.program};
  argv.insert(argv.end(), config.programArgs.begin(), config.programArgs.end());
  if (h.local) return argv;
  return remote::sshArgv(config.ssh, h.entry.host, remote::remoteShellCommand(plan.cwd, argv));
}

namespace {

std::string formatMultiNodeDryRun(const LaunchConfig& config, const MultiNodePlan& plan) {
  std::string out = fmt::format(
      "launch --dry-run: nothing was started. A {} job of {} node{} (run id {}): store at {}:{} "
      "hosted by {}, MASTER_PORT {}, token <redacted>.\n",
      plan.fanOut ? "fan-out" : "manual", plan.minNodes == plan.maxNodes
                                              ? std::to_string(plan.maxNodes)
                                              : fmt::format("{}:{}", plan.minNodes, plan.maxNodes),
      plan.maxNodes == 1 ? "" : "s", plan.runId, plan.storeAddr, plan.storePort,
      plan.fanOut ? "this launch" : "node rank 0", plan.masterPort);
  out += "Every node's workers get, over their own environment:\n";
  for (const auto& [k, v] : redacted(plan.forwarded)) out += "    " + k + "=" + v + "\n";
  out += fmt::format("NCCL: --nccl-socket-ifname {}{}{}{}\n", config.nccl.socketIfname,
                     config.nccl.ibDisable ? ", NCCL_IB_DISABLE=1" : "",
                     config.nccl.debug.empty() ? "" : ", NCCL_DEBUG=" + config.nccl.debug,
                     config.nccl.debugSubsys.empty() ? "" : ", NCCL_DEBUG_SUBSYS=" + config.nccl.debugSubsys);
  for (size_t i = 0; i < plan.hosts.size(); ++i) {
    const PlannedHost& h = plan.hosts[i];
    out += fmt::format("node {} {} ({}{}), {}:\n  command: {}\n", i, h.entry.host, h.address,
                       h.local ? ", this host" : "",
                       !h.entry.gpus.empty() ? fmt::format("{} workers, CUDA_VISIBLE_DEVICES={}",
                                                           h.entry.gpus.size(),
                                                           fmt::join(h.entry.gpus, ","))
                       : h.entry.slots > 0   ? fmt::format("{} workers", h.entry.slots)
                                             : "--nproc-per-node workers",
                       shellQuote(agentCommand(config, plan, static_cast<int>(i))));
  }
  if (!plan.fanOut) {
    out += fmt::format("this node: node rank {}{}\n", config.nodeRank,
                       plan.hostsStore ? " (hosts the store and coordinates)" : "");
  }
  return out;
}

// The master's monitor (Note [Monitor roles] in launcher/monitor/monitor.h): it aggregates what
// the agents publish, serves --metrics-port, writes --metrics-file, judges stalls. Binding the
// port here makes a busy one a usage error before any node starts.
std::unique_ptr<monitor::Monitor> masterMonitor(const LaunchConfig& config,
                                                const MultiNodePlan& plan) {
  monitor::MonitorContext c;
  c.runId = plan.runId;
  c.node = hostName();
  c.nodeRank = -1;
  c.numNodes = plan.maxNodes;
  c.samplesNode = false;  // each node's agent samples its node, this one's too
  c.aggregates = true;
  c.maxRestarts = config.maxRestarts;
  c.storeHost = plan.storeAddr;
  c.storePort = plan.storePort;
  c.storeToken = plan.token;
  c.label = [&config](const std::string& o) { return optionLabel(config, o); };
  return std::make_unique<monitor::Monitor>(config.monitor, c);
}

CoordinatorOptions coordinatorOptions(const LaunchConfig& config, const MultiNodePlan& plan) {
  CoordinatorOptions co;
  for (int i = 0; i < plan.maxNodes; ++i) {
    co.nodes.push_back({std::to_string(i),
                        plan.fanOut ? plan.hosts[static_cast<size_t>(i)].entry.host
                                    : fmt::format("node rank {}", i),
                        i});
  }
  co.minNodes = plan.minNodes;
  co.maxNodes = plan.maxNodes;
  co.rdzvTimeout = config.rdzvTimeout;
  co.heartbeatTimeout = config.heartbeatTimeout;
  co.gracePeriod = config.gracePeriod;
  co.maxRestarts = config.maxRestarts;
  co.masterPort = plan.masterPort;
  co.runId = plan.runId;
  co.self.host = hostName();
  co.self.launchVersion = launcherVersion();
  co.storeWhere = fmt::format("{}:{}", plan.storeAddr, plan.storePort);
  co.logHint = "not kept (HINT: pass --log-dir DIR to keep every worker's output on its node)";
  return co;
}

std::shared_ptr<store::TcpStore> masterStoreClient(const MultiNodePlan& plan) {
  store::TcpStoreOptions so;
  so.host = plan.storeAddr;
  so.port = static_cast<uint16_t>(plan.storePort);
  so.token = plan.token;
  return std::make_shared<store::TcpStore>(so);
}

// Note [Fan-out master loop]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// The master's main thread owns the sessions (one per host: ssh, or a child agent) and the
// console; the coordinator runs on a thread of its own, on the store. The main thread sleeps in
// one poll() over everything that can happen: a signal (signalfd), output of a session, a
// session's end (its pidfd), and an eventfd the coordinator writes when it has nodes to start
// again or has ended the job. Nothing is looked at on a timer, so the master neither waits a
// tick to notice an ended session nor to exit after the decision. (Without pidfd_open, sessions
// are reaped on a 20 ms timer instead.) The ssh sessions start before anything else of the
// master, so the connections, the slowest part of a fan-out, run while the rest is set up.
int runFanOut(const LaunchConfig& config, const MultiNodePlan& plan, const EnvMap& environment) {
  std::unique_ptr<monitor::Monitor> watcher = masterMonitor(config, plan);
  const std::vector<std::string> childEnv = environmentFor(environment);
  std::vector<std::unique_ptr<remote::Session>> sessions(plan.hosts.size());
  auto start = [&](size_t i) {
    const std::string records = remote::encodePlan(
        agentPlanRecords(agentSetupFor(config, plan, static_cast<int>(i))));
    sessions[i] = std::make_unique<remote::Session>(
        std::to_string(i), plan.hosts[i].entry.host,
        agentCommand(config, plan, static_cast<int>(i)), childEnv, records);
  };
  for (size_t i = 0; i < plan.hosts.size(); ++i) start(i);

  const int wakeFd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  DTRAIN_CHECK(wakeFd >= 0, "launch: eventfd failed: {}", std::strerror(errno));
  auto wake = [wakeFd] {
    uint64_t one = 1;
    (void)!::write(wakeFd, &one, sizeof one);
  };
  CoordinatorOptions co = coordinatorOptions(config, plan);
  co.wake = wake;
  co.observer = watcher.get();
  Coordinator coordinator(masterStoreClient(plan), co);
  watcher->start(&coordinator);

  std::atomic<bool> done{false};
  int code = 125;
  std::thread thread([&] {
    try {
      code = coordinator.run();
    } catch (const Error& e) {
      say(fmt::format("launch: error: {} (exit 125)", e.what()));
    }
    done = true;
    wake();
  });

  sigset_t set;
  sigemptyset(&set);
  for (int s : kForwardedSignals) sigaddset(&set, s);
  int sfd = ::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  int signals = 0;
  while (!done) {
    std::vector<pollfd> fds{{sfd, POLLIN, 0}, {wakeFd, POLLIN, 0}};
    bool timer = false;
    for (const auto& s : sessions) {
      if (!s || s->exited()) continue;
      for (int fd : {s->stdoutFd(), s->stderrFd(), s->exitFd()}) {
        if (fd >= 0) fds.push_back({fd, POLLIN, 0});
      }
      timer = timer || s->exitFd() < 0;
    }
    ::poll(fds.data(), fds.size(), timer ? 20 : -1);
    uint64_t woken = 0;
    (void)!::read(wakeFd, &woken, sizeof woken);
    signalfd_siginfo si{};
    while (sfd >= 0 && ::read(sfd, &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
      const int sig = static_cast<int>(si.ssi_signo);
      say(++signals == 1
          ? fmt::format("launch: received {}; stopping the workers on every node (SIGTERM, "
                        "SIGKILL after {:g} s)", fault::signalName(sig), config.gracePeriod)
          : fmt::format("launch: received {} again; ending every node's agent now",
                        fault::signalName(sig)));
      coordinator.requestStop(sig);
      if (signals > 1) {
        for (auto& s : sessions) {
          if (s && !s->exited()) ::kill(-s->pid(), SIGTERM);
        }
      }
    }
    for (auto& s : sessions) {
      if (!s) continue;
      s->drain();
      if (s->exited() || !s->reap()) continue;
      std::string last;
      for (const auto& l : s->stderrTail()) last += (last.empty() ? "" : " | ") + l;
      const PlannedHost& h = plan.hosts[std::stoul(s->node())];
      std::string why = h.local ? fmt::format("its agent (a child of the master) {}", s->describeExit())
                                : fmt::format("its ssh session {}", s->describeExit());
      if (!last.empty()) why += ": " + last;
      if (!h.local) {
        std::string hint = remote::sshFailureHint(h.entry.host, last, config.ssh);
        if (!hint.empty()) why += "; " + hint;
      }
      coordinator.nodeGone(s->node(), why);
    }
    for (const auto& node : coordinator.takeGoneNodes()) {
      try {
        start(std::stoul(node));
      } catch (const Error& e) {
        coordinator.nodeGone(node, fmt::format("its agent could not be started again: {}", e.what()));
      }
    }
  }
  thread.join();
  watcher->stop();
  if (sfd >= 0) ::close(sfd);
  ::close(wakeFd);
  // The agents have the decision and go; a lost node's session is not waited for.
  const std::set<std::string> lost = coordinator.lostNodes();
  for (auto& s : sessions) {
    if (!s) continue;
    s->closeStdin();
    if (lost.count(s->node()) && !s->exited()) ::kill(-s->pid(), SIGTERM);
  }
  for (auto& s : sessions) {
    if (s) s->finish(kSessionGraceSeconds);
  }
  return code;
}

}  // namespace

int runMultiNode(const LaunchConfig& config, const EnvMap& environment) {
  MultiNodePlan plan = planMultiNode(config, environment);
  if (config.check) {
    DTRAIN_CHECK_ARG(plan.fanOut, "--check checks the nodes of a host list; HINT: give "
                     "--hostfile FILE or --hosts A,B (in manual mode, run it from one node with "
                     "the list of all)");
    return runPreflight(config, plan, environment);
  }
  if (config.dryRun) {
    std::string text = formatMultiNodeDryRun(config, plan);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  blockLauncherSignals();  // before any thread: signals go to the signalfds
  std::unique_ptr<store::TcpStoreServer> server;
  if (plan.hostsStore) {
    store::TcpStoreServerOptions so;
    so.host = plan.storeAddr;
    so.port = static_cast<uint16_t>(plan.storePort);
    so.token = plan.token;
    server = store::TcpStoreServer::start(so);
    DTRAIN_LOG(Info, "launch: run {}: store at {}:{}", plan.runId, plan.storeAddr, plan.storePort);
  }
  if (plan.fanOut) {
    int code = runFanOut(config, plan, environment);
    server->stop();
    return code;
  }

  // Manual: this node's agent here; node rank 0 also coordinates.
  AgentSetup setup = agentSetupFor(config, plan, config.nodeRank);
  std::unique_ptr<monitor::Monitor> watcher;  // node rank 0's, the master's
  std::unique_ptr<Coordinator> coordinator;
  std::thread thread;
  int code = 125;
  if (plan.hostsStore) {
    watcher = masterMonitor(config, plan);
    CoordinatorOptions co = coordinatorOptions(config, plan);
    co.observer = watcher.get();
    coordinator = std::make_unique<Coordinator>(masterStoreClient(plan), co);
    watcher->start(coordinator.get());
    thread = std::thread([&] {
      try {
        code = coordinator->run();
      } catch (const Error& e) {
        say(fmt::format("launch: error: {} (exit 125)", e.what()));
      }
    });
    setup.onSignal = [&](int sig) { coordinator->requestStop(sig); };
  }
  int agentCode = 125;
  try {
    agentCode = runAgent(setup, environment);
  } catch (const Error& e) {
    if (!thread.joinable()) throw;
    say(fmt::format("launch: error: {} (exit 125)", e.what()));
  }
  if (thread.joinable()) {
    // Normally the coordinator has decided already; if this node's agent ended first for a
    // reason of its own, the job cannot go on without node rank 0: say so, and the rendezvous
    // (or the round) fails at once instead of at its timeout.
    coordinator->nodeGone(setup.node, fmt::format("its agent (in the launch that hosts the store) "
                                                  "ended with exit code {}", agentCode));
    thread.join();
    watcher->stop();
    server->stop();
    return code;
  }
  return agentCode;
}

int runAgentFromStdin(const LaunchConfig& config, const EnvMap& environment) {
  std::string text;
  char buf[65536];
  while (remote::planEnd(text) == std::string::npos) {
    ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    DTRAIN_CHECK_ARG(n > 0, "launch --agent: stdin ended after {} bytes, before the plan was "
                     "complete; HINT: --agent is started by the master launch, not by hand",
                     text.size());
    text.append(buf, static_cast<size_t>(n));
    DTRAIN_CHECK_ARG(text.size() < (64u << 20), "launch --agent: the plan on stdin is too large");
  }
  AgentSetup setup = agentSetupFromRecords(remote::decodePlan(text), config);
  if (setup.mode == "check") {
    auto [addr, port] = parseEndpoint(setup.master, "agent plan master");
    return runNodeCheck(setup, addr, port, environment);
  }
  return runAgent(setup, environment);
}

}  // namespace dtrain::launcher
