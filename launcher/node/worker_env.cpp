#include "launcher/node/worker_env.h"

#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

#include "env_contract.h"

extern char** environ;

namespace dtrain::launcher {

namespace {

bool isSecret(const std::string& name) { return name == env::kStoreToken; }

}  // namespace

std::string workerDir(const std::string& jobDir, int round, int rank) {
  return jobDir + "/attempt_" + std::to_string(round) + "/rank_" + std::to_string(rank);
}

std::string errorFilePath(const std::string& jobDir, int round, int rank) {
  return workerDir(jobDir, round, rank) + "/error.json";
}

EnvMap workerEnv(const LaunchConfig& config, const NodeContext& node, int localRank, int round) {
  EnvMap out;
  for (const auto& [key, value] : node.inherited) {
    // Launcher options are for this launcher only (docs/design.md#forwarded-environment); a nested
    // launch inside a worker must not pick them up.
    if (key.rfind(env::kLaunchOptionPrefix, 0) == 0) continue;
    out[key] = value;
  }
  for (const auto& [key, value] : node.overlay) out[key] = value;
  for (const auto& [key, value] : config.env) out[key] = value;

  const int rank = node.rankOffset + localRank;
  const int worldSize = node.worldSize;
  auto set = [&](const char* key, const std::string& value) { out[key] = value; };
  auto setInt = [&](const char* key, long long value) { out[key] = std::to_string(value); };

  setInt(env::kRank, rank);
  setInt(env::kLocalRank, localRank);
  setInt(env::kWorldSize, worldSize);
  setInt(env::kLocalWorldSize, node.localWorldSize);
  setInt(env::kGroupRank, node.nodeRank);
  setInt(env::kGroupWorldSize, node.numNodes);
  setInt(env::kNodeId, node.nodeId);
  setInt(env::kRoleRank, rank);
  setInt(env::kRoleWorldSize, worldSize);
  set(env::kRoleName, config.role);
  set(env::kMasterAddr, node.masterAddr);
  setInt(env::kMasterPort, node.masterPort);
  setInt(env::kRestartCount, round);
  setInt(env::kMaxRestarts, config.maxRestarts);
  set(env::kRunId, node.runId);
  set(env::kUseAgentStore, "False");
  set(env::kErrorFile, errorFilePath(node.jobDir, round, rank));
  set(env::kStoreAddr, node.storeAddr);
  setInt(env::kStorePort, node.storePort);
  set(env::kStoreToken, node.storeToken);
  setInt(env::kDtrainRestartCount, round);
  set(env::kDtrainRunId, node.runId);
  if (config.onNodeLoss == OnNodeLoss::Continue) {
    // Note [Membership epochs]: the runtime watches the round's epochs; a worker whose collective
    // failed waits this long for the master's next epoch -- the master names a silent node within
    // --heartbeat-timeout plus one heartbeat read.
    set(env::kOnNodeLoss, onNodeLossName(config.onNodeLoss));
    set(env::kNodeLossWait, fmt::format("{:g}", config.heartbeatTimeout + 5));
    if (node.joinEpoch > 0) setInt(env::kJoinEpoch, node.joinEpoch);
  }

  // Leave the user's choice alone; otherwise split the CPUs between the local workers (at least 1)
  // so N workers do not each start a thread per core.
  if (out.find(env::kOmpNumThreads) == out.end()) {
    setInt(env::kOmpNumThreads, std::max(1, node.cpuCount / std::max(1, node.localWorldSize)));
  }
  if (!node.gpuSlots.empty()) {
    std::string list;
    for (size_t i = 0; i < node.gpuSlots.size(); ++i) {
      list += (i ? "," : "") + std::to_string(node.gpuSlots[i]);
    }
    set(env::kCudaVisibleDevices, list);
  }
  return out;
}

EnvMap workerEnvChanges(const LaunchConfig& config, const NodeContext& node, int localRank,
                        int round) {
  EnvMap full = workerEnv(config, node, localRank, round);
  EnvMap changes;
  for (const auto& [key, value] : full) {
    auto it = node.inherited.find(key);
    if (it == node.inherited.end() || it->second != value) changes[key] = value;
  }
  return changes;
}

EnvMap redacted(EnvMap env) {
  for (auto& [key, value] : env) {
    if (isSecret(key) && !value.empty()) value = env::kRedacted;
  }
  return env;
}

std::vector<std::string> toEnvStrings(const EnvMap& env) {
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [key, value] : env) out.push_back(key + "=" + value);
  return out;
}

EnvMap currentEnvironment() {
  EnvMap out;
  for (char** e = environ; e && *e; ++e) {
    std::string entry(*e);
    size_t eq = entry.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    out.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return out;
}

}  // namespace dtrain::launcher
