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
// The configuration is resolved and validated once, here, into MultiNodePlan.

#include <string>
#include <vector>

#include "launcher/cluster/agent.h"
#include "launcher/cluster/hosts.h"
#include "launcher/job/launch_config.h"
#include "launcher/job/worker_env.h"

namespace dtrain::launcher {

struct PlannedHost {
  HostEntry entry;
  std::string address;  // resolved (IPv4)
  bool local = false;   // one of this machine's addresses: the agent runs as a child
};

// Everything decided before anything starts.
struct MultiNodePlan {
  bool fanOut = false;
  std::vector<PlannedHost> hosts;  // fan-out: the nodes, in node-rank order
  std::string storeAddr;
  int storePort = kDefaultMultiNodeStorePort;
  bool hostsStore = false;     // this launch hosts the store (fan-out, or manual node rank 0)
  std::string token;
  std::string runId;
  int masterPort = kDefaultMultiNodeMasterPort;
  int minNodes = 1;
  int maxNodes = 1;
  std::string launchPath;      // on the other nodes
  std::string cwd;             // on the other nodes
  EnvMap forwarded;            // the environment the agents get
};

// Resolves and validates `config` (host lists, addresses, the token, .dtrain_env); throws
// InvalidArgument (exit 2) naming what is wrong. Reads files and resolves names; starts nothing.
MultiNodePlan planMultiNode(const LaunchConfig& config, const EnvMap& environment);

// The AgentSetup of fan-out node `index` (or of this manual node).
AgentSetup agentSetupFor(const LaunchConfig& config, const MultiNodePlan& plan, int index);

// The command that starts node `index`'s agent: ssh argv, or this launch for a local host.
std::vector<std::string> agentCommand(const LaunchConfig& config, const MultiNodePlan& plan,
                                      int index);

// Runs a multi-node job from this node (fan-out master, or manual node); returns the exit code.
int runMultiNode(const LaunchConfig& config, const EnvMap& environment);

// `launch --agent`: reads the plan from stdin and runs the agent.
int runAgentFromStdin(const LaunchConfig& config, const EnvMap& environment);

}  // namespace dtrain::launcher
