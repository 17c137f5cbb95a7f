#pragma once
// The master's parts of a multi-node job, in the launch that hosts the store (the fan-out master,
// or node rank 0 of a manual job): its monitor, its coordinator's options and its store client.

#include <memory>

#include "dtrain/base/tcp_store.h"
#include "launcher/cluster/coordinator.h"
#include "launcher/cluster/plan.h"
#include "launcher/monitor/monitor.h"

namespace dtrain::launcher {

// The master's monitor (Note [Monitor roles] in launcher/monitor/monitor.h): it aggregates what
// the agents publish, serves --metrics-port, writes --metrics-file, judges stalls. Binding the
// port here makes a busy one a usage error before any node starts.
std::unique_ptr<monitor::Monitor> masterMonitor(const LaunchConfig& config,
                                                const MultiNodePlan& plan);

CoordinatorOptions coordinatorOptions(const LaunchConfig& config, const MultiNodePlan& plan);

std::shared_ptr<store::TcpStore> masterStoreClient(const MultiNodePlan& plan);

}  // namespace dtrain::launcher
