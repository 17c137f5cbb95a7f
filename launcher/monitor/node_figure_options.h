#pragma once
// The node figures a node's monitor collects (node_sampler.h), as the one-node job and a
// multi-node agent both set them from the job's options.

#include "launcher/config/launch_config.h"
#include "launcher/monitor/node_sampler.h"
#include "launcher/node/worker_env.h"

namespace dtrain::launcher {

// What a node's monitor measures besides its workers: the directories of Note [Watched
// directories] (launcher/monitor/node_sampler.h) and the interface the collectives use, as the
// workers' NCCL_SOCKET_IFNAME names it (--env, launch's choice, then the environment; a list or
// an exclusion names none). DTRAIN_NODE_FIGURES=0 in launch's environment turns them off.
monitor::NodeFigureOptions nodeFigureOptions(const LaunchConfig& config, const NodeContext& node);

}  // namespace dtrain::launcher
