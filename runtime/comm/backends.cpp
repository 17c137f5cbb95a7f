// The table of backends (dtrain/comm/world.h) and the choice among them.
#include <string>

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "dtrain/comm/gloo_communicator.h"
#include "dtrain/comm/nccl_communicator.h"
#include "dtrain/comm/shm_communicator.h"
#include "dtrain/comm/world.h"
#include "env_contract.h"

namespace dtrain::comm {

namespace {

// The fields every backend's options (NcclOptions, GlooOptions, CpuWorldOptions) take from the
// setup alike.
template <typename Options>
Options optionsFrom(const BackendSetup& s) {
  Options o;
  o.rank = s.env.rank;
  o.size = s.env.worldSize;
  o.store = s.store;
  o.name = s.name;
  o.timeout = s.options.timeout;
  o.connectTimeout = s.options.connectTimeout;
  o.checkCollectives = s.options.checkCollectives;
  return o;
}

std::shared_ptr<Communicator> createNccl(const BackendSetup& s) {
  NcclOptions o = optionsFrom<NcclOptions>(s);
  o.device = s.device;
  const char* blocking = std::getenv("TORCH_NCCL_BLOCKING_WAIT");
  o.blockingWait = blocking != nullptr && std::string(blocking) == "1";
  return createNcclCommunicator(o);
}

std::shared_ptr<Communicator> createGloo(const BackendSetup& s) {
  GlooOptions o = optionsFrom<GlooOptions>(s);
  o.storeHost = s.env.storeHost;
  return createGlooCommunicator(o);
}

std::shared_ptr<Communicator> createShm(const BackendSetup& s) {
  CpuWorldOptions o = optionsFrom<CpuWorldOptions>(s);
  o.node = s.node;
  o.storeHost = s.env.storeHost;
  o.shm.timeout = s.options.timeout;
  o.shm.connectTimeout = s.options.connectTimeout;
  return createCpuCommunicator(o);
}

bool shmAvailable() {
#if defined(__linux__)
  return true;
#else
  return false;
#endif
}

void validateNccl() { validateNcclEnvironment(); }

std::string names(const std::vector<BackendEntry>& table) {
  std::string out;
  for (const auto& e : table) {
    out += fmt::format("{}{} ({})", out.empty() ? "" : ", ", e.name, e.summary);
  }
  return out;
}

}  // namespace

const std::vector<BackendEntry>& backendTable() {
  static const std::vector<BackendEntry> table = {
      {"nccl", "CUDA tensors", true, false, &ncclAvailable, &validateNccl, &createNccl},
      {"shm", "CPU tensors: shared memory inside a node, Gloo across nodes", false, true,
       &shmAvailable, nullptr, &createShm},
      {"gloo", "CPU tensors over TCP", false, false, &glooAvailable, nullptr, &createGloo},
  };
  return table;
}

const BackendEntry& chooseBackend(const std::string& requested, const EnvLookup& env,
                                  int cudaDevices, bool sharedMemory,
                                  const std::vector<BackendEntry>& table) {
  std::string source = "the backend option";
  std::string want = requested;
  if (want.empty()) {
    const char* v = env(env::kBackend);
    if (v != nullptr && *v != '\0') {
      want = v;
      source = env::kBackend;
    }
  }
  if (want.empty()) {
    for (const auto& e : table) {
      if (!e.built() || (e.cuda && cudaDevices <= 0) || (e.sharedMemory && !sharedMemory)) continue;
      return e;
    }
    DTRAIN_THROW(InvalidArgument,
                 "no backend: this build has none that runs here (no GPU for "
                 "NCCL, and no CPU backend{})",
                 sharedMemory ? "" : fmt::format(" with {}=0", env::kShm));
  }
  for (const auto& e : table) {
    if (want != e.name) continue;
    DTRAIN_CHECK_ARG(e.built(), "{}={}, but this dtrain was built without it", source, e.name);
    DTRAIN_CHECK_ARG(!e.cuda || cudaDevices > 0,
                     "{}={}, but no CUDA device is usable here (no "
                     "GPU, no driver, or a libtorch without CUDA)",
                     source, e.name);
    DTRAIN_CHECK_ARG(!e.sharedMemory || sharedMemory,
                     "{}={}, but shared memory is turned off "
                     "({}=0 or WorldOptions::sharedMemory)",
                     source, e.name, env::kShm);
    return e;
  }
  DTRAIN_THROW(InvalidArgument, "{}=\"{}\" is not a backend: use {}", source, want, names(table));
}

}  // namespace dtrain::comm
