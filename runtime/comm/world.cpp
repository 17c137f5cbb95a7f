// connectWorld / shutdownWorld (dtrain/world.h): the environment resolved by world_env.cpp turned
// into a store and a communicator.
#include "dtrain/world.h"

#include <netdb.h>
#include <arpa/inet.h>

#include <cstdlib>

#include <fmt/format.h>

#include "dtrain/env_contract.h"
#include "dtrain/error.h"
#include "dtrain/gloo_communicator.h"
#include "dtrain/job_store.h"
#include "dtrain/logging.h"
#include "dtrain/nccl_communicator.h"
#include "dtrain/tcp_store.h"
#include "net_interface.h"

namespace dtrain::comm {

namespace {

// MASTER_ADDR may be a host name; the store binds and connects to a numeric IPv4 address.
std::string numericAddress(const std::string& host) {
  in_addr a{};
  if (inet_pton(AF_INET, host.c_str(), &a) == 1) return host;
  if (host == "localhost") return "127.0.0.1";
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  DTRAIN_CHECK_ARG(rc == 0 && res != nullptr, "{}=\"{}\" does not resolve: {}. HINT: export the "
                   "first node's IP address", env::kMasterAddr, host, gai_strerror(rc));
  char buf[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof(buf));
  freeaddrinfo(res);
  return buf;
}

// No launcher: rank 0 hosts the store at MASTER_ADDR:MASTER_PORT and every rank connects to it.
std::shared_ptr<store::Store> hostedStore(World& w, const WorldOptions& o) {
  const std::string host = numericAddress(w.env.masterAddr);
  const char* tokenEnv = std::getenv(env::kStoreToken);
  const std::string token = tokenEnv ? tokenEnv : "";
  // Off loopback the store must authenticate its clients (docs/reliability.md S17); checked on
  // every rank so they all fail the same way.
  DTRAIN_CHECK_ARG(isLoopbackHost(host) || !token.empty(),
                   "{} is not set, and {}={} is not a loopback address: rank 0 would host the job's "
                   "store on the network without authentication. HINT: export {}=$(openssl rand "
                   "-hex 16) before srun/mpirun so every rank has the same token, or start the "
                   "job with `launch`, which does this for you",
                   env::kStoreToken, env::kMasterAddr, w.env.masterAddr, env::kStoreToken);
  if (w.env.rank == 0) {
    store::TcpStoreServerOptions so;
    so.host = host;
    so.port = w.env.masterPort;
    so.token = token;
    w.server = store::TcpStoreServer::start(so);
    DTRAIN_LOG(Info, "rank 0 hosts the store at {}:{} ({})", host, w.env.masterPort,
               launcherName(w.env.launcher));
  }
  store::TcpStoreOptions co;
  co.host = host;
  co.port = w.env.masterPort;
  co.token = token;
  co.connectTimeout = o.connectTimeout;
  auto client = std::make_shared<store::TcpStore>(co);
  return std::make_shared<store::PrefixStore>(store::roundPrefix(w.env.round), client);
}

}  // namespace

World connectWorld(const WorldOptions& o, bool cudaDevicesUsable) {
  const EnvLookup env = [](const char* name) -> const char* { return std::getenv(name); };
  World w;
  w.env = resolveWorldEnv(o, env);
  log::setTag(fmt::format("[dtrain rank {}]", w.env.rank));
  // An explicit NCCL request is checked first: a bad NCCL_* value is named even on a machine
  // where NCCL cannot run (docs/reliability.md P7).
  const char* requested = std::getenv(env::kBackend);
  if (o.backend == "nccl" || (o.backend.empty() && requested && std::string(requested) == "nccl")) {
    validateNcclEnvironment();
  }
  const int devices = cudaDevicesUsable ? cudaDeviceCount() : 0;
  w.backend = chooseBackend(o.backend, env, ncclAvailable(), glooAvailable(), devices);
  if (w.backend == "nccl") {
    validateNcclEnvironment();
    const char* visible = std::getenv(env::kCudaVisibleDevices);
    DTRAIN_CHECK_ARG(w.env.localRank < devices,
                     "{}={} but only {} CUDA device{} visible ({}={}): one process per GPU, "
                     "local rank i on the i-th visible device. HINT: launch --nproc-per-node {} "
                     "(or fewer)",
                     env::kLocalRank, w.env.localRank, devices, devices == 1 ? " is" : "s are",
                     env::kCudaVisibleDevices, visible ? visible : "unset (all)", devices);
    w.device = w.env.localRank;
  }

  if (o.store) {
    w.store = o.store;
  } else if (w.env.jobStore) {
    store::JobStoreOptions jo;
    jo.connectTimeout = o.connectTimeout;
    w.store = store::connectToJobStore(jo);
  } else {
    w.store = hostedStore(w, o);
  }

  const std::string name = "pg/" + o.name;
  if (w.backend == "nccl") {
    NcclOptions no;
    no.rank = w.env.rank;
    no.size = w.env.worldSize;
    no.store = w.store;
    no.name = name;
    no.device = w.device;
    no.timeout = o.timeout;
    no.connectTimeout = o.connectTimeout;
    const char* blocking = std::getenv("TORCH_NCCL_BLOCKING_WAIT");
    no.blockingWait = blocking != nullptr && std::string(blocking) == "1";
    w.communicator = createNcclCommunicator(no);
  } else {
    GlooOptions go;
    go.rank = w.env.rank;
    go.size = w.env.worldSize;
    go.store = w.store;
    go.name = name;
    go.storeHost = w.env.storeHost;
    go.timeout = o.timeout;
    go.connectTimeout = o.connectTimeout;
    go.checkCollectives = o.checkCollectives;
    w.communicator = createGlooCommunicator(go);
  }
  DTRAIN_LOG(Info, "{}: rank {}/{} (local rank {}) from {}, backend {}", o.name, w.env.rank,
             w.env.worldSize, w.env.localRank, launcherName(w.env.launcher), w.backend);
  return w;
}

void shutdownWorld(World& w) {
  if (!w.communicator || w.closed) return;
  w.closed = true;
  if (w.env.hostStore && w.communicator->error() == nullptr) {
    // Rank 0's store must outlive everyone's last use of it.
    try {
      w.communicator->barrier();
    } catch (const std::exception& e) {
      DTRAIN_LOG(Warn, "shutdown: the closing barrier failed: {}", e.what());
    }
  }
  w.communicator->shutdown();
  if (w.server) w.server->stop();
}

}  // namespace dtrain::comm
