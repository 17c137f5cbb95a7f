#include "launcher/job/job.h"

#include <cstdio>
#include <filesystem>
#include <memory>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "dtrain/base/tcp_store.h"
#include "env_contract.h"
#include "launcher/monitor/monitor.h"
#include "launcher/monitor/node_figure_options.h"
#include "launcher/node/job_resources.h"
#include "launcher/node/node_probe.h"
#include "launcher/node/program.h"
#include "launcher/supervisor/supervisor.h"
#include "net/socket.h"

namespace dtrain::launcher {

std::string formatDryRun(const LaunchConfig& config, const NodeContext& node,
                         const std::vector<std::string>& argv) {
  std::string out = fmt::format(
      "launch --dry-run: nothing was started. {} worker{} on host {} (run id {}).\n",
      node.localWorldSize, node.localWorldSize == 1 ? "" : "s", node.host, node.runId);
  out += fmt::format("Supervision: --max-restarts {} --grace-period {:g} --exit-barrier-timeout "
                     "{:g}{} --kill-timeout {:g}\n",
                     config.maxRestarts, config.gracePeriod, config.exitBarrierTimeout,
                     config.exitBarrierTimeout > 0 ? "" : " (no limit)", config.killTimeout);
  out += "Each worker inherits launch's environment (without DTRAIN_LAUNCH_*), plus:\n";
  for (int i = 0; i < node.localWorldSize; ++i) {
    out += fmt::format("rank {} (local rank {}):\n  command: {}\n  environment:\n",
                       node.rankOffset + i, i, shellQuote(argv));
    for (const auto& [key, value] : redacted(workerEnvChanges(config, node, i, 0))) {
      out += "    " + key + "=" + value + "\n";
    }
  }
  return out;
}

namespace {

// The job-wide part of a one-node job on top of what the probe found: ranks, addresses, run id.
NodeContext oneNodeContext(const LaunchConfig& config, const std::string& host,
                           const NodeProbe& probe, const EnvMap& environment) {
  NodeContext node;
  node.host = host;
  node.nodeRank = 0;
  node.numNodes = 1;
  node.cpuCount = probe.cpuCount;
  node.localWorldSize = probe.localWorldSize;
  node.rankOffset = 0;
  node.worldSize = node.localWorldSize;
  for (int r : config.localRanksFilter) {
    DTRAIN_CHECK_ARG(r < node.localWorldSize,
                     "{}: local rank {} does not exist with {} workers "
                     "per node; HINT: use 0..{}",
                     optionLabel(config, "local-ranks-filter"), r, node.localWorldSize,
                     node.localWorldSize - 1);
  }
  node.runId = config.runId.empty() ? newRunId() : config.runId;
  node.inherited = environment;
  node.masterAddr = config.masterAddr.empty()
                        ? "127.0.0.1"
                        : resolveAddress(config.masterAddr, optionLabel(config, "master-addr"));
  node.storeAddr = config.rdzvHost.empty()
                       ? "127.0.0.1"
                       : resolveAddress(config.rdzvHost, optionLabel(config, "rdzv-endpoint"));
  return node;
}

int printDryRun(const LaunchConfig& config, NodeContext node, const WorkerCommand& command) {
  node.masterPort = config.masterPort;
  node.storePort = config.rdzvPort;
  node.storeToken = "(a fresh random token)";
  node.jobDir = config.logDir.empty() ? "$TMPDIR/dtrain-" + node.runId + "-XXXXXX"
                                      : config.logDir + "/" + node.runId;
  std::string text = formatDryRun(config, node, command.argv);
  if (config.masterPort == 0 || config.rdzvPort == 0) {
    text += "(port 0 above: a free port is picked at launch)\n";
  }
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

// The job's store on this node, with a fresh token; then MASTER_PORT.
std::unique_ptr<store::TcpStoreServer> hostStore(const LaunchConfig& config, NodeContext& node) {
  node.storeToken = newJobToken();
  store::TcpStoreServerOptions storeOptions;
  storeOptions.host = node.storeAddr;
  storeOptions.port = static_cast<uint16_t>(config.rdzvPort);
  storeOptions.token = node.storeToken;
  std::unique_ptr<store::TcpStoreServer> server = store::TcpStoreServer::start(storeOptions);
  node.storePort = server->port();
  node.masterPort = config.masterPort != 0 ? config.masterPort : freePort(node.masterAddr);
  return server;
}

monitor::MonitorContext oneNodeMonitorContext(const LaunchConfig& config, const NodeContext& node) {
  monitor::MonitorContext watch;
  watch.runId = node.runId;
  watch.node = node.host;
  watch.nodeRank = node.nodeRank;
  watch.localWorldSize = node.localWorldSize;
  watch.worldSize = node.numNodes * node.localWorldSize;
  watch.maxRestarts = config.maxRestarts;
  watch.storeHost = node.storeAddr;
  watch.storePort = node.storePort;
  watch.storeToken = node.storeToken;
  watch.label = [&config](const std::string& option) { return optionLabel(config, option); };
  watch.nodeFigures = nodeFigureOptions(config, node);
  return watch;
}

// Runs the probed node's workers under the Supervisor, with the store and the monitor.
int superviseOneNode(const LaunchConfig& config, const WorkerCommand& command, NodeContext node,
                     const EnvMap& environment) {
  std::unique_ptr<store::TcpStoreServer> server = hostStore(config, node);
  // Binds --metrics-port and opens --metrics-file now: a usage error leaves nothing behind.
  monitor::Monitor watcher(config.monitor, oneNodeMonitorContext(config, node));

  JobPlan plan;
  bool tempDir = config.logDir.empty();
  node.jobDir = jobDirFor(config.logDir, environment, node.runId);
  const bool tempLogs = tempDir && (config.redirects.any() || config.tee.any());
  if (tempLogs) {
    std::string line = fmt::format("launch: worker logs (--redirects/--tee) are in {}\n",
                                   node.jobDir);
    std::fwrite(line.data(), 1, line.size(), stderr);
  }
  plan.config = config;
  plan.command = command;
  plan.node = node;
  plan.logAllStreams = !tempDir;
  plan.temporaryJobDir = tempDir && !tempLogs;  // logs the user asked for are kept
  plan.logHint = "not kept (HINT: pass --log-dir DIR to keep every worker's output)";
  DTRAIN_LOG(Info,
             "launch: run {}: {} worker(s) of {} on {}; store {}:{}; MASTER_PORT {}; job "
             "dir {}",
             node.runId, node.localWorldSize, shellQuote(command.argv), node.host, node.storeAddr,
             node.storePort, node.masterPort, node.jobDir);
  plan.observer = &watcher;

  int code = 0;
  {
    Supervisor supervisor(std::move(plan));
    watcher.start(&supervisor);
    code = supervisor.run();
    watcher.stop();
  }
  server->stop();
  if (tempDir && !tempLogs) {
    std::error_code ec;
    std::filesystem::remove_all(node.jobDir, ec);
  }
  return code;
}

}  // namespace

int runJob(const LaunchConfig& config, const EnvMap& environment) {
  const std::string host = net::hostName();
  ProbeRequest request;
  request.label = host;
  const NodeProbe probe = probeNode(config, environment, request);
  NodeContext node = oneNodeContext(config, host, probe, environment);
  if (config.dryRun) return printDryRun(config, std::move(node), probe.command);
  // From here on things start: signals go to the supervisor's signalfd, in every thread.
  blockLauncherSignals();
  return superviseOneNode(config, probe.command, std::move(node), environment);
}

}  // namespace dtrain::launcher
