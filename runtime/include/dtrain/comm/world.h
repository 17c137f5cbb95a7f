#pragma once
// The world a process belongs to: its rank, the world size, its local rank, the job's store and a
// communicator, set up from the environment the way dtrain::init() does, but torch-free (the
// torch layer's init() adds the device and the ProcessGroup; test workers and benchmarks use this
// directly).
//
// Where the rank comes from, in order: explicit options (tests); RANK/WORLD_SIZE/LOCAL_RANK as
// `launch` (or torchrun) sets them; SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID under srun;
// OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK under mpirun. Where the store is: an explicit one; the
// job's store (DTRAIN_STORE_ADDR/_PORT/_TOKEN, set by `launch`); else rank 0 hosts one at
// MASTER_ADDR:MASTER_PORT (docs/design.md#ports, "no launcher") and every rank connects.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/base/store.h"
#include "dtrain/comm/communicator.h"

namespace dtrain::store {
class TcpStoreServer;
}

namespace dtrain::comm {

class WorldReform;

constexpr uint16_t kDefaultMasterPort = 29500;

struct WorldOptions {
  // A backend of backendTable() ("nccl", "shm", "gloo"); empty: DTRAIN_BACKEND, else the first
  // entry of the table that this build has and this machine can run: NCCL with a usable CUDA
  // device, else shared memory among the ranks of each node (Gloo across nodes, and plain Gloo
  // when no two ranks share a node), else Gloo.
  std::string backend;
  // The shared-memory path for CPU tensors. False (or DTRAIN_SHM=0): plain Gloo.
  bool sharedMemory = true;
  // This rank's node, for the shared-memory path: ranks with the same key share memory. Empty:
  // "group<GROUP_RANK>" under launch, "slurm<SLURM_NODEID>" under srun, else the host name and
  // boot id.
  std::string node;
  // Explicit placement (tests, custom launchers); -1: from the environment.
  int rank = -1;
  int worldSize = -1;
  int localRank = -1;
  // Explicit store (tests: one HashStore shared by ranks run as threads). Null: from the
  // environment. `storeHost` is its host, for choosing the network interface (empty: loopback).
  std::shared_ptr<store::Store> store;
  std::string storeHost;
  // Zero: the default (Note [Zero timeouts] in dtrain/base/timeout.h).
  Millis timeout = kDefaultCollectiveTimeout;      // each collective
  Millis connectTimeout = kDefaultConnectTimeout;  // store connection and rendezvous
  // Check every collective's type and shape across ranks (also DTRAIN_CHECK_COLLECTIVES=1).
  bool checkCollectives = false;
  // Distinguishes process groups of one job (the same on every rank).
  std::string name = "default";
  // Re-form in memory when a node is lost, reading the membership epochs from the store
  // (reformWorld below). Under launch it follows `--on-node-loss` (DTRAIN_ON_NODE_LOSS=continue)
  // whatever this says; with an explicit `store` (tests, custom launchers) set it, and `nodeId`:
  // this rank's node in the epochs (DTRAIN_NODE_ID under launch).
  bool reformOnNodeLoss = false;
  std::string nodeId;
  // A rank taken into a running round: the membership epoch that took it in (docs/design.md
  // "Node loss"; set with an explicit `store`: tests, custom launchers). -1: from
  // DTRAIN_JOIN_EPOCH, which `launch --on-node-join live` sets; 0: none.
  int joinEpoch = -1;
};

enum class Launcher { Explicit, Launch, Slurm, Mpi };
const char* launcherName(Launcher launcher);

// What the environment says, before connecting anywhere. Pure: see resolveWorldEnv().
struct WorldEnv {
  Launcher launcher = Launcher::Explicit;
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;
  int round = 0;           // restart round: store keys live under "round<N>/"
  bool jobStore = false;   // connect to the launcher's store (DTRAIN_STORE_*)
  bool hostStore = false;  // no launcher: rank 0 hosts the store at masterAddr:masterPort
  std::string masterAddr;
  uint16_t masterPort = kDefaultMasterPort;
  std::string storeHost;     // where the store is, for the interface rule
  bool sharedMemory = true;  // WorldOptions::sharedMemory and DTRAIN_SHM
  std::string node;          // node key from the options or the launcher; empty: the host's
};

// Looks a variable up (nullptr when unset). Tests pass a map; the real one is std::getenv.
using EnvLookup = std::function<const char*(const char*)>;

// Throws InvalidArgument naming the first missing or malformed variable, saying that `launch`
// sets it (or what srun/mpirun users must export).
WorldEnv resolveWorldEnv(const WorldOptions& options, const EnvLookup& env);

// What a backend's factory gets from connectWorld().
struct BackendSetup {
  const WorldOptions& options;
  const WorldEnv& env;
  std::shared_ptr<store::Store> store;
  std::string name;  // the communicator's store prefix
  int device = -1;   // CUDA device for a CUDA backend
  int cudaDevices = 0;
  std::string node;  // this rank's node key (never empty)
};

// The backends dtrain knows, in order of preference: one entry each, and adding a backend is
// adding an entry (runtime/comm/backends.cpp). Everything that picks, checks or builds a backend
// goes through this table.
struct BackendEntry {
  const char* name;     // DTRAIN_BACKEND / WorldOptions::backend
  const char* summary;  // for messages
  bool cuda;            // collectives on CUDA device memory (else host memory)
  bool sharedMemory;    // switched off by DTRAIN_SHM=0 / WorldOptions::sharedMemory
  bool (*built)();      // compiled into this dtrain
  // Checks the backend's own environment variables (nullable); also run when the backend is only
  // requested, so a bad value is named even where the backend cannot run.
  void (*validateEnvironment)();
  std::shared_ptr<Communicator> (*create)(const BackendSetup& setup);
};
const std::vector<BackendEntry>& backendTable();

// The entry for the request (the option, else DTRAIN_BACKEND), or the first usable one of
// `table`. Throws InvalidArgument naming the variable (or the option) for an unknown, unbuilt or
// unusable backend. Pure: `table` is backendTable() except in tests.
const BackendEntry& chooseBackend(const std::string& requested, const EnvLookup& env,
                                  int cudaDevices, bool sharedMemory,
                                  const std::vector<BackendEntry>& table = backendTable());

// The CUDA device of the rank with `localRank` when `devices` are visible (`visibleDevices`: the
// value of CUDA_VISIBLE_DEVICES, null when unset, for the message). One visible device: that one,
// whatever the local rank (Slurm's per-task GPU binding shows each task only its own GPU while
// SLURM_LOCALID counts on). Several: the localRank-th. Throws InvalidArgument when localRank is
// not below their number.
int chooseCudaDevice(int localRank, int devices, const char* visibleDevices);

struct World {
  WorldEnv env;
  std::string backend;                            // what runs: "shm", "shm+gloo", "gloo", "nccl"
  int device = -1;                                // CUDA device index for a CUDA backend, else -1
  std::shared_ptr<store::Store> store;            // the round's view of the job store
  std::shared_ptr<store::TcpStoreServer> server;  // rank 0 without a launcher: the store it hosts
  std::shared_ptr<Communicator> communicator;
  bool closed = false;  // set by shutdownWorld()
  // The membership epoch the communicator belongs to: 0 as planned, +1 at each re-form.
  int epoch = 0;
  // This rank was started in a running round, in membership epoch `epoch` (DTRAIN_JOIN_EPOCH:
  // `launch --on-node-join live`), and the members have not handed it their state yet: its first
  // step settles (TrainingState::tryStep), which clears this.
  bool joinPending = false;
  // A joinPending rank's communicator connects nothing until admitWorld() (its collectives are
  // refused): the members go on training while it starts.
  bool awaitingAdmission = false;
  // Under `launch --on-node-loss continue` (DTRAIN_ON_NODE_LOSS=continue): the watch on the
  // round's membership and what a re-form needs (runtime/comm/world_reform.h); null otherwise.
  std::shared_ptr<WorldReform> reform;
};

// Resolves the environment, connects to (or hosts) the store and creates the communicator.
// `cudaDevicesUsable` lets the torch layer veto NCCL when its libtorch has no CUDA.
World connectWorld(const WorldOptions& options, bool cudaDevicesUsable = true);

// True when `world` re-forms in memory when a node is lost (launch --on-node-loss continue).
bool reformsOnNodeLoss(const World& world);
// After a collective of world.communicator failed -- aborted with MembershipChanged when the
// launcher published a new membership epoch, or a peer's death seen first -- waits (at most
// DTRAIN_NODE_LOSS_WAIT seconds, --heartbeat-timeout + 5) for that epoch, replaces the
// communicator by one among the epoch's members (this rank's new rank and the world size from
// it; the old one aborted and shut down) under the epoch's own store prefix, and returns true.
// Collective over the new members. False when the world does not re-form or no new epoch came in
// time: the failure was not a node loss the launcher decided to survive, and the caller rethrows
// its error. Throws MembershipChanged when this rank is not a member of the new epoch.
bool reformWorld(World& world);

// A step boundary of the program (TrainingState::tryStep calls it before a step's work). From
// the first on, a node taken into the running round lets this rank's step in flight finish
// (docs/design.md, "Node loss"): true when one is ready and the world has not re-formed with it
// yet -- the caller re-forms (reformWorld) before the step. Not collective.
bool stepBoundary(World& world);
// True when a node taken into the running round is ready and the world has not re-formed with it
// yet (the next stepBoundary returns true). Not collective.
bool joinReady(const World& world);

// A rank taken into a running round (World::awaitingAdmission) joins its members: it tells them
// it is ready -- only then do they leave their step for the epoch that takes it in -- and builds
// its communicator among them, blocking until they have (docs/design.md, "Node loss"). Collective
// over the epoch's members; a no-op once admitted. TrainingState::tryStep calls it.
void admitWorld(World& world);

// Shuts `world` down cleanly: when rank 0 hosts the store, everyone first meets at a barrier so
// the store outlives every rank's last use of it. Idempotent.
void shutdownWorld(World& world);

}  // namespace dtrain::comm
