#pragma once
// The one-node job, in the two steps every node of a job takes: probe the node (node_probe.h:
// program path, worker count, log directory), then run the plan -- print it (--dry-run), or host
// the store with a fresh job token, pick MASTER_PORT and hand over to the Supervisor. The job-wide
// plumbing it shares with the multi-node job (tokens, run ids, addresses, ports, job directories)
// is launcher/node/job_resources.h.

#include <string>
#include <vector>

#include "launcher/config/launch_config.h"
#include "launcher/node/worker_env.h"

namespace dtrain::launcher {

// Runs the job and returns launch's exit code. Throws InvalidArgument (exit 2),
// ProgramNotFound (127), ProgramNotExecutable (126) before anything starts, and dtrain::Error
// (125) when the infrastructure fails (store, spawn).
int runJob(const LaunchConfig& config, const EnvMap& environment);

// The --dry-run text: each worker's command and the environment launch sets, token redacted.
std::string formatDryRun(const LaunchConfig& config, const NodeContext& node,
                         const std::vector<std::string>& argv);

}  // namespace dtrain::launcher
