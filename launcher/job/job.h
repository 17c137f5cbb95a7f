#pragma once
// The one-node job, in the two steps every node of a job takes: probe the node (node_probe.h:
// program path, worker count, log directory), then run the plan -- print it (--dry-run), or host
// the store with a fresh job token, pick MASTER_PORT and hand over to the Supervisor. Also the
// job-wide plumbing the multi-node job shares: tokens, run ids, addresses, ports, job directories.

#include <string>

#include "launcher/job/launch_config.h"
#include "launcher/job/worker_env.h"
#include "launcher/monitor/node_sampler.h"

namespace dtrain::launcher {

// Runs the job and returns launch's exit code. Throws InvalidArgument (exit 2),
// ProgramNotFound (127), ProgramNotExecutable (126) before anything starts, and dtrain::Error
// (125) when the infrastructure fails (store, spawn).
int runJob(const LaunchConfig& config, const EnvMap& environment);

// A fresh job token: 32 random bytes from the kernel, hex.
std::string newJobToken();
// A random run id (12 hex digits).
std::string newRunId();

// An IPv4 literal for `host` ("localhost" -> 127.0.0.1). Workers get addresses, never names.
// Throws InvalidArgument naming `label` when the name does not resolve.
std::string resolveAddress(const std::string& host, const std::string& label);
// A port nobody listens on right now (bind to port 0, read it back, close). Rank 0 binds it a
// moment later; the window is the same as torchrun's.
int freePort(const std::string& address);
// The job directory when no --log-dir is given: for error files, and for log files that
// --redirects / --tee ask for (torchrun writes those to a temporary directory too). Removed when
// the job ends, also when launch is killed: see Note [Temporary job directory].
std::string makeTempJobDir(const EnvMap& environment, const std::string& runId);
// The job directory: `logDir`/RUN_ID (absolute), or a fresh temporary one when `logDir` is empty.
std::string jobDirFor(const std::string& logDir, const EnvMap& environment,
                      const std::string& runId);

// What a node's monitor measures besides its workers: the directories of Note [Watched
// directories] (launcher/monitor/node_sampler.h) and the interface the collectives use, as the
// workers' NCCL_SOCKET_IFNAME names it (--env, launch's choice, then the environment; a list or
// an exclusion names none). DTRAIN_NODE_FIGURES=0 in launch's environment turns them off.
monitor::NodeFigureOptions nodeFigureOptions(const LaunchConfig& config, const NodeContext& node);

// The --dry-run text: each worker's command and the environment launch sets, token redacted.
std::string formatDryRun(const LaunchConfig& config, const NodeContext& node,
                         const std::vector<std::string>& argv);

}  // namespace dtrain::launcher
