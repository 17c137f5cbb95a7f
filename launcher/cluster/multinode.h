#pragma once
// A job on several nodes, three ways in:
//   - fan-out (--hostfile / --hosts): the launch the user started is the master: it hosts the
//     store on --rdzv-endpoint (default: its address toward the other hosts, port 29400) with a
//     fresh token, and starts one agent per host -- with the system ssh for other hosts, as a
//     child for its own (recognised by its addresses, never an ssh to itself) -- each with the
//     plan on stdin; then it coordinates the rounds (coordinator.h) and prints the report;
//   - manual (--nnodes N --node-rank R --rdzv-endpoint HOST:PORT on every node, or the same from
//     SLURM_* / PET_* variables): node rank 0 hosts the store and coordinates; every node runs
//     its agent in-process; the token comes from --token-file or DTRAIN_STORE_TOKEN;
//   - `launch --agent`: an agent started by a fan-out master, its plan on stdin.
// The configuration is resolved and validated once, into MultiNodePlan (plan.h).

#include "launcher/config/launch_config.h"
#include "launcher/node/worker_env.h"

namespace dtrain::launcher {

// Runs a multi-node job from this node (fan-out master, or manual node); returns the exit code.
int runMultiNode(const LaunchConfig& config, const EnvMap& environment);

// `launch --agent`: reads the plan from stdin and runs the agent.
int runAgentFromStdin(const LaunchConfig& config, const EnvMap& environment);

}  // namespace dtrain::launcher
