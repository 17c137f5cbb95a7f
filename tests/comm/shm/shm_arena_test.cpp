// The shared-memory communicator's memory: allocate() hands out pieces of the rank's arena (peers
// read them in place), merges freed neighbours, touches pages once; a request beyond the arena
// falls back to private memory, whose collectives are still exact (they copy through the staging
// slots).
#include <gtest/gtest.h>

#include <cstring>

#include "comm_support.h"
#include "shm_arena.h"
#include "shm_segment.h"

namespace dtrain::comm::shm_arena_test {
namespace {

using testing::runRanks;
using testing::shmTestOptions;

std::shared_ptr<shm::Segment> oneRankSegment(size_t arenaBytes) {
  shm::SegmentOptions o;
  o.store = std::make_shared<store::HashStore>();
  o.name = "arena-test";
  o.tuning.slotBytes = 4096;
  o.tuning.arenaBytes = arenaBytes;
  o.connectTimeout = std::chrono::milliseconds(5000);
  return shm::Segment::join(o);
}

TEST(ShmArena, PiecesLieInTheArenaAndFreedNeighboursMerge) {
  auto segment = oneRankSegment(size_t{64} << 20);
  auto arena = shm::Arena::create(segment);
  auto a = arena->allocate(100);
  auto b = arena->allocate(3 << 20);  // 2 MiB-aligned
  auto c = arena->allocate(4096);
  ASSERT_TRUE(a && b && c);
  for (auto* buf : {a.get(), b.get(), c.get()}) {
    EXPECT_GE(segment->ownOffset(buf->data(), buf->bytes()), 0) << "inside this rank's arena";
  }
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % (2u << 20), 0u);
  const size_t touched = arena->touchedBytes();
  void* aAt = a->data();
  a.reset();
  c.reset();
  b.reset();
  EXPECT_EQ(arena->inUseBytes(), 0u);
  // Everything merged back into one piece: a request as large as all three fits at the start,
  // without touching new pages.
  auto big = arena->allocate(touched);
  ASSERT_TRUE(big);
  EXPECT_EQ(big->data(), aAt);
  EXPECT_EQ(arena->touchedBytes(), touched);
  EXPECT_EQ(arena->allocate(size_t{64} << 20), nullptr) << "more than the arena holds";
}

TEST(ShmArena, BeyondTheArenaBuffersAreStillReducedExactly) {
  auto store = std::make_shared<store::HashStore>();
  std::vector<std::shared_ptr<Communicator>> w(2);
  runRanks(2, [&](int r) {
    auto o = shmTestOptions(r, 2, store);
    o.arenaBytes = size_t{2} << 20;
    w[r] = createShmCommunicator(o);
  });
  runRanks(2, [&](int r) {
    const size_t count = (3u << 20) / sizeof(float);  // more than the 2 MiB arena
    auto buffer = w[r]->allocate(count * sizeof(float));
    auto* x = static_cast<float*>(buffer->data());
    for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(r + i % 7);
    w[r]->allreduce(x, count, DataType::Float32, ReduceOp::Sum);
    for (size_t i = 0; i < count; i += 101) ASSERT_EQ(x[i], static_cast<float>(1 + 2 * (i % 7)));
  });
}

}  // namespace
}  // namespace dtrain::comm::shm_arena_test
