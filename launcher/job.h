#pragma once
// From a validated LaunchConfig to a running job on this node: resolve what depends on the
// machine (program path, worker count, host name, CPUs), check the log directory, then either
// print the plan (--dry-run) or host the store with a fresh job token, pick MASTER_PORT and hand
// over to the Supervisor.

#include <string>

#include "launcher/launch_config.h"
#include "launcher/worker_env.h"

namespace dtrain::launcher {

// Runs the job and returns launch's exit code. Throws InvalidArgument (exit 2),
// ProgramNotFound (127), ProgramNotExecutable (126) before anything starts, and dtrain::Error
// (125) when the infrastructure fails (store, spawn).
int runJob(const LaunchConfig& config, const EnvMap& environment);

// A fresh job token: 32 random bytes from the kernel, hex.
std::string newJobToken();
// A random run id (12 hex digits).
std::string newRunId();

// Checks that `dir` is, or can be created as, a writable directory. Throws InvalidArgument
// naming `label` and the path otherwise. Leaves nothing behind (it probes with a directory it
// removes at once).
void checkWritableDir(const std::string& dir, const std::string& label);

// The --dry-run text: each worker's command and the environment launch sets, token redacted.
std::string formatDryRun(const LaunchConfig& config, const NodeContext& node,
                         const std::vector<std::string>& argv);

}  // namespace dtrain::launcher
