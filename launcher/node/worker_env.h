#pragma once
// The environment of one worker (docs/design.md#worker-environment), as a pure function
// of the launch configuration, what the launcher knows about this node, the local rank and the
// restart round. The supervisor execs workers with exactly this; --dry-run prints it redacted.

#include <map>
#include <string>
#include <vector>

#include "launcher/config/launch_config.h"

namespace dtrain::launcher {

using EnvMap = std::map<std::string, std::string>;

// What the launcher knows about this node and job when it spawns a worker: resolved addresses,
// ports, counts and the inherited environment. Filled at launch; tests fill it by hand.
struct NodeContext {
  std::string host;  // this node's name, for messages
  int nodeRank = 0;  // GROUP_RANK: this round's place among the nodes
  int nodeId = 0;    // DTRAIN_NODE_ID: stable across rounds (host-list index, --node-rank)
  int numNodes = 1;
  int localWorldSize = 1;  // workers on this node
  int rankOffset = 0;      // global rank of local rank 0 (prefix sum over the nodes before)
  int worldSize = 1;       // workers of the whole job
  // > 0: this node was taken into the running round in this membership epoch (--on-node-join
  // live); its ranks and world size are the epoch's.
  int joinEpoch = 0;
  int cpuCount = 1;        // CPUs this launcher may use (affinity), for OMP_NUM_THREADS
  std::string masterAddr;  // an IP, never a host name
  int masterPort = 0;
  std::string storeAddr;
  int storePort = 0;
  std::string storeToken;  // secret: environment only
  std::string runId;
  std::string jobDir;         // per-worker files live under jobDir/attempt_K/rank_N/
  std::vector<int> gpuSlots;  // --include host:0,2; empty: CUDA_VISIBLE_DEVICES is inherited
  EnvMap inherited;           // the launcher's own environment
  // Multi-node: the master's forwarded environment and launch's NCCL_* choices, laid over
  // `inherited` before --env (see forwarded_env.h, nccl_env.h).
  EnvMap overlay;
};

// The directory of one worker's files (logs, error file) in one attempt.
std::string workerDir(const std::string& jobDir, int round, int rank);
// TORCHELASTIC_ERROR_FILE of one worker in one attempt.
std::string errorFilePath(const std::string& jobDir, int round, int rank);

// The full environment of local rank `localRank` in restart round `round` (0 first): the
// inherited environment without DTRAIN_LAUNCH_* variables, then --env, then the contract.
EnvMap workerEnv(const LaunchConfig& config, const NodeContext& node, int localRank, int round);

// Only the variables workerEnv adds or changes relative to node.inherited, in name order.
EnvMap workerEnvChanges(const LaunchConfig& config, const NodeContext& node, int localRank,
                        int round);

// A copy of `env` with every secret value replaced by <redacted>.
EnvMap redacted(EnvMap env);

// "KEY=VALUE" strings for execve.
std::vector<std::string> toEnvStrings(const EnvMap& env);

// The current process's environment as a map.
EnvMap currentEnvironment();

}  // namespace dtrain::launcher
