// The hierarchical half of ShmCommunicator, the node map, and the factories of
// dtrain/comm/shm_communicator.h.
#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "collective_faults.h"
#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "dtrain/comm/gloo_communicator.h"
#include "reduce_kernels.h"
#include "shm_communicator_impl.h"

namespace dtrain::comm {

// Note [Hierarchical collectives]
// With N = nodes x locals ranks, the ranks with the same local index on every node form a "cross"
// Gloo communicator, and each node's ranks share a segment. An allreduce is the shared-memory
// reduce-scatter (local rank l reduces slice l of every chunk), the cross allreduce of that slice
// over Gloo (so each node sends only 1/locals of the data across, on `locals` connections at
// once), and the shared-memory allgather -- one pass of Note [Shared-memory collectives] with the
// Gloo step between its two halves. Nodes must chunk identically, so in this mode every chunk is
// slot-sized, owned buffers or not. Avg reduces as Sum throughout and divides once, by the world
// size, where the slice is final.
//
// The other collectives compose the two parts: broadcast goes across among the root's local
// index, then within every node; allgather gathers across (each rank its own block), then within
// the node, then reorders blocks into rank order; reduceScatter reorders, reduces within the node
// (local rank l gets the node's sums of the blocks of every node's rank l), then across; a barrier
// is a node barrier, a cross barrier and a node barrier. The in-node steps of one collective are
// numbered separately (in-node sequence numbers), since not every rank takes part in every cross
// step.

std::vector<int> NodeMap::nodeIndex() const {
  std::map<std::string, int> index;
  std::vector<int> out;
  for (const auto& key : nodeOf) {
    auto it = index.emplace(key, static_cast<int>(index.size())).first;
    out.push_back(it->second);
  }
  return out;
}

int NodeMap::nodes() const {
  const auto idx = nodeIndex();
  return idx.empty() ? 0 : *std::max_element(idx.begin(), idx.end()) + 1;
}

std::vector<int> NodeMap::ranksOn(int node) const {
  const auto idx = nodeIndex();
  std::vector<int> out;
  for (int r = 0; r < static_cast<int>(idx.size()); ++r) {
    if (idx[r] == node) out.push_back(r);
  }
  return out;
}

bool NodeMap::uniform() const {
  const int n = nodes();
  if (n == 0) return false;
  const size_t first = ranksOn(0).size();
  for (int i = 1; i < n; ++i) {
    if (ranksOn(i).size() != first) return false;
  }
  return true;
}

NodeMap exchangeNodeKeys(store::Store& store, const std::string& prefix, int rank, int size,
                         const std::string& myNode, Millis timeout) {
  std::string key = myNode;
  std::replace(key.begin(), key.end(), '\n', ' ');
  DTRAIN_CHECK_ARG(!key.empty(), "rank {}/{}: empty node key", rank, size);
  store.setString(fmt::format("{}/node/{}", prefix, rank), key);
  // Rank 0 collects and posts one table: 2N store operations instead of N^2.
  const std::string tableKey = prefix + "/nodes";
  if (rank == 0) {
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back(fmt::format("{}/node/{}", prefix, r));
    store.wait(keys, timeout);
    std::string table;
    for (const auto& k : keys) table += store.getString(k) + "\n";
    store.setString(tableKey, table);
    store.flush();
  } else {
    store.wait({tableKey}, timeout);
  }
  NodeMap map;
  std::istringstream in(store.getString(tableKey));
  for (std::string line; std::getline(in, line);) map.nodeOf.push_back(line);
  DTRAIN_CHECK(static_cast<int>(map.nodeOf.size()) == size,
               "rank {}/{}: the node table has {} entries", rank, size, map.nodeOf.size());
  return map;
}

ShmTopology ShmTopology::of(const NodeMap& map, int rank) {
  DTRAIN_CHECK_ARG(map.uniform(), "shared memory: nodes hold different numbers of ranks");
  ShmTopology t;
  t.rank = rank;
  t.size = static_cast<int>(map.nodeOf.size());
  t.nodes = map.nodes();
  t.locals = t.size / t.nodes;
  t.map = map;
  t.rankAt.resize(static_cast<size_t>(t.size));
  for (int n = 0; n < t.nodes; ++n) {
    const auto ranks = map.ranksOn(n);
    for (int l = 0; l < t.locals; ++l) {
      t.rankAt[static_cast<size_t>(n * t.locals + l)] = ranks[l];
      if (ranks[l] == rank) {
        t.node = n;
        t.local = l;
      }
    }
  }
  return t;
}

void ShmCommunicator::across(const std::function<void()>& step) {
  auto context = [&] {
    std::vector<int> groupRanks, ours;
    for (int n = 0; n < topo_.nodes && n < 16; ++n) {
      groupRanks.push_back(n);
      ours.push_back(topo_.rankOf(n, topo_.local));
    }
    return fmt::format("across nodes (the Gloo group of local rank {} on every node, whose ranks "
                       "{}{} are ranks {} here): ",
                       topo_.local, fmt::join(groupRanks, ", "), topo_.nodes > 16 ? ", ..." : "",
                       fmt::join(ours, ", "));
  };
  try {
    step();
  } catch (const MembershipChanged& e) {
    DTRAIN_THROW(MembershipChanged, "{}{}", context(), e.what());
  } catch (const TimeoutError& e) {
    DTRAIN_THROW(TimeoutError, "{}{}", context(), e.what());
  } catch (const NetworkError& e) {
    DTRAIN_THROW(NetworkError, "{}{}", context(), e.what());
  } catch (const InvalidArgument& e) {
    DTRAIN_THROW(InvalidArgument, "{}{}", context(), e.what());
  } catch (const std::exception& e) {
    DTRAIN_THROW(Error, "{}{}", context(), e.what());
  }
}

void ShmCommunicator::checkTuningAcrossNodes() {
  const shm::Tuning mine = segment_->tuning();
  std::vector<shm::Tuning> all(static_cast<size_t>(topo_.nodes));
  static_assert(sizeof(shm::Tuning) % sizeof(int64_t) == 0, "Tuning travels as int64 values");
  const size_t words = sizeof(shm::Tuning) / sizeof(int64_t);
  CallOptions call;
  call.synchronous = true;
  call.timeout = connectTimeout_;
  across([&] { cross_->allgather(&mine, all.data(), words, DataType::Int64, call); });
  for (int n = 1; n < topo_.nodes; ++n) {
    const std::string diff = shm::tuningMismatch(all[0], topo_.rankOf(0, topo_.local), all[n],
                                                 topo_.rankOf(n, topo_.local));
    DTRAIN_CHECK_ARG(diff.empty(),
                     "{}: shared memory: the nodes were given different options: "
                     "{}. HINT: every rank must pass the same ShmOptions (slotBytes, arenaBytes, "
                     "smallBytes, ownedChunkBytes): nodes that chunk differently would wait for "
                     "each other forever",
                     describe(), diff);
  }
}

void ShmCommunicator::hierAllreduce(const CollectiveInfo& i, void* data,
                                    shm::Clock::time_point deadline) {
  const ReduceOp inNode = i.op == ReduceOp::Avg ? ReduceOp::Sum : i.op;
  engine_->allreduce(local(i, i.count, inNode), data, deadline, [&](void* slice, size_t n) {
    across([&] { cross_->allreduce(slice, n, i.dtype, inNode, crossCall(deadline, i)); });
    finishAverage(slice, n, i.dtype, i.op, topo_.size);
  });
}

void ShmCommunicator::hierBroadcast(const CollectiveInfo& i, void* data,
                                    shm::Clock::time_point deadline) {
  int rootNode = 0, rootLocal = 0;
  for (int n = 0; n < topo_.nodes; ++n) {
    for (int l = 0; l < topo_.locals; ++l) {
      if (topo_.rankOf(n, l) == i.root) {
        rootNode = n;
        rootLocal = l;
      }
    }
  }
  if (topo_.local == rootLocal) {
    across([&] { cross_->broadcast(data, i.count, i.dtype, rootNode, crossCall(deadline, i)); });
  }
  CollectiveInfo li = local(i, i.count, i.op);
  li.root = rootLocal;
  engine_->broadcast(li, data, deadline);
}

void ShmCommunicator::hierAllgather(const CollectiveInfo& i, const void* send, void* recv,
                                    shm::Clock::time_point deadline) {
  const size_t m = static_cast<size_t>(topo_.nodes), l = static_cast<size_t>(topo_.locals);
  const size_t block = i.count * elementSize(i.dtype);
  auto gathered = scratchOnCommThread(m * block, 0);
  auto within = scratchOnCommThread(l * m * block, 1);
  across(
      [&] { cross_->allgather(send, gathered->data(), i.count, i.dtype, crossCall(deadline, i)); });
  engine_->allgather(local(i, m * i.count, i.op), gathered->data(), within->data(), deadline);
  const char* from = static_cast<const char*>(within->data());
  char* to = static_cast<char*>(recv);
  for (size_t li = 0; li < l; ++li) {
    for (size_t mi = 0; mi < m; ++mi) {
      const size_t r = static_cast<size_t>(
          topo_.rankOf(static_cast<int>(mi), static_cast<int>(li)));
      std::memcpy(to + r * block, from + (li * m + mi) * block, block);
    }
  }
}

void ShmCommunicator::hierReduceScatter(const CollectiveInfo& i, const void* send, void* recv,
                                        shm::Clock::time_point deadline) {
  const size_t m = static_cast<size_t>(topo_.nodes), l = static_cast<size_t>(topo_.locals);
  const size_t block = i.count * elementSize(i.dtype);
  auto ordered = scratchOnCommThread(l * m * block, 0);
  auto nodeSums = scratchOnCommThread(m * block, 1);
  const char* from = static_cast<const char*>(send);
  char* to = static_cast<char*>(ordered->data());
  for (size_t li = 0; li < l; ++li) {
    for (size_t mi = 0; mi < m; ++mi) {
      const size_t r = static_cast<size_t>(
          topo_.rankOf(static_cast<int>(mi), static_cast<int>(li)));
      std::memcpy(to + (li * m + mi) * block, from + r * block, block);
    }
  }
  const ReduceOp inNode = i.op == ReduceOp::Avg ? ReduceOp::Sum : i.op;
  engine_->reduceScatter(local(i, m * i.count, inNode), ordered->data(), nodeSums->data(),
                         deadline);
  across([&] {
    cross_->reduceScatter(nodeSums->data(), recv, i.count, i.dtype, inNode, crossCall(deadline, i));
  });
  finishAverage(recv, i.count, i.dtype, i.op, topo_.size);
}

void ShmCommunicator::hierBarrier(const CollectiveInfo& i, shm::Clock::time_point deadline) {
  engine_->barrier(local(i, 0, i.op), deadline);
  across([&] { cross_->barrier(crossCall(deadline, i)); });
  engine_->barrier(local(i, 0, i.op), deadline);
}

namespace {

GlooOptions glooFor(const CpuWorldOptions& o) {
  GlooOptions g;
  g.rank = o.rank;
  g.size = o.size;
  g.store = o.store;
  g.name = o.name;
  g.storeHost = o.storeHost;
  g.timeout = o.timeout;
  g.connectTimeout = o.connectTimeout;
  g.checkCollectives = o.checkCollectives;
  return g;
}

ShmOptions inNode(const CpuWorldOptions& o, const ShmTopology& t, const std::string& name) {
  ShmOptions s = o.shm;
  s.rank = t.local;
  s.size = t.locals;
  s.store = o.store;
  s.name = name;
  s.timeout = o.timeout;
  s.connectTimeout = o.connectTimeout;
  return s;
}

}  // namespace

std::shared_ptr<Communicator> createCpuCommunicatorFor(const CpuWorldOptions& o,
                                                       const NodeMap& map) {
  const int nodes = map.nodes();
  if (o.size == 1 || nodes == o.size || !map.uniform()) {
    if (o.size > 1 && nodes < o.size) {
      DTRAIN_LOG(Info,
                 "rank {}/{}: {} nodes hold different numbers of ranks; using Gloo "
                 "without shared memory",
                 o.rank, o.size, nodes);
    }
    return createGlooCommunicator(glooFor(o));
  }
  ShmCommunicator::Config c;
  c.topology = ShmTopology::of(map, o.rank);
  c.name = o.name;
  c.store = o.store;
  c.storeHost = o.storeHost;
  c.timeout = o.timeout;
  c.connectTimeout = o.connectTimeout;
  c.shm = inNode(o, c.topology,
                 nodes == 1 ? o.name : fmt::format("{}/node{}", o.name, c.topology.node));
  if (nodes > 1) {
    // Every rank joins its cross group first, then its node's segment: the same order
    // everywhere, so no group waits for a rank that is stuck joining the other.
    CpuWorldOptions cross = o;
    cross.rank = c.topology.node;
    cross.size = nodes;
    cross.name = fmt::format("{}/cross{}", o.name, c.topology.local);
    cross.checkCollectives = false;
    // Faults count this communicator's collectives, not the cross ones.
    const ScopedCollectiveFaults none({});
    c.cross = createGlooCommunicator(glooFor(cross));
    c.crossName = cross.name;
  }
  return std::make_shared<ShmCommunicator>(std::move(c));
}

std::shared_ptr<Communicator> createShmCommunicator(const ShmOptions& options) {
  NodeMap map;
  map.nodeOf.assign(static_cast<size_t>(std::max(1, options.size)), "local");
  ShmCommunicator::Config c;
  c.shm = options;
  c.topology = ShmTopology::of(map, options.rank);
  c.name = options.name;
  c.store = options.store;
  c.timeout = options.timeout;
  c.connectTimeout = options.connectTimeout;
  return std::make_shared<ShmCommunicator>(std::move(c));
}

std::shared_ptr<Communicator> createHierarchicalCommunicator(const HierarchicalOptions& options) {
  DTRAIN_CHECK_ARG(static_cast<int>(options.nodes.nodeOf.size()) == options.size,
                   "hierarchical: the node map has {} ranks for a world of {}",
                   options.nodes.nodeOf.size(), options.size);
  DTRAIN_CHECK_ARG(options.nodes.uniform() && options.nodes.nodes() >= 2,
                   "hierarchical: needs two or more nodes with the same number of ranks each");
  CpuWorldOptions o;
  o.rank = options.rank;
  o.size = options.size;
  o.store = options.store;
  o.name = options.name;
  o.node = options.nodes.nodeOf[options.rank];
  o.storeHost = options.storeHost;
  o.timeout = options.timeout;
  o.connectTimeout = options.connectTimeout;
  o.shm = options.shm;
  return createCpuCommunicatorFor(o, options.nodes);
}

std::shared_ptr<Communicator> createCpuCommunicator(const CpuWorldOptions& options) {
  DTRAIN_CHECK_ARG(options.store != nullptr, "rank {}/{}: no store", options.rank, options.size);
  const NodeMap map = exchangeNodeKeys(*options.store, options.name + "/topology", options.rank,
                                       options.size, options.node, options.connectTimeout);
  return createCpuCommunicatorFor(options, map);
}

}  // namespace dtrain::comm
