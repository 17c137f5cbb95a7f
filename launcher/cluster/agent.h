#pragma once
// A node's agent in a multi-node job: joins each round on the store, runs this node's workers
// under the Supervisor as the round's plan says (ranks, world size, MASTER_ADDR/PORT), heartbeats,
// stops its workers the moment the round's stop key appears (another node failed, a node went
// silent, the master was signalled) or the store is lost, reports its workers' outcomes and
// follows the master's decision (restart, or end with a code). See Note [Rendezvous protocol].
//
// The fan-out master starts it as `launch --agent` (over ssh, or as a child on its own node)
// with the plan on stdin; on a manual node (--node-rank R) launch runs it in-process.

#include <functional>
#include <string>
#include <vector>

#include "launcher/cluster/remote/remote_command.h"
#include "launcher/job/launch_config.h"
#include "launcher/job/worker_env.h"

namespace dtrain::launcher {

// Everything one node's agent needs, resolved by the master (or the manual command line).
struct AgentSetup {
  LaunchConfig config;        // the job's options: program, supervision, output, NCCL
  std::string node;           // node id (see Note [Rendezvous protocol])
  int requestedRank = 0;      // host-list index or --node-rank
  std::string label;          // the host as the list names it; empty: this host's name
  int slots = 0;              // workers from the host list; 0: --nproc-per-node
  std::vector<int> gpus;      // --include/--exclude slots: CUDA_VISIBLE_DEVICES
  std::string storeAddr;
  int storePort = 0;
  std::string token;
  EnvMap forwarded;           // the master's forwarded environment (fan-out)
  bool watchStdin = false;    // stdin's end means the master (or its ssh session) is gone
  std::string mode;           // "check": launch --check's probe of this node (preflight.h)
  std::string master;         // "ADDR:PORT" of MASTER_ADDR/PORT, for the check
  // Called when launch receives a signal between rounds (manual node rank 0: the coordinator
  // in the same process ends the job).
  std::function<void(int)> onSignal;
};

// Runs rounds until the master ends the job; returns launch's exit code on this node. Throws
// InvalidArgument / Error only before the store is reached.
int runAgent(const AgentSetup& setup, const EnvMap& environment);

// The plan the master writes on an agent's stdin, and its reading on the other side. The job's
// options travel as ("option", "name=value") records in the order they were applied, the
// environment as ("env", "KEY=VALUE") records, the token in its own record.
remote::Records agentPlanRecords(const AgentSetup& setup);
// `base` is the agent's own parse of its command line (`--agent -- PROGRAM ARGS...`). Throws
// InvalidArgument naming a bad record.
AgentSetup agentSetupFromRecords(const remote::Records& records, const LaunchConfig& base);

}  // namespace dtrain::launcher
