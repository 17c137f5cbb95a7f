// The CPU backends' allocate() memory (Note [Host buffer reuse] in
// runtime/comm/host_buffer_pool.h): a released buffer serves a later request that fits it and is
// not much smaller, the stats say what is handed out, the most at once and what is cached, and
// trim() gives back what lay idle since the previous trim while what every cycle reuses stays.
#include <gtest/gtest.h>

#include "comm_support.h"
#include "host_buffer_pool.h"

namespace dtrain::comm::host_buffer_pool_test {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kPage = 4096;

TEST(HostBufferPool, NearSizesShareABufferAndASmallRequestDoesNotTakeALargeOne) {
  auto pool = HostBufferPool::create();
  void* first = nullptr;
  {
    auto a = pool->allocate(4 * kMiB + kPage);
    first = a->data();
  }
  auto b = pool->allocate(4 * kMiB);  // a page smaller: the same memory
  EXPECT_EQ(b->data(), first);
  EXPECT_EQ(b->bytes(), 4 * kMiB);
  b.reset();
  auto c = pool->allocate(kMiB);  // a quarter of it: fresh memory, the 4 MiB stays cached
  EXPECT_NE(c->data(), first);
  const BufferStats s = pool->stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.inUseBytes, kMiB);
  EXPECT_EQ(s.cachedBytes, 4 * kMiB + kPage);
  EXPECT_EQ(s.peakInUseBytes, 4 * kMiB + kPage);
}

TEST(HostBufferPool, PeakCountsTheMostInUseAtOnceSinceItsReset) {
  auto pool = HostBufferPool::create();
  auto a = pool->allocate(3 * kPage);
  {
    auto b = pool->allocate(5 * kPage);
    EXPECT_EQ(pool->stats().inUseBytes, 8 * kPage);
  }
  EXPECT_EQ(pool->stats().peakInUseBytes, 8 * kPage);
  pool->resetPeak();
  EXPECT_EQ(pool->stats().peakInUseBytes, 3 * kPage);
  EXPECT_EQ(pool->stats().cachedBytes, 5 * kPage);
  auto zero = pool->allocate(0);  // a page
  EXPECT_EQ(pool->stats().inUseBytes, 4 * kPage);
}

// A cycle (a training step) that uses one buffer each time, after a phase that left another
// behind: trimming once per cycle frees the leftover after one idle cycle, and never the buffer
// the cycles reuse -- no fresh memory after the first cycle.
TEST(HostBufferPool, TrimFreesWhatLayIdleForACycleAndKeepsWhatEveryCycleReuses) {
  auto pool = HostBufferPool::create();
  pool->allocate(8 * kMiB).reset();  // the build's: never asked for again
  pool->trim();                      // the build ends
  for (int cycle = 0; cycle < 4; ++cycle) {
    { auto step = pool->allocate(2 * kMiB); }
    pool->trim();
    const BufferStats s = pool->stats();
    EXPECT_EQ(s.misses, 2u) << "cycle " << cycle << ": the step's buffer is reused";
    EXPECT_EQ(s.cachedBytes, 2 * kMiB) << "cycle " << cycle << ": the build's buffer is gone";
    EXPECT_EQ(s.freed, 1u);
  }
  // The cycles stop: their buffer goes at the next trim. A buffer held across trims counts as
  // idle from its release only.
  auto held = pool->allocate(kMiB);
  pool->trim();
  EXPECT_EQ(pool->stats().cachedBytes, 0u);
  pool->trim();
  held.reset();
  pool->trim();
  EXPECT_EQ(pool->stats().cachedBytes, kMiB);
  pool->trim();
  EXPECT_EQ(pool->stats().cachedBytes, 0u);
  EXPECT_EQ(pool->stats().freed, 3u);
}

TEST(HostBufferPool, GlooCommunicatorReportsItsPool) {
  if (!glooAvailable()) GTEST_SKIP() << "built without Gloo";
  auto world = testing::makeGlooWorld(1);
  Communicator& comm = *world[0];
  const BufferStats before = comm.bufferStats();
  {
    auto a = comm.allocate(kMiB);
    EXPECT_EQ(comm.bufferStats().inUseBytes, before.inUseBytes + kMiB);
  }
  EXPECT_EQ(comm.bufferStats().cachedBytes, before.cachedBytes + kMiB);
  comm.trimBuffers();
  comm.trimBuffers();
  EXPECT_EQ(comm.bufferStats().cachedBytes, 0u);
  comm.shutdown();
}

}  // namespace
}  // namespace dtrain::comm::host_buffer_pool_test
