// Gloo collectives with ranks as threads: closed-form results for every op, dtype and world size
// 1-4, odd and zero counts, both allreduce algorithms, async ordering, 64 MiB buffers.
#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <thread>

#include <fmt/format.h>

#include "comm_test_support.h"
#include "dtrain/error.h"
#include "typed_buffer.h"

namespace dtrain::comm {
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

void checkAllreduce(std::vector<std::shared_ptr<Communicator>>& world, DataType dtype,
                    ReduceOp op, size_t count) {
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

TEST_P(GlooWorldSize, AllreduceEveryDtypeOpAndCount) {
  auto world = worldWithSmallCrossover(GetParam());
  for (DataType dtype : kAllDtypes) {
    for (ReduceOp op : kAllOps) {
      for (size_t count : kCounts) checkAllreduce(world, dtype, op, count);
    }
  }
}

TEST_P(GlooWorldSize, BroadcastFromEveryRoot) {
  const int n = GetParam();
  auto world = makeGlooWorld(n);
  for (int root = 0; root < n; ++root) {
    for (size_t count : {size_t(0), size_t(3), size_t(100003)}) {
      runRanks(n, [&](int r) {
        TypedBuffer buf(DataType::Int64, count);
        for (size_t i = 0; i < count; ++i) buf.set(i, r == root ? 1000.0 * root + i : -1.0);
        world[r]->broadcast(buf.data(), count, DataType::Int64, root);
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(buf.get(i), 1000.0 * root + i) << i;
      });
    }
  }
}

TEST_P(GlooWorldSize, AllgatherPlacesRankBlocksInOrder) {
  const int n = GetParam();
  auto world = makeGlooWorld(n);
  for (size_t count : {size_t(0), size_t(1), size_t(777), size_t(60001)}) {
    runRanks(n, [&](int r) {
      TypedBuffer send(DataType::BFloat16, count);
      TypedBuffer recv(DataType::BFloat16, count * n);
      for (size_t i = 0; i < count; ++i) send.set(i, contribution(r, i));
      world[r]->allgather(send.data(), recv.data(), count, DataType::BFloat16);
      for (int src = 0; src < n; ++src) {
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(recv.get(src * count + i), contribution(src, i)) << src << " " << i;
        }
      }
    });
  }
}

TEST_P(GlooWorldSize, ReduceScatterEveryDtypeAndOp) {
  const int n = GetParam();
  auto world = makeGlooWorld(n);
  for (DataType dtype : kAllDtypes) {
    for (ReduceOp op : kAllOps) {
      for (size_t count : {size_t(0), size_t(5), size_t(4099)}) {
        runRanks(n, [&](int r) {
          TypedBuffer send(dtype, count * n);
          TypedBuffer recv(dtype, count);
          recv.setGuard(0xCD);
          // Block b, element i: the same closed form over the global index.
          for (size_t k = 0; k < count * n; ++k) send.set(k, contribution(r, k));
          world[r]->reduceScatter(send.data(), recv.data(), count, dtype, op);
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(recv.get(i), expectedReduce(op, dtype, n, r * count + i))
                << fmt::format("rank {} {} {} element {}", r, dataTypeName(dtype),
                               reduceOpName(op), i);
          }
          EXPECT_EQ(recv.guard(), 0xCD);
        });
      }
    }
  }
}

