#pragma once
// The shared-memory backend: collectives among the ranks of one node through one memory segment
// they all map, without sockets or copies through the kernel; and the hierarchical communicator
// that joins several nodes: shared memory inside each node, Gloo across nodes between the ranks
// with the same local index. dtrain::init() picks them for CPU tensors whenever two or more ranks
// share a node (DTRAIN_SHM=0 or WorldOptions::sharedMemory turns that off); tests and benchmarks
// create them directly.
//
// Design, segment lifetime and failure handling: docs/design.md "Shared memory".

#include <memory>
#include <string>
#include <vector>

#include "dtrain/base/store.h"
#include "dtrain/comm/communicator.h"

namespace dtrain::comm {

// Staging memory of each rank: two slots of this size, through which buffers that the
// communicator does not own stream chunk by chunk (any size passes through them). 1 MiB keeps a
// chunk's user buffer and slot in a core's L2 cache, which larger slots overflow (4 MiB slots were
// slower when this was tuned: benchmarks/LOG.md, shared memory against Open MPI).
constexpr size_t kDefaultShmSlotBytes = size_t{1} << 20;
// Chunk of an allreduce on communicator-owned buffers (no staging; read in place by the peers).
constexpr size_t kDefaultShmOwnedChunkBytes = size_t{8} << 20;
// Allreduces up to this size: every rank reduces the whole buffer (one synchronisation instead of
// the reduce-scatter's two).
constexpr size_t kDefaultShmSmallBytes = size_t{64} << 10;
// Address space reserved for each rank's allocate() buffers. Only pages in use take memory.
constexpr size_t kDefaultShmArenaBytes = size_t{16} << 30;
// How long a waiting rank spins before it sleeps (futex) until the peer it waits for moves on: in
// a synchronous call (the caller blocks anyway; a sleeping rank costs a scheduler wake-up, tens of
// microseconds to milliseconds on a loaded machine, each time), and in one run by the comm thread
// while the caller computes (DDP's buckets: spinning there takes the core from backward). When the
// node's ranks outnumber its cores the spin yields the core (sched_yield) at every turn.
constexpr std::chrono::microseconds kDefaultShmSpin{1000};
constexpr std::chrono::microseconds kDefaultShmAsyncSpin{50};

struct ShmOptions {
  int rank = 0;
  int size = 1;
  // Shared by the ranks: rank 0 posts how to reach the segment under "<name>/shm/".
  std::shared_ptr<store::Store> store;
  // Distinguishes communicators of one job (the same on every rank).
  std::string name = "shm";
  Millis timeout = kDefaultCollectiveTimeout;
  Millis connectTimeout = kDefaultConnectTimeout;
  size_t slotBytes = kDefaultShmSlotBytes;
  size_t ownedChunkBytes = kDefaultShmOwnedChunkBytes;
  size_t smallBytes = kDefaultShmSmallBytes;
  size_t arenaBytes = kDefaultShmArenaBytes;
  // Negative: kDefaultShmSpin / kDefaultShmAsyncSpin.
  std::chrono::microseconds spin{-1};
  std::chrono::microseconds asyncSpin{-1};
  // Spin with sched_yield() instead of a pause: 1 yes, 0 no, -1 when the node's ranks outnumber
  // its cores.
  int yieldSpin = -1;
  // Free-form words for messages ("node 1"): where this communicator lives.
  std::string where;
};

// Every rank of the communicator must run on the same node. Blocks until all have mapped the
// segment (or connectTimeout). Throws InvalidArgument for bad options, TimeoutError naming the
// ranks that did not join, Error when the segment cannot be created or shared.
std::shared_ptr<Communicator> createShmCommunicator(const ShmOptions& options);

// The ranks of a job placed on nodes: node key of every rank (what decides "same node").
struct NodeMap {
  std::vector<std::string> nodeOf;  // by rank

  // Node index of every rank (nodes numbered in the order of their lowest rank).
  std::vector<int> nodeIndex() const;
  int nodes() const;
  // Ranks of node `node`, ascending.
  std::vector<int> ranksOn(int node) const;
  // True when every node holds the same number of ranks.
  bool uniform() const;
};

// Each rank posts its node key under "<prefix>/node/<rank>" and reads everyone's. Collective.
NodeMap exchangeNodeKeys(store::Store& store, const std::string& prefix, int rank, int size,
                         const std::string& myNode, Millis timeout);

struct HierarchicalOptions {
  int rank = 0;
  int size = 1;
  std::shared_ptr<store::Store> store;
  std::string name = "hier";
  NodeMap nodes;  // must be uniform()
  Millis timeout = kDefaultCollectiveTimeout;
  Millis connectTimeout = kDefaultConnectTimeout;
  std::string storeHost;  // for Gloo's interface choice
  ShmOptions shm;         // tuning of the in-node part (rank, size, store, name are set here)
};

// Shared memory inside each node, Gloo across nodes. Requires at least two nodes with the same
// number of ranks each; collective over all ranks.
std::shared_ptr<Communicator> createHierarchicalCommunicator(const HierarchicalOptions& options);

// What connectWorld() builds for CPU tensors with shared memory enabled: shared memory alone when
// every rank is on one node, the hierarchical communicator across uniform nodes, and Gloo when no
// two ranks share a node or nodes hold different numbers of ranks. Collective.
struct CpuWorldOptions {
  int rank = 0;
  int size = 1;
  std::shared_ptr<store::Store> store;
  std::string name = "cpu";
  std::string node;  // this rank's node key
  std::string storeHost;
  Millis timeout = kDefaultCollectiveTimeout;
  Millis connectTimeout = kDefaultConnectTimeout;
  bool checkCollectives = false;
  ShmOptions shm;  // tuning
};
std::shared_ptr<Communicator> createCpuCommunicator(const CpuWorldOptions& options);

}  // namespace dtrain::comm
