#include "launcher/config/scheduler_env.h"

#include "dtrain/base/error.h"
#include "launcher/config/hosts.h"
#include "launcher/config/launch_config.h"
#include "parse_int.h"

namespace dtrain::launcher {

namespace {

const std::string* lookup(const std::map<std::string, std::string>& env, const char* name) {
  auto it = env.find(name);
  return it != env.end() && !it->second.empty() ? &it->second : nullptr;
}

void slurmSettings(const std::map<std::string, std::string>& env,
                   std::vector<SchedulerSetting>* out) {
  const char* listName = "SLURM_JOB_NODELIST";
  const std::string* list = lookup(env, listName);
  if (!list) {
    listName = "SLURM_NODELIST";
    list = lookup(env, listName);
  }
  const std::string* nnodes = lookup(env, "SLURM_NNODES");
  const std::string* nodeId = lookup(env, "SLURM_NODEID");
  if (!list || !nnodes || !nodeId) return;
  int64_t n = 0;
  int64_t id = 0;
  DTRAIN_CHECK_ARG(parseInt64(*nnodes, &n) && n >= 1, "SLURM_NNODES={} is not a node count",
                   quoteValue(*nnodes));
  if (n == 1) return;  // one node: nothing to rendezvous across
  DTRAIN_CHECK_ARG(parseInt64(*nodeId, &id) && id >= 0 && id < n,
                   "SLURM_NODEID={} is not a node index below SLURM_NNODES={}", quoteValue(*nodeId),
                   n);
  std::vector<std::string> hosts = expandSlurmNodelist(*list, listName);
  DTRAIN_CHECK_ARG(static_cast<int64_t>(hosts.size()) == n,
                   "{}={} names {} nodes, but SLURM_NNODES={}; HINT: run launch inside the "
                   "allocation's step (srun --ntasks-per-node=1 launch ...)",
                   listName, quoteValue(*list), hosts.size(), n);
  out->push_back({"nnodes", *nnodes, "SLURM_NNODES"});
  out->push_back({"node-rank", *nodeId, "SLURM_NODEID"});
  out->push_back({"rdzv-endpoint", hosts[0], std::string(listName) + " (its first node)"});
}

}  // namespace

std::vector<SchedulerSetting> schedulerSettings(const std::map<std::string, std::string>& env) {
  std::vector<SchedulerSetting> out;
  if (lookup(env, "PET_NNODES") || lookup(env, "PET_NODE_RANK")) {
    const std::pair<const char*, const char*> kDirect[] = {
        {"PET_NNODES", "nnodes"},
        {"PET_NODE_RANK", "node-rank"},
        {"PET_NPROC_PER_NODE", "nproc-per-node"},
        {"PET_MASTER_PORT", "master-port"},
        {"PET_MAX_RESTARTS", "max-restarts"},
        {"PET_RDZV_ID", "run-id"},
        {"PET_RDZV_ENDPOINT", "rdzv-endpoint"},
    };
    for (const auto& [var, option] : kDirect) {
      if (const std::string* v = lookup(env, var)) out.push_back({option, *v, var});
    }
    // torchrun's static rendezvous meets at MASTER_ADDR; launch's store lives on node rank 0
    // too, at the rendezvous port (docs/design.md, Ports).
    if (const std::string* addr = lookup(env, "PET_MASTER_ADDR")) {
      if (!lookup(env, "PET_RDZV_ENDPOINT")) {
        out.push_back({"rdzv-endpoint", *addr, "PET_MASTER_ADDR"});
      }
    }
    return out;
  }
  slurmSettings(env, &out);
  return out;
}

}  // namespace dtrain::launcher
