// connectWorld / shutdownWorld (dtrain/comm/world.h):
// the environment resolved by world_env.cpp turned
// into a store and a communicator.
#include "dtrain/comm/world.h"

#include <arpa/inet.h>
#include <netdb.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "dtrain/base/job_store.h"
#include "dtrain/base/logging.h"
#include "dtrain/base/tcp_store.h"
#include "dtrain/comm/nccl_communicator.h"
#include "env_contract.h"
#include "membership.h"
#include "net/net_interface.h"
#include "parse_int.h"
#include "world_reform.h"

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
  DTRAIN_CHECK_ARG(rc == 0 && res != nullptr,
                   "{}=\"{}\" does not resolve: {}. HINT: export the "
                   "first node's IP address",
                   env::kMasterAddr, host, gai_strerror(rc));
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
  DTRAIN_CHECK_ARG(
      net::isLoopbackHost(host) || !token.empty(),
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

// Without a launcher's node number: the host's name and boot id (two hosts may share a name).
std::string hostNodeKey() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::string boot;
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char buf[64] = {0};
    if (std::fgets(buf, sizeof(buf), f)) boot = buf;
    std::fclose(f);
  }
  while (!boot.empty() && (boot.back() == '\n' || boot.back() == ' ')) boot.pop_back();
  return fmt::format("host {} boot {}", host, boot);
}

// DTRAIN_JOIN_EPOCH: 0 when unset.
int joinEpochFromEnv() {
  const char* text = std::getenv(env::kJoinEpoch);
  if (text == nullptr || *text == '\0') return 0;
  int64_t epoch = 0;
  DTRAIN_CHECK_ARG(parseInt64(text, &epoch) && epoch >= 0 && epoch < (1 << 30),
                   "{}=\"{}\" is not a membership epoch (0 or more). HINT: `launch` sets it",
                   env::kJoinEpoch, text);
  return static_cast<int>(epoch);
}

}  // namespace

World connectWorld(const WorldOptions& o, bool cudaDevicesUsable) {
  const EnvLookup env = [](const char* name) -> const char* { return std::getenv(name); };
  World w;
  w.env = resolveWorldEnv(o, env);
  log::setTag(fmt::format("[dtrain rank {}]", w.env.rank));
  // A backend asked for by name has its variables checked first: a bad NCCL_* value is named
  // even on a machine where NCCL cannot run (docs/reliability.md P7).
  const std::string requested = !o.backend.empty()           ? o.backend
                                : std::getenv(env::kBackend) ? std::getenv(env::kBackend)
                                                             : "";
  for (const auto& e : backendTable()) {
    if (requested == e.name && e.validateEnvironment) e.validateEnvironment();
  }
  const int devices = cudaDevicesUsable ? cudaDeviceCount() : 0;
  const BackendEntry& entry = chooseBackend(o.backend, env, devices, w.env.sharedMemory);
  if (entry.validateEnvironment) entry.validateEnvironment();
  if (entry.cuda) {
    w.device = chooseCudaDevice(w.env.localRank, devices, std::getenv(env::kCudaVisibleDevices));
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

  // Note [Joining a running round] (launcher/cluster/master/node_loss.h): a worker of a node
  // taken in live starts in the epoch that took it in, among its members, under its prefix.
  w.epoch = o.joinEpoch >= 0 ? o.joinEpoch : joinEpochFromEnv();
  w.joinPending = w.epoch > 0;
  BackendSetup setup{o,
                     w.env,
                     w.store,
                     worldPrefix(o.name, w.epoch),
                     w.device,
                     devices,
                     w.env.node.empty() ? hostNodeKey() : w.env.node};
  // Note [Admission when ready] (world_reform.cpp): a rank taken in connects at its first step.
  w.communicator = w.joinPending ? pendingCommunicator(entry, setup) : entry.create(setup);
  w.awaitingAdmission = w.joinPending;
  w.backend = w.communicator->backendName();
  watchMembership(w, o, entry.name, setup.node, devices);
  if (w.joinPending) {
    DTRAIN_CHECK(w.reform != nullptr,
                 "{}={} (a node taken into a running round) needs {}=continue: the launcher sets "
                 "both (--on-node-join live with --on-node-loss continue)",
                 env::kJoinEpoch, w.epoch, env::kOnNodeLoss);
    DTRAIN_LOG(Warn,
               "joined the running round in membership epoch {}: rank {}/{}, connected at its "
               "first step",
               w.epoch, w.env.rank, w.env.worldSize);
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
