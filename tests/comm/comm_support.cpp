#include "comm_support.h"

#include <exception>

#include <gtest/gtest.h>

namespace dtrain::testing {

comm::ShmOptions shmTestOptions(int rank, int size, std::shared_ptr<store::Store> store,
                                std::chrono::milliseconds timeout) {
  comm::ShmOptions o;
  o.rank = rank;
  o.size = size;
  o.store = std::move(store);
  o.timeout = timeout;
  o.connectTimeout = std::chrono::milliseconds(10000);
  o.arenaBytes = size_t{1} << 30;
  return o;
}

std::string WorldKind::label() const {
  std::string out = backend + std::to_string(size);
  if (backend == "hier") out += "on" + std::to_string(nodes) + "nodes";
  if (tinySlots) out += "chunked";
  return out;
}

std::vector<std::shared_ptr<comm::Communicator>> makeWorld(const WorldKind& kind,
                                                           std::chrono::milliseconds timeout) {
  if (kind.backend == "gloo") {
    return makeGlooWorld(kind.size, [&](comm::GlooOptions& o) { o.timeout = timeout; });
  }
  auto store = std::make_shared<store::HashStore>();
  std::vector<std::shared_ptr<comm::Communicator>> world(kind.size);
  comm::NodeMap map;
  const int perNode = kind.size / std::max(1, kind.nodes);
  for (int r = 0; r < kind.size; ++r) {
    const int node = kind.interleaved ? r % kind.nodes : r / std::max(1, perNode);
    map.nodeOf.push_back("node" + std::to_string(node));
  }
  runRanks(kind.size, [&](int r) {
    comm::ShmOptions s = shmTestOptions(r, kind.size, store, timeout);
    if (kind.tinySlots) {
      s.slotBytes = 4096;
      s.ownedChunkBytes = 8192;
      s.smallBytes = 256;
    }
    if (kind.backend == "shm") {
      world[r] = comm::createShmCommunicator(s);
      return;
    }
    comm::HierarchicalOptions h;
    h.rank = r;
    h.size = kind.size;
    h.store = store;
    h.nodes = map;
    h.timeout = timeout;
    h.connectTimeout = std::chrono::milliseconds(10000);
    h.shm = s;
    world[r] = comm::createHierarchicalCommunicator(h);
  });
  return world;
}

double elapsedMs(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

std::string messageOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

fault::Fault faultAt(fault::Kind kind, int rank, int64_t seq) {
  fault::Fault f;
  f.kind = kind;
  f.rank = rank;
  f.step = seq;
  return f;
}

void expectQueuedCollectivesFailWithTheFirstError(comm::Communicator& rank0) {
  using comm::DataType;
  using comm::ReduceOp;
  std::vector<int32_t> a(8), b(8), c(8);
  auto wa = rank0.allreduceAsync(a.data(), 8, DataType::Int32, ReduceOp::Sum);
  auto wb = rank0.allreduceAsync(b.data(), 8, DataType::Int32, ReduceOp::Sum);
  auto wc = rank0.allreduceAsync(c.data(), 8, DataType::Int32, ReduceOp::Sum);
  const std::string ea = messageOf([&] { wa->wait(); });
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(messageOf([&] { wb->wait(); }), ea);
  EXPECT_EQ(messageOf([&] { wc->wait(); }), ea);
  EXPECT_LT(elapsedMs(start), 200);
  EXPECT_CONTAINS(ea, "seq 0 allreduce(int32 x 8, sum) failed");
}

}  // namespace dtrain::testing
