#pragma once
// The plan of a multi-node job, resolved and validated once before anything starts: the host
// list (include/exclude, addresses, which host is this one), the store's endpoint and token, the
// run id, MASTER_PORT, the node counts, the environment every agent gets (.dtrain_env, --env,
// what the master forwards); and each node's part of it, the AgentSetup its agent runs.

#include <functional>
#include <string>
#include <vector>

#include "launcher/config/hosts.h"
#include "launcher/config/launch_config.h"
#include "launcher/node/worker_env.h"

namespace dtrain::launcher {

// Everything one node's agent needs, resolved by the master (or the manual command line).
struct AgentSetup {
  LaunchConfig config;    // the job's options: program, supervision, output, NCCL
  std::string node;       // node id (see Note [Rendezvous protocol])
  int requestedRank = 0;  // host-list index or --node-rank
  std::string label;      // the host as the list names it; empty: this host's name
  int slots = 0;          // workers from the host list; 0: --nproc-per-node
  std::vector<int> gpus;  // --include/--exclude slots: CUDA_VISIBLE_DEVICES
  std::string storeAddr;
  int storePort = 0;
  std::string token;
  EnvMap forwarded;         // the master's forwarded environment (fan-out)
  bool watchStdin = false;  // stdin's end means the master (or its ssh session) is gone
  std::string mode;         // "check": launch --check's probe of this node (preflight.h)
  std::string master;       // "ADDR:PORT" of MASTER_ADDR/PORT, for the check
  // Called when launch receives a signal between rounds (manual node rank 0: the coordinator
  // in the same process ends the job).
  std::function<void(int)> onSignal;
};

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
  bool hostsStore = false;  // this launch hosts the store (fan-out, or manual node rank 0)
  std::string token;
  std::string runId;
  int masterPort = kDefaultMultiNodeMasterPort;
  int minNodes = 1;
  int maxNodes = 1;
  std::string launchPath;  // on the other nodes
  std::string cwd;         // on the other nodes
  EnvMap forwarded;        // the environment the agents get
};

// Resolves and validates `config` (host lists, addresses, the token, .dtrain_env); throws
// InvalidArgument (exit 2) naming what is wrong. Reads files and resolves names; starts nothing.
MultiNodePlan planMultiNode(const LaunchConfig& config, const EnvMap& environment);

// The AgentSetup of fan-out node `index` (or of this manual node).
AgentSetup agentSetupFor(const LaunchConfig& config, const MultiNodePlan& plan, int index);

// This launch's own path (/proc/self/exe): what a local host's agent runs.
std::string selfPath();

}  // namespace dtrain::launcher
