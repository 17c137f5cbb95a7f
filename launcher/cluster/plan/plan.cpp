#include "launcher/cluster/plan/plan.h"

#include <arpa/inet.h>
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "dtrain/base/error.h"
#include "env_contract.h"
#include "launcher/cluster/plan/forwarded_env.h"
#include "launcher/node/job_resources.h"
#include "launcher/node/node_probe.h"
#include "net/net_interface.h"
#include "net/socket.h"

namespace dtrain::launcher {

namespace {

// Options only the master acts on; the agents get the rest of the job's options.
bool masterOnlyOption(const std::string& name) {
  static const char* const kMasterOnly[] = {
      "hostfile",
      "hosts",
      "include",
      "exclude",
      "token-file",
      "ssh-port",
      "ssh-identity",
      "ssh-config",
      "ssh-option",
      "ssh-connect-timeout",
      "ssh-accept-new-host-keys",
      "remote-launch",
      "remote-cwd",
      "check",
      "dry-run",
      "node-rank",
      "nnodes",
      "rdzv-endpoint",
      "master-addr",
      "master-port",
      "agent",
      "run-id",
      "env",
      "rdzv-backend",
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
    for (size_t t = 0; t < std::min(kResolverThreads, pending.size()); ++t)
      threads.emplace_back(work);
    for (auto& t : threads) t.join();
  }
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return out;
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

}  // namespace

std::string selfPath() {
  char buf[PATH_MAX] = {};
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  DTRAIN_CHECK(n > 0, "launch: cannot read /proc/self/exe: {}", std::strerror(errno));
  return std::string(buf, static_cast<size_t>(n));
}

namespace {

// The environment the agents get: docs/design.md's list, .dtrain_env, --env. Fan-out: what the
// master forwards. Manual: every node has its own environment, and only its .dtrain_env and
// --env are laid over it.
EnvMap agentEnvironment(const LaunchConfig& config, const EnvMap& environment, bool fanOut) {
  std::vector<std::pair<std::string, std::string>> dotEnv;
  if (::access(kDotEnvFile, F_OK) == 0) {
    dotEnv = parseDotEnv(readTextFile(kDotEnvFile, "the environment file"),
                         currentDir() + "/" + kDotEnvFile);
  }
  return forwardedEnvironment(fanOut ? environment : EnvMap{}, dotEnv, config.env);
}

// The host list of --hostfile / --hosts, filtered by --include / --exclude.
std::vector<HostEntry> hostList(const LaunchConfig& config) {
  std::vector<HostEntry> hosts =
      config.hostfile.empty()
          ? parseHostsOption(config.hosts, optionLabel(config, "hosts"))
          : parseHostfile(readTextFile(config.hostfile, optionLabel(config, "hostfile")),
                          optionLabel(config, "hostfile") + " " + quoteValue(config.hostfile));
  const int defaultSlots = config.nprocPerNode.kind == NprocSpec::Kind::Count
                               ? config.nprocPerNode.count
                               : 0;
  return applyHostFilters(
      hosts,
      config.include.empty() ? std::vector<HostFilterTerm>{}
                             : parseHostFilter(config.include, optionLabel(config, "include")),
      config.exclude.empty() ? std::vector<HostFilterTerm>{}
                             : parseHostFilter(config.exclude, optionLabel(config, "exclude")),
      defaultSlots, optionLabel(config, "include"), optionLabel(config, "exclude"));
}

// Fan-out: the hosts (their addresses, which one is this host), the node counts, the store on
// this host with a fresh token.
void planFanOut(const LaunchConfig& config, MultiNodePlan& plan) {
  std::vector<HostEntry> hosts = hostList(config);
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
    PlannedHost p;
    p.entry = hosts[i];
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
                     "out",
                     optionLabel(config, "rdzv-endpoint"), config.rdzvHost, plan.storeAddr);
  } else if (!firstRemote.empty()) {
    plan.storeAddr = net::chooseBindAddress("", "the route toward the hosts", firstRemote).address;
  } else {
    plan.storeAddr = "127.0.0.1";
  }
  plan.hostsStore = true;
  plan.token = newJobToken();
}

// Manual: every node is started by hand (or by a scheduler) with the same options; node rank 0
// hosts the store, and the token is the user's.
void planManual(const LaunchConfig& config, const EnvMap& environment, MultiNodePlan& plan) {
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
                     net::hostName());
  }
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
  plan.forwarded = agentEnvironment(config, environment, plan.fanOut);
  if (plan.fanOut) {
    planFanOut(config, plan);
  } else {
    planManual(config, environment, plan);
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

}  // namespace dtrain::launcher
