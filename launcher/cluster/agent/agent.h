#pragma once
// A node's agent in a multi-node job: joins each round on the store, runs this node's workers
// under the Supervisor as the round's plan says (ranks, world size, MASTER_ADDR/PORT), heartbeats,
// stops its workers the moment the round's stop key appears (another node failed, a node went
// silent, the master was signalled) or the store is lost, reports its workers' outcomes and
// follows the master's decision (restart, or end with a code). See Note [Rendezvous protocol].
//
// The fan-out master starts it as `launch --agent` (over ssh, or as a child on its own node)
// with the plan on stdin; on a manual node (--node-rank R) launch runs it in-process.

#include "launcher/cluster/plan/plan.h"
#include "launcher/node/worker_env.h"

namespace dtrain::launcher {

// What the workers of this node inherit: `environment` without DTRAIN_LAUNCH_* variables, under
// the master's forwarded environment (`forwarded`).
EnvMap composeEnvironment(const EnvMap& environment, const EnvMap& forwarded);

// Runs rounds until the master ends the job; returns launch's exit code on this node. Throws
// InvalidArgument / Error only before the store is reached.
int runAgent(const AgentSetup& setup, const EnvMap& environment);

}  // namespace dtrain::launcher
