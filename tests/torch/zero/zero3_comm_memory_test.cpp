// What a ZeRO-3 job keeps in its communicator's memory (Note [Communication buffers of a step] in
// runtime/torch/zero/collectives.h), over Gloo with ranks as threads: its pooled host buffers are
// what Communicator::bufferStats() counts. A buffer is in use only while a gathered unit or a
// gradient bucket needs it: between steps none is, and the communicator's cache keeps what a step
// has in flight at once -- gathered units and gradient buckets of the units' own size, not a
// doubled size class -- and nothing of the job's build (DDP's buckets replaced, the buffers the
// units were bound through); a steady step touches no fresh memory.
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "../process_group_support.h"
#include "dtrain/comm/gloo_communicator.h"
#include "dtrain/torch/fully_shard.h"
#include "zero_support.h"

namespace dtrain::testing::zero3_comm_memory_test {
namespace {

// Units of 1024 x 1024 + 1024 float32 elements: 4 MiB and a page (4,198,400 bytes), just past a
// power of two, at 1 and 2 ranks alike (no padding); the first is narrower.
constexpr int64_t kWidth = 1024;
constexpr size_t kUnitBytes = (kWidth * kWidth + kWidth) * sizeof(float);
constexpr int kLayers = 4;
// The first layer, the last unit of backward, is narrower: 65 KiB and a page.
constexpr int64_t kInputs = 16;
constexpr size_t kFirstUnitBytes = (kInputs * kWidth + kWidth) * sizeof(float);

TEST(Zero3CommMemory, HeldBetweenStepsIsAStepsPeakAndTheBuildIsGone) {
  if (!comm::glooAvailable()) GTEST_SKIP() << "built without Gloo";
  constexpr int kWorld = 2;
  std::vector<comm::BufferStats> afterWarmup(kWorld), end(kWorld);
  std::vector<size_t> stepPeak(kWorld, 0);
  std::vector<ZeroMemory> memory(kWorld);
  runOnGlooGroups(kWorld, comm::Millis(10000), [&](int rank, const auto& group) {
    comm::Communicator& comm = group->communicator();
    torch::manual_seed(5);
    torch::nn::Sequential body;
    body->push_back(torch::nn::Linear(kInputs, kWidth));
    for (int l = 1; l < kLayers; ++l) body->push_back(torch::nn::Linear(kWidth, kWidth));
    auto net = shardEveryChild(body);  // built whole, every layer a unit
    DistributedDataParallel<torch::nn::Sequential> ddp(net, group);
    const auto x = torch::randn({4, kInputs});
    // A forward before the optimizer: DDP makes its buckets, which stage 3 then replaces.
    ddp(x);
    ZeroOptions zo;
    zo.stage = 3;
    ShardedOptimizer optimizer(
        ddp, optimizerFactory<torch::optim::Adam>(torch::optim::AdamOptions(1e-3)), zo);
    for (int s = 0; s < 4; ++s) {
      if (s == 2) afterWarmup[static_cast<size_t>(rank)] = comm.bufferStats();
      comm.resetBufferPeak();
      optimizer.zero_grad();
      ddp(x).square().mean().backward();
      optimizer.step();
      auto& peak = stepPeak[static_cast<size_t>(rank)];
      if (s >= 2) peak = std::max(peak, comm.bufferStats().peakInUseBytes);
    }
    end[static_cast<size_t>(rank)] = comm.bufferStats();
    memory[static_cast<size_t>(rank)] = optimizer.stats().memory;
  });
  for (int r = 0; r < kWorld; ++r) {
    const comm::BufferStats& s = end[static_cast<size_t>(r)];
    SCOPED_TRACE("rank " + std::to_string(r));
    // In flight at once: three units' buffers -- the unit computing, the next one gathered
    // (backward prefetch) and the bucket of the one before -- not four: a unit's bucket takes
    // the buffer its gathered parameters just gave back, and the bucket whose reduce-scatter ran
    // before a unit's all-gather goes back before the next prefetch (Note [Buckets back before
    // the next prefetch]). Before the fix of size classes each was a doubled one: 8 MiB.
    EXPECT_LE(stepPeak[static_cast<size_t>(r)], 3 * kUnitBytes);
    EXPECT_LE(memory[static_cast<size_t>(r)].gatherPool, 2 * kUnitBytes);
    // One bucket at a time although bucketsInFlight is 2 -- a unit's bucket is leased once the
    // reduce-scatter queued before the prefetched unit's all-gather is over (the same Note) --
    // but for the last unit of backward, which prefetches nothing: its bucket and the one
    // before it.
    EXPECT_LE(memory[static_cast<size_t>(r)].buckets, kUnitBytes + kFirstUnitBytes);
    EXPECT_GT(memory[static_cast<size_t>(r)].buckets, 0u) << "the last step's buckets";
    // Between steps no pool holds a buffer idle: each went back to the communicator's cache,
    // which keeps what a step uses at its peak, not more -- and the first unit's small buffer,
    // which no request of the large units fits (page-rounded).
    EXPECT_EQ(s.inUseBytes, 0u);
    EXPECT_GT(s.cachedBytes, 0u);
    EXPECT_LE(s.cachedBytes, stepPeak[static_cast<size_t>(r)] + kFirstUnitBytes + 4096);
    // DDP's buckets (the whole model) and the buffers the units were bound through were idle
    // for a step: given back to the system, not cached.
    EXPECT_GT(s.freed, 0u);
    // A steady step reuses what the last one left: no fresh memory touched.
    EXPECT_EQ(s.misses, afterWarmup[static_cast<size_t>(r)].misses);
  }
}

}  // namespace
}  // namespace dtrain::testing::zero3_comm_memory_test