TEST_P(GlooWorldSize, BarrierHoldsEveryoneUntilTheLastArrives) {
  const int n = GetParam();
  auto world = makeGlooWorld(n);
  std::atomic<int> arrived{0};
  runRanks(n, [&](int r) {
    if (r == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    arrived++;
    world[r]->barrier();
    EXPECT_EQ(arrived.load(), n) << "rank " << r << " left the barrier early";
  });
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

TEST(GlooCollectives, AsyncWorkCompletesInIssueOrder) {
  const int n = 2;
  auto world = makeGlooWorld(n);
  runRanks(n, [&](int r) {
    constexpr int kOps = 40;
    std::vector<std::vector<int64_t>> bufs(kOps, std::vector<int64_t>(257));
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < kOps; ++k) {
      std::fill(bufs[k].begin(), bufs[k].end(), k * 10 + r);
      works.push_back(world[r]->allreduceAsync(bufs[k].data(), bufs[k].size(), DataType::Int64,
                                               ReduceOp::Sum));
    }
    // Waiting on the last one first: everything before it has run by then.
    works.back()->wait();
    for (auto& w : works) EXPECT_TRUE(w->isCompleted());
    for (int k = 0; k < kOps; ++k) {
      works[k]->wait();
      EXPECT_EQ(bufs[k][0], 2 * k * 10 + 1) << k;
    }
  });
}

TEST(GlooCollectives, SixtyFourMebibyteAllreduce) {
  const int n = 2;
  const size_t count = (64u << 20) / sizeof(float);
  auto world = makeGlooWorld(n);
  runRanks(n, [&](int r) {
    std::vector<float> buf(count);
    for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>(contribution(r, i));
    world[r]->allreduce(buf.data(), count, DataType::Float32, ReduceOp::Sum);
    for (size_t i = 0; i < count; i += 4093) {
      ASSERT_EQ(buf[i], expectedReduce(ReduceOp::Sum, DataType::Float32, n, i)) << i;
    }
    ASSERT_EQ(buf[count - 1], expectedReduce(ReduceOp::Sum, DataType::Float32, n, count - 1));
  });
}

TEST(GlooCollectives, AllocateReusesReleasedMemory) {
  auto world = makeGlooWorld(1);
  void* first = nullptr;
  {
    auto a = world[0]->allocate(1 << 20);
    ASSERT_NE(a->data(), nullptr);
    EXPECT_EQ(a->bytes(), size_t(1) << 20);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % 4096, 0u) << "page aligned";
    std::memset(a->data(), 1, a->bytes());
    first = a->data();
  }
  auto b = world[0]->allocate(1 << 20);
  EXPECT_EQ(b->data(), first) << "a released buffer of the same size is reused";
  auto c = world[0]->allocate(1 << 20);
  EXPECT_NE(c->data(), b->data());
}

TEST(GlooCollectives, ValidatesArgumentsBeforeQueueing) {
  auto world = makeGlooWorld(2);
  int64_t x = 0;
  EXPECT_THROW(world[0]->broadcast(&x, 1, DataType::Int64, 2), InvalidArgument);
  EXPECT_THROW(world[0]->allreduce(nullptr, 4, DataType::Int64, ReduceOp::Sum), InvalidArgument);
  EXPECT_EQ(world[0]->sequenceNumber(), 0u) << "rejected calls take no sequence number";
}

TEST(GlooCollectives, ZeroTimeoutsAreTheDefaults) {
  // Note [Zero timeouts]: a zero collective or connect timeout is the default one (it was refused
  // as "must be positive"); a negative one, per call or per wait, is an InvalidArgument.
  auto world = makeGlooWorld(2, [](GlooOptions& o) {
    o.timeout = Millis(0);
    o.connectTimeout = Millis(0);
  });
  runRanks(2, [&](int r) {
    int32_t v = r + 1;
    world[r]->allreduce(&v, 1, DataType::Int32, ReduceOp::Sum);
    EXPECT_EQ(v, 3);
  });
  int32_t v = 0;
  CallOptions negative;
  negative.timeout = Millis(-1);
  EXPECT_THROW(world[0]->allreduceAsync(&v, 1, DataType::Int32, ReduceOp::Sum, negative),
               InvalidArgument);
  EXPECT_EQ(world[0]->sequenceNumber(), 1u) << "a refused call takes no sequence number";
}

TEST(GlooCollectives, ShutdownIsIdempotentAndLaterCallsFail) {
  auto world = makeGlooWorld(2);
  runRanks(2, [&](int r) {
    int32_t v = r;
    world[r]->allreduce(&v, 1, DataType::Int32, ReduceOp::Sum);
    EXPECT_EQ(v, 1);
    world[r]->barrier();
    world[r]->shutdown();
    world[r]->shutdown();
    try {
      world[r]->barrier();
      ADD_FAILURE() << "barrier after shutdown succeeded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("shut down"), std::string::npos) << e.what();
    }
  });
}

TEST(GlooCollectives, DescribeNamesBackendRankAndAddress) {
  auto world = makeGlooWorld(2);
  EXPECT_EQ(world[1]->describe(), "gloo rank 1/2 (127.0.0.1)");
  EXPECT_STREQ(world[0]->backendName(), "gloo");
}

}  // namespace
}  // namespace dtrain::comm
