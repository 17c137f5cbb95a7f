// What is particular to the Gloo backend, with ranks as threads: both allreduce algorithms (the
// direct exchange and the ring, on either side of a small crossover) for every op, dtype and
// world size 1-4, their bitwise agreement, the chunked exchange. What every backend must do is in
// communicator_conformance_test.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <thread>

#include <fmt/format.h>

#include "comm_support.h"
#include "dtrain/base/error.h"
#include "typed_buffer.h"

namespace dtrain::comm::gloo_collectives_test {
namespace {

using testing::contribution;
using testing::expectedReduce;
using testing::kAllDtypes;
using testing::kAllOps;
using testing::makeGlooWorld;
using testing::runRanks;
using testing::TypedBuffer;

// Counts that cover empty, single, odd, and (for 4+ byte types) both sides of the direct/ring
// crossover that the world below sets to 4 KiB.
constexpr size_t kCounts[] = {0, 1, 7, 1001, 5003};

std::vector<std::shared_ptr<Communicator>> worldWithSmallCrossover(int size) {
  return makeGlooWorld(size, [](GlooOptions& o) { o.smallAllreduceBytes = 4096; });
}

void checkAllreduce(std::vector<std::shared_ptr<Communicator>>& world, DataType dtype, ReduceOp op,
                    size_t count) {
  const int n = static_cast<int>(world.size());
  runRanks(n, [&](int r) {
    TypedBuffer buf(dtype, count);
    buf.setGuard(0xAB);
    for (size_t i = 0; i < count; ++i) buf.set(i, contribution(r, i));
    world[r]->allreduce(buf.data(), count, dtype, op);
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(buf.get(i), expectedReduce(op, dtype, n, i))
          << fmt::format("rank {}/{} {} {} count {} element {}", r, n, dataTypeName(dtype),
                         reduceOpName(op), count, i);
    }
    EXPECT_EQ(buf.guard(), 0xAB) << "wrote past the end";
  });
}

class GlooWorldSize : public ::testing::TestWithParam<int> {};

TEST_P(GlooWorldSize, BothAllreduceAlgorithmsEveryDtypeOpAndCount) {
  auto world = worldWithSmallCrossover(GetParam());
  for (DataType dtype : kAllDtypes) {
    for (ReduceOp op : kAllOps) {
      for (size_t count : kCounts) checkAllreduce(world, dtype, op, count);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, GlooWorldSize, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

TEST(GlooCollectives, RingAndDirectAgreeBitwiseOnFloats) {
  // Irrational-ish values: the two algorithms reduce in different orders, but each one gives
  // identical results on every rank.
  const int n = 3;
  const size_t count = 30011;
  for (size_t crossover : {size_t(0), size_t(1) << 30}) {
    auto world = makeGlooWorld(n, [&](GlooOptions& o) { o.smallAllreduceBytes = crossover; });
    std::vector<std::vector<float>> results(n, std::vector<float>(count));
    runRanks(n, [&](int r) {
      for (size_t i = 0; i < count; ++i) results[r][i] = 1.0f / (1.0f + r + i * 0.37f);
      world[r]->allreduce(results[r].data(), count, DataType::Float32, ReduceOp::Sum);
    });
    for (int r = 1; r < n; ++r) {
      EXPECT_EQ(0, std::memcmp(results[0].data(), results[r].data(), count * sizeof(float)))
          << "rank " << r << " differs from rank 0 (crossover " << crossover << ")";
    }
  }
}

TEST(GlooCollectives, ChunkedDirectExchangeAcrossManyWindows) {
  // 1000-byte chunks: a 5003-element buffer spans far more chunks than the in-flight window, with
  // a partial last chunk and (for 2-byte types) chunks that split no element.
  for (int n : {2, 3}) {
    auto world = makeGlooWorld(n, [](GlooOptions& o) {
      o.directChunkBytes = 1000;
      o.smallAllreduceBytes = size_t(1) << 30;
    });
    for (DataType dtype : kAllDtypes) {
      for (size_t count : {size_t(1), size_t(7), size_t(5003)}) {
        checkAllreduce(world, dtype, ReduceOp::Sum, count);
        checkAllreduce(world, dtype, ReduceOp::Max, count);
      }
    }
  }
}

TEST(GlooCollectives, DescribeNamesBackendRankAndAddress) {
  auto world = makeGlooWorld(2);
  EXPECT_EQ(world[1]->describe(), "gloo rank 1/2 (127.0.0.1)");
  EXPECT_STREQ(world[0]->backendName(), "gloo");
}

}  // namespace
}  // namespace dtrain::comm::gloo_collectives_test
