#include "launcher/cluster/master/master.h"

#include <pthread.h>

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "dtrain/base/tcp_store.h"
#include "launcher/node/node_probe.h"
#include "launcher/supervisor/output.h"
#include "net/socket.h"

namespace dtrain::launcher {

const char* launcherVersion();

namespace {

// The master's monitor aggregates what the agents publish, serves --metrics-port, writes
// --metrics-file, judges stalls.
std::unique_ptr<monitor::Monitor> masterMonitor(const LaunchConfig& config,
                                                const MultiNodePlan& plan) {
  monitor::MonitorContext c;
  c.runId = plan.runId;
  c.node = net::hostName();
  c.nodeRank = -1;
  c.numNodes = plan.maxNodes;
  c.samplesNode = false;  // each node's agent samples its node, this one's too
  c.aggregates = true;
  c.maxRestarts = config.maxRestarts;
  c.heartbeatTimeout = config.heartbeatTimeout;
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
  co.startsAgents = plan.fanOut;
  co.minNodes = plan.minNodes;
  co.maxNodes = plan.maxNodes;
  co.rdzvTimeout = config.rdzvTimeout;
  co.heartbeatTimeout = config.heartbeatTimeout;
  co.gracePeriod = config.gracePeriod;
  co.maxRestarts = config.maxRestarts;
  co.onNodeLoss = config.onNodeLoss;
  co.onNodeJoin = config.onNodeJoin;
  co.maxReforms = config.maxReforms;
  co.reformWindow = config.reformWindow;
  co.storeNode = plan.fanOut ? "" : "0";  // node rank 0 of a manual job hosts the store
  co.masterPort = plan.masterPort;
  co.runId = plan.runId;
  co.self.host = net::hostName();
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

}  // namespace

Master::Master(const LaunchConfig& config, const MultiNodePlan& plan,
               const store::TcpStoreServer* server)
    : config_(config), plan_(plan), server_(server), watcher_(masterMonitor(config, plan)) {}

Master::~Master() {
  if (thread_.joinable()) thread_.join();
}

void Master::start(std::function<void()> wake) {
  CoordinatorOptions co = coordinatorOptions(config_, plan_);
  co.wake = wake;
  if (server_) co.storeRequests = [server = server_] { return server->requestCounts(); };
  co.observer = watcher_.get();
  coordinator_ = std::make_unique<Coordinator>(masterStoreClient(plan_), co);
  watcher_->start(coordinator_.get());
  thread_ = std::thread([this, wake = std::move(wake)] {
    ::pthread_setname_np(::pthread_self(), "launch-coord");
    try {
      code_ = coordinator_->run();
    } catch (const Error& e) {
      say(fmt::format("launch: error: {} (exit 125)", e.what()));
    }
    done_ = true;
    if (wake) wake();
  });
}

int Master::finish() {
  thread_.join();
  watcher_->stop();
  return code_;
}

}  // namespace dtrain::launcher
