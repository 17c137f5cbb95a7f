#include "launcher/cluster/multinode.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <memory>

#include <fmt/ranges.h>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "dtrain/base/tcp_store.h"
#include "launcher/cluster/agent/agent.h"
#include "launcher/cluster/master/fan_out.h"
#include "launcher/cluster/master/master.h"
#include "launcher/cluster/preflight.h"
#include "launcher/cluster/protocol/plan_codec.h"
#include "launcher/cluster/protocol/rendezvous.h"
#include "launcher/cluster/remote/remote_command.h"
#include "launcher/node/program.h"
#include "launcher/supervisor/output.h"
#include "launcher/supervisor/supervisor.h"

namespace dtrain::launcher {

namespace {

std::string formatMultiNodeDryRun(const LaunchConfig& config, const MultiNodePlan& plan) {
  std::string out = fmt::format(
      "launch --dry-run: nothing was started. A {} job of {} node{} (run id {}): store at {}:{} "
      "hosted by {}, MASTER_PORT {}, token <redacted>.\n",
      plan.fanOut ? "fan-out" : "manual",
      plan.minNodes == plan.maxNodes ? std::to_string(plan.maxNodes)
                                     : fmt::format("{}:{}", plan.minNodes, plan.maxNodes),
      plan.maxNodes == 1 ? "" : "s", plan.runId, plan.storeAddr, plan.storePort,
      plan.fanOut ? "this launch" : "node rank 0", plan.masterPort);
  out += fmt::format("On a lost node: --on-node-loss {}{}, --max-restarts {}\n",
                     onNodeLossName(config.onNodeLoss),
                     config.onNodeLoss == OnNodeLoss::Continue
                         ? fmt::format(" (the nodes left go on while {} or more remain; at most "
                                       "{} re-forms per {:g} s, then the restart path)",
                                       plan.minNodes, config.maxReforms, config.reformWindow)
                         : " (stop every node, restart from the checkpoint)",
                     config.maxRestarts);
  out += fmt::format("On a node joining below the maximum: --on-node-join {}\n",
                     config.onNodeJoin == OnNodeJoin::Live
                         ? "live (taken into the running round in the next membership epoch)"
                         : "restart (the round stops, every node restarts from the checkpoint)");
  out += "Every node's workers get, over their own environment:\n";
  for (const auto& [k, v] : redacted(plan.forwarded)) out += "    " + k + "=" + v + "\n";
  out += fmt::format(
      "NCCL: --nccl-socket-ifname {}{}{}{}\n", config.nccl.socketIfname,
      config.nccl.ibDisable ? ", NCCL_IB_DISABLE=1" : "",
      config.nccl.debug.empty() ? "" : ", NCCL_DEBUG=" + config.nccl.debug,
      config.nccl.debugSubsys.empty() ? "" : ", NCCL_DEBUG_SUBSYS=" + config.nccl.debugSubsys);
  for (size_t i = 0; i < plan.hosts.size(); ++i) {
    const PlannedHost& h = plan.hosts[i];
    out += fmt::format("node {} {} ({}{}), {}:\n  command: {}\n", i, h.entry.host, h.address,
                       h.local ? ", this host" : "",
                       !h.entry.gpus.empty()
                           ? fmt::format("{} workers, CUDA_VISIBLE_DEVICES={}", h.entry.gpus.size(),
                                         fmt::join(h.entry.gpus, ","))
                       : h.entry.slots > 0 ? fmt::format("{} workers", h.entry.slots)
                                           : "--nproc-per-node workers",
                       shellQuote(agentCommand(config, plan, static_cast<int>(i))));
  }
  if (!plan.fanOut) {
    out += fmt::format("this node: node rank {}{}\n", config.nodeRank,
                       plan.hostsStore ? " (hosts the store and coordinates)" : "");
  }
  return out;
}

}  // namespace

namespace {

std::unique_ptr<store::TcpStoreServer> hostStore(const MultiNodePlan& plan) {
  store::TcpStoreServerOptions so;
  so.host = plan.storeAddr;
  so.port = static_cast<uint16_t>(plan.storePort);
  so.token = plan.token;
  so.requestClasses = kStoreRequestClasses;
  so.classify = storeRequestClass;
  std::unique_ptr<store::TcpStoreServer> server = store::TcpStoreServer::start(so);
  DTRAIN_LOG(Info, "launch: run {}: store at {}:{}", plan.runId, plan.storeAddr, plan.storePort);
  return server;
}

// Manual: this node's agent here; node rank 0 also hosts the store and coordinates.
int runManualNode(const LaunchConfig& config, const MultiNodePlan& plan,
                  const EnvMap& environment) {
  std::unique_ptr<store::TcpStoreServer> server;
  std::unique_ptr<Master> master;
  AgentSetup setup = agentSetupFor(config, plan, config.nodeRank);
  if (plan.hostsStore) {
    server = hostStore(plan);
    master = std::make_unique<Master>(config, plan, server.get());
    master->start();
    setup.onSignal = [&](int sig) { master->coordinator().requestStop(sig); };
  }
  int agentCode = kExitInfrastructure;
  try {
    agentCode = runAgent(setup, environment);
  } catch (const Error& e) {
    if (!master) throw;
    say(fmt::format("launch: error: {} (exit 125)", e.what()));
  }
  if (!master) return agentCode;
  // Normally the coordinator has decided already; if this node's agent ended first for a
  // reason of its own, the job cannot go on without node rank 0: say so, and the rendezvous
  // (or the round) fails at once instead of at its timeout.
  master->coordinator().nodeGone(setup.node, fmt::format("its agent (in the launch that hosts "
                                                         "the store) ended with exit code {}",
                                                         agentCode));
  const int code = master->finish();
  server->stop();
  return code;
}

}  // namespace

int runMultiNode(const LaunchConfig& config, const EnvMap& environment) {
  MultiNodePlan plan = planMultiNode(config, environment);
  if (config.check) {
    DTRAIN_CHECK_ARG(plan.fanOut,
                     "--check checks the nodes of a host list; HINT: give "
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
  if (!plan.fanOut) return runManualNode(config, plan, environment);
  std::unique_ptr<store::TcpStoreServer> server = hostStore(plan);
  int code = runFanOut(config, plan, environment, server.get());
  server->stop();
  return code;
}

int runAgentFromStdin(const LaunchConfig& config, const EnvMap& environment) {
  std::string text;
  char buf[65536];
  while (remote::planEnd(text) == std::string::npos) {
    ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    DTRAIN_CHECK_ARG(n > 0,
                     "launch --agent: stdin ended after {} bytes, before the plan was "
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
