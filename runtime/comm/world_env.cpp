// resolveWorldEnv: the pure half of connectWorld() (dtrain/comm/world.h).
#include <cstdlib>
#include <string>

#include "dtrain/base/error.h"
#include "dtrain/comm/world.h"
#include "env_contract.h"
#include "parse_int.h"

namespace dtrain::comm {

namespace {

constexpr const char* kLaunchHint = "HINT: start the program with `launch`, which sets it";

const char* get(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

long long parseInt(const char* name, const char* text, long long min, long long max,
                   const char* hint) {
  int64_t v = 0;
  DTRAIN_CHECK_ARG(parseInt64(text, &v) && v >= min && v <= max,
                   "{}=\"{}\" is not an integer in [{}, {}]. {}", name, text, min, max, hint);
  return v;
}

int requireInt(const EnvLookup& env, const char* name, long long min, long long max,
               const char* hint) {
  const char* v = get(env, name);
  DTRAIN_CHECK_ARG(v != nullptr, "{} is not set. {}", name, hint);
  return static_cast<int>(parseInt(name, v, min, max, hint));
}

int optionalInt(const EnvLookup& env, const char* name, int fallback, long long min, long long max,
                const char* hint) {
  const char* v = get(env, name);
  return v ? static_cast<int>(parseInt(name, v, min, max, hint)) : fallback;
}

struct Names {
  Launcher launcher;
  const char* rank;
  const char* size;
  const char* local;
  const char* hint;
};

constexpr Names kLaunch{Launcher::Launch, env::kRank, env::kWorldSize, env::kLocalRank,
                        kLaunchHint};
constexpr Names kSlurm{Launcher::Slurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                       "HINT: srun sets it; or start the program with `launch`"};
constexpr Names kMpi{Launcher::Mpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                     "OMPI_COMM_WORLD_LOCAL_RANK",
                     "HINT: mpirun (Open MPI) sets it; or start the program with `launch`"};

bool sharedMemoryFromEnv(const EnvLookup& env) {
  const char* v = get(env, env::kShm);
  if (v == nullptr) return true;
  const std::string s = v;
  if (s == "1" || s == "true" || s == "on" || s == "yes") return true;
  if (s == "0" || s == "false" || s == "off" || s == "no") return false;
  DTRAIN_THROW(InvalidArgument,
               "{}=\"{}\" is not a switch: 0 turns the shared-memory path off, "
               "1 (the default) keeps it",
               env::kShm, s);
}

// Ranks with the same key share a node (and memory). launch numbers its nodes with GROUP_RANK,
// srun with SLURM_NODEID; otherwise connectWorld() uses the host's name and boot id.
std::string nodeKey(const WorldOptions& o, const EnvLookup& env) {
  if (!o.node.empty()) return o.node;
  if (const char* group = get(env, env::kGroupRank)) {
    return "group" + std::to_string(parseInt(env::kGroupRank, group, 0, 1 << 24, kLaunchHint));
  }
  if (const char* slurm = get(env, "SLURM_NODEID")) {
    return "slurm" +
           std::to_string(parseInt("SLURM_NODEID", slurm, 0, 1 << 24, "HINT: srun sets it"));
  }
  return "";
}

}  // namespace

const char* launcherName(Launcher launcher) {
  switch (launcher) {
    case Launcher::Explicit: return "explicit options";
    case Launcher::Launch: return "launch";
    case Launcher::Slurm: return "srun";
    case Launcher::Mpi: return "mpirun";
  }
  return "?";
}

WorldEnv resolveWorldEnv(const WorldOptions& o, const EnvLookup& env) {
  WorldEnv w;
  const Names* names = nullptr;
  if (o.rank >= 0 || o.worldSize >= 0) {
    DTRAIN_CHECK_ARG(o.rank >= 0 && o.worldSize >= 1 && o.rank < o.worldSize,
                     "init: explicit rank {} and world size {} do not fit (0 <= rank < size)",
                     o.rank, o.worldSize);
    w.launcher = Launcher::Explicit;
    w.rank = o.rank;
    w.worldSize = o.worldSize;
    w.localRank = o.localRank >= 0
                      ? o.localRank
                      : optionalInt(env, env::kLocalRank, o.rank, 0, 1 << 20, kLaunchHint);
  } else {
    if (get(env, env::kRank)) names = &kLaunch;
    else if (get(env, kSlurm.rank)) names = &kSlurm;
    else if (get(env, kMpi.rank)) names = &kMpi;
    DTRAIN_CHECK_ARG(names != nullptr,
                     "{} is not set: this process does not know its rank. {} (with {}, {} and "
                     "the store's address); srun and mpirun work too, with MASTER_ADDR exported",
                     env::kRank, kLaunchHint, env::kWorldSize, env::kLocalRank);
    w.launcher = names->launcher;
    w.worldSize = requireInt(env, names->size, 1, 1 << 24, names->hint);
    w.rank = requireInt(env, names->rank, 0, w.worldSize - 1, names->hint);
    w.localRank = o.localRank >= 0 ? o.localRank
                                   : requireInt(env, names->local, 0, 1 << 20, names->hint);
  }
  w.round = optionalInt(env, env::kDtrainRestartCount, 0, 0, 1000000000, kLaunchHint);
  w.sharedMemory = o.sharedMemory && sharedMemoryFromEnv(env);
  w.node = nodeKey(o, env);

  if (o.store) {
    w.storeHost = o.storeHost;
    return w;
  }
  if (get(env, env::kStoreAddr)) {
    w.jobStore = true;  // connectToJobStore() checks the port and the round
    w.storeHost = get(env, env::kStoreAddr);
    return w;
  }
  // No launcher's store: rank 0 hosts one at MASTER_ADDR:MASTER_PORT.
  const char* master = get(env, env::kMasterAddr);
  DTRAIN_CHECK_ARG(master != nullptr,
                   "neither {} nor {} is set, so there is no store to meet the other ranks at. "
                   "{}; under srun or mpirun export {} (the first node's IP address) and "
                   "optionally {} (default {})",
                   env::kStoreAddr, env::kMasterAddr, kLaunchHint, env::kMasterAddr,
                   env::kMasterPort, kDefaultMasterPort);
  w.hostStore = true;
  w.masterAddr = master;
  w.masterPort = static_cast<uint16_t>(
      optionalInt(env, env::kMasterPort, kDefaultMasterPort, 1, 65535, kLaunchHint));
  w.storeHost = master;
  return w;
}

int chooseCudaDevice(int localRank, int devices, const char* visibleDevices) {
  if (devices == 1) return 0;
  DTRAIN_CHECK_ARG(localRank < devices,
                   "{}={} but only {} CUDA device{} visible ({}={}): one process per GPU, "
                   "local rank i on the i-th visible device. HINT: launch --nproc-per-node {} "
                   "(or fewer)",
                   env::kLocalRank, localRank, devices, devices == 1 ? " is" : "s are",
                   env::kCudaVisibleDevices, visibleDevices ? visibleDevices : "unset (all)",
                   devices);
  return localRank;
}

}  // namespace dtrain::comm
