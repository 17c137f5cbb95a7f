// The communicator conformance suite: one set of TEST_Ps, run over every CPU backend --
// Gloo, shared
// memory, and the hierarchical combination (shared memory inside pretend nodes, Gloo across) --
// with ranks as threads. Closed-form results for every op, dtype and several world sizes; user
// buffers and communicator-owned ones (allocate()), in place and mixed; many-chunk streaming;
// async ordering; subgroups (split / newGroup) with collectives in both directions at once.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "comm_support.h"
#include "dtrain/base/error.h"
#include "typed_buffer.h"

namespace dtrain::comm::communicator_conformance_test {
namespace {

using testing::contribution;
using testing::expectedReduce;
using testing::kAllDtypes;
using testing::kAllOps;
using testing::makeWorld;
using testing::runRanks;
using testing::TypedBuffer;
using testing::WorldKind;

using World = std::vector<std::shared_ptr<Communicator>>;

constexpr size_t kCounts[] = {0, 1, 7, 1001, 5003};

// Where a rank's buffer lives: its own memory, or memory the communicator owns.
enum class Memory { User, Owned };

// A rank's buffer in either kind of memory, with a guard byte after the end; read and written
// through a TypedBuffer.
class RankBuffer {
 public:
  RankBuffer(Communicator& c, Memory memory, DataType dtype, size_t count)
      : dtype_(dtype), count_(count), bytes_(count * elementSize(dtype)) {
    if (memory == Memory::Owned) {
      owned_ = c.allocate(bytes_ + 1);
      data_ = static_cast<uint8_t*>(owned_->data());
    } else {
      user_.resize(bytes_ + 1);
      data_ = user_.data();
    }
    data_[bytes_] = 0xAB;
  }
  void* data() { return data_; }
  bool guardIntact() const { return data_[bytes_] == 0xAB; }
  void fill(const std::function<double(size_t)>& f) {
    TypedBuffer t(dtype_, count_);
    for (size_t i = 0; i < count_; ++i) t.set(i, f(i));
    std::memcpy(data_, t.data(), bytes_);
  }
  std::vector<double> values() const {
    TypedBuffer t(dtype_, count_);
    std::memcpy(t.data(), data_, bytes_);
    std::vector<double> out(count_);
    for (size_t i = 0; i < count_; ++i) out[i] = t.get(i);
    return out;
  }

 private:
  DataType dtype_;
  size_t count_;
  size_t bytes_;
  std::shared_ptr<Buffer> owned_;
  std::vector<uint8_t> user_;
  uint8_t* data_ = nullptr;
};

class Conformance : public ::testing::TestWithParam<WorldKind> {
 protected:
  World world() { return makeWorld(GetParam()); }
  int n() const { return GetParam().size; }
};

void checkAllreduce(World& w, Memory memory, DataType dtype, ReduceOp op, size_t count) {
  const int n = static_cast<int>(w.size());
  runRanks(n, [&](int r) {
    // Mixed worlds: odd ranks use the other kind of memory.
    const Memory mine = (r % 2 == 1 && memory == Memory::Owned) ? Memory::User : memory;
    RankBuffer buf(*w[r], mine, dtype, count);
    buf.fill([&](size_t i) { return contribution(r, i); });
    w[r]->allreduce(buf.data(), count, dtype, op);
    const auto got = buf.values();
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(got[i], expectedReduce(op, dtype, n, i))
          << fmt::format("rank {}/{} {} {} count {} element {}", r, n, dataTypeName(dtype),
                         reduceOpName(op), count, i);
    }
    EXPECT_TRUE(buf.guardIntact()) << "wrote past the end";
  });
}

TEST_P(Conformance, AllreduceEveryDtypeOpAndCount) {
  auto w = world();
  for (DataType dtype : kAllDtypes) {
    for (ReduceOp op : kAllOps) {
      for (size_t count : kCounts) checkAllreduce(w, Memory::User, dtype, op, count);
    }
  }
}

TEST_P(Conformance, AllreduceOfOwnedAndMixedBuffers) {
  auto w = world();
  for (DataType dtype : {DataType::Float32, DataType::BFloat16, DataType::Int64}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
      for (size_t count : {size_t(1), size_t(1001), size_t(70001)}) {
        // Owned on every rank, then owned on even ranks only (checkAllreduce mixes them).
        checkAllreduce(w, Memory::Owned, dtype, op, count);
        runRanks(n(), [&](int r) {
          RankBuffer buf(*w[r], Memory::Owned, dtype, count);
          buf.fill([&](size_t i) { return contribution(r, i); });
          w[r]->allreduce(buf.data(), count, dtype, op);
          const auto got = buf.values();
          for (size_t i = 0; i < count; i += 97) {
            ASSERT_EQ(got[i], expectedReduce(op, dtype, n(), i)) << r << " " << i;
          }
        });
      }
    }
  }
}

TEST_P(Conformance, BroadcastFromEveryRoot) {
  auto w = world();
  for (Memory memory : {Memory::User, Memory::Owned}) {
    for (int root = 0; root < n(); ++root) {
      for (size_t count : {size_t(0), size_t(3), size_t(100003)}) {
        runRanks(n(), [&](int r) {
          RankBuffer buf(*w[r], memory, DataType::Int64, count);
          buf.fill(
              [&](size_t i) { return r == root ? 1000.0 * root + static_cast<double>(i) : -1.0; });
          w[r]->broadcast(buf.data(), count, DataType::Int64, root);
          const auto got = buf.values();
          for (size_t i = 0; i < count; ++i) ASSERT_EQ(got[i], 1000.0 * root + i) << i;
          EXPECT_TRUE(buf.guardIntact());
        });
      }
    }
  }
}

TEST_P(Conformance, AllgatherPlacesRankBlocksInOrder) {
  auto w = world();
  for (size_t count : {size_t(0), size_t(1), size_t(777), size_t(60001)}) {
    runRanks(n(), [&](int r) {
      TypedBuffer send(DataType::BFloat16, count);
      TypedBuffer recv(DataType::BFloat16, count * n());
      recv.setGuard(0xCD);
      for (size_t i = 0; i < count; ++i) send.set(i, contribution(r, i));
      w[r]->allgather(send.data(), recv.data(), count, DataType::BFloat16);
      for (int src = 0; src < n(); ++src) {
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(recv.get(src * count + i), contribution(src, i)) << src << " " << i;
        }
      }
      EXPECT_EQ(recv.guard(), 0xCD);
    });
  }
}

TEST_P(Conformance, AllgatherInPlaceInOwnedMemory) {
  auto w = world();
  const size_t count = 30011;
  runRanks(n(), [&](int r) {
    RankBuffer all(*w[r], Memory::Owned, DataType::Float32, count * n());
    all.fill([&](size_t k) {
      return k / count == static_cast<size_t>(r) ? contribution(r, k % count) : -7.0;
    });
    auto* base = static_cast<float*>(all.data());
    w[r]->allgather(base + r * count, base, count, DataType::Float32);
    const auto got = all.values();
    for (size_t k = 0; k < count * n(); ++k) {
      ASSERT_EQ(got[k], contribution(static_cast<int>(k / count), k % count)) << k;
    }
  });
}

TEST_P(Conformance, ReduceScatterEveryDtypeAndOp) {
  auto w = world();
  for (DataType dtype : kAllDtypes) {
    for (ReduceOp op : kAllOps) {
      for (size_t count : {size_t(0), size_t(5), size_t(4099)}) {
        runRanks(n(), [&](int r) {
          TypedBuffer send(dtype, count * n());
          TypedBuffer recv(dtype, count);
          recv.setGuard(0xCD);
          for (size_t k = 0; k < count * n(); ++k) send.set(k, contribution(r, k));
          w[r]->reduceScatter(send.data(), recv.data(), count, dtype, op);
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(recv.get(i), expectedReduce(op, dtype, n(), r * count + i)) << fmt::format(
                "rank {} {} {} element {}", r, dataTypeName(dtype), reduceOpName(op), i);
          }
          EXPECT_EQ(recv.guard(), 0xCD);
        });
      }
    }
  }
}

TEST_P(Conformance, ReduceScatterInPlaceInOwnedMemory) {
  auto w = world();
  const size_t count = 20011;
  runRanks(n(), [&](int r) {
    RankBuffer all(*w[r], Memory::Owned, DataType::Int32, count * n());
    all.fill([&](size_t k) { return contribution(r, k); });
    auto* base = static_cast<int32_t*>(all.data());
    w[r]->reduceScatter(base, base + r * count, count, DataType::Int32, ReduceOp::Sum);
    const auto got = all.values();
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(got[r * count + i],
                expectedReduce(ReduceOp::Sum, DataType::Int32, n(), r * count + i));
    }
  });
}

TEST_P(Conformance, BarrierHoldsEveryoneUntilTheLastArrives) {
  auto w = world();
  std::atomic<int> arrived{0};
  runRanks(n(), [&](int r) {
    if (r == n() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    arrived++;
    w[r]->barrier();
    EXPECT_EQ(arrived.load(), n()) << "rank " << r << " left the barrier early";
  });
}

TEST_P(Conformance, FloatResultsAreBitwiseIdenticalOnEveryRank) {
  auto w = world();
  const size_t count = 300011;
  std::vector<std::vector<float>> results(n(), std::vector<float>(count));
  runRanks(n(), [&](int r) {
    for (size_t i = 0; i < count; ++i) results[r][i] = 1.0f / (1.0f + r + i * 0.37f);
    w[r]->allreduce(results[r].data(), count, DataType::Float32, ReduceOp::Sum);
  });
  for (int r = 1; r < n(); ++r) {
    EXPECT_EQ(0, std::memcmp(results[0].data(), results[r].data(), count * sizeof(float)))
        << "rank " << r << " differs from rank 0";
  }
}

TEST_P(Conformance, AsyncWorkCompletesInIssueOrder) {
  auto w = world();
  runRanks(n(), [&](int r) {
    constexpr int kOps = 40;
    std::vector<std::vector<int64_t>> bufs(kOps, std::vector<int64_t>(257));
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < kOps; ++k) {
      std::fill(bufs[k].begin(), bufs[k].end(), k * 10 + r);
      works.push_back(
          w[r]->allreduceAsync(bufs[k].data(), bufs[k].size(), DataType::Int64, ReduceOp::Sum));
    }
    works.back()->wait();
    for (auto& work : works) EXPECT_TRUE(work->isCompleted());
    const int64_t ranks = n();
    for (int k = 0; k < kOps; ++k) {
      works[k]->wait();
      EXPECT_EQ(bufs[k][0], ranks * k * 10 + ranks * (ranks - 1) / 2) << k;
    }
  });
}

TEST_P(Conformance, SixtyFourMebibyteAllreduceOfUserAndOwnedBuffers) {
  if (GetParam().tinySlots) GTEST_SKIP() << "covered by the regular-slot worlds";
  auto w = world();
  const size_t count = (64u << 20) / sizeof(float);
  for (Memory memory : {Memory::User, Memory::Owned}) {
    runRanks(n(), [&](int r) {
      std::vector<float> user;
      std::shared_ptr<Buffer> owned;
      float* buf = nullptr;
      if (memory == Memory::Owned) {
        owned = w[r]->allocate(count * sizeof(float));
        buf = static_cast<float*>(owned->data());
      } else {
        user.resize(count);
        buf = user.data();
      }
      for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>(contribution(r, i));
      w[r]->allreduce(buf, count, DataType::Float32, ReduceOp::Sum);
      for (size_t i = 0; i < count; i += 4093) {
        ASSERT_EQ(buf[i], expectedReduce(ReduceOp::Sum, DataType::Float32, n(), i)) << i;
      }
      ASSERT_EQ(buf[count - 1], expectedReduce(ReduceOp::Sum, DataType::Float32, n(), count - 1));
    });
  }
}

TEST_P(Conformance, AllocateGivesAlignedMemoryAndReusesIt) {
  auto w = world();
  void* first = nullptr;
  {
    auto a = w[0]->allocate(1 << 20);
    ASSERT_NE(a->data(), nullptr);
    EXPECT_EQ(a->bytes(), size_t(1) << 20);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % 4096, 0u) << "page aligned";
    std::memset(a->data(), 1, a->bytes());
    first = a->data();
  }
  auto b = w[0]->allocate(1 << 20);
  EXPECT_EQ(b->data(), first) << "a released buffer of the same size is reused";
  auto c = w[0]->allocate(1 << 20);
  EXPECT_NE(c->data(), b->data());
  std::memset(c->data(), 2, c->bytes());
  EXPECT_EQ(static_cast<char*>(b->data())[0], 1) << "buffers do not overlap";
}

// Note [Payload bytes]: a reduce-scatter plus an allgather of a buffer count what its allreduce
// counts, on every backend, whatever each one puts on a wire.
TEST_P(Conformance, PayloadBytesCountEachCollectiveAsItsBusBytes) {
  auto w = world();
  const size_t count = 1000;  // per rank, float32
  const uint64_t whole = count * 4 * static_cast<uint64_t>(n());
  runRanks(n(), [&](int r) {
    std::vector<float> buf(count * n(), 1.0f), block(count, 0.0f);
    const uint64_t before = w[r]->payloadBytes();
    w[r]->allreduce(buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
    const uint64_t allreduce = w[r]->payloadBytes() - before;
    w[r]->reduceScatter(buf.data(), block.data(), count, DataType::Float32, ReduceOp::Avg);
    w[r]->allgather(block.data(), buf.data(), count, DataType::Float32);
    const uint64_t sharded = w[r]->payloadBytes() - before - allreduce;
    w[r]->broadcast(block.data(), count, DataType::Float32, 0);
    w[r]->barrier();
    const uint64_t rest = w[r]->payloadBytes() - before - allreduce - sharded;
    EXPECT_EQ(allreduce, 2 * (n() - 1) * whole / n());
    EXPECT_EQ(sharded, allreduce);
    EXPECT_EQ(rest, n() > 1 ? count * 4 : 0) << "a broadcast counts its buffer, a barrier nothing";
  });
}

TEST_P(Conformance, ValidatesArgumentsBeforeQueueing) {
  auto w = world();
  int64_t x = 0;
  EXPECT_THROW(w[0]->broadcast(&x, 1, DataType::Int64, n()), InvalidArgument);
  EXPECT_THROW(w[0]->allreduce(nullptr, 4, DataType::Int64, ReduceOp::Sum), InvalidArgument);
  EXPECT_EQ(w[0]->sequenceNumber(), 0u) << "rejected calls take no sequence number";
}

TEST_P(Conformance, ShutdownIsIdempotentAndLaterCallsFail) {
  auto w = world();
  runRanks(n(), [&](int r) {
    int32_t v = r;
    w[r]->allreduce(&v, 1, DataType::Int32, ReduceOp::Sum);
    EXPECT_EQ(v, n() * (n() - 1) / 2);
    w[r]->barrier();
    w[r]->shutdown();
    w[r]->shutdown();
    try {
      w[r]->barrier();
      ADD_FAILURE() << "barrier after shutdown succeeded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("shut down"), std::string::npos) << e.what();
    }
  });
}

TEST_P(Conformance, ZeroTimeoutsAreTheDefaultsAndNegativeOnesAreRefused) {
  // Note [Zero timeouts]: a zero collective timeout is the default one; a negative one, per call,
  // is an InvalidArgument and takes no sequence number.
  auto w = makeWorld(GetParam(), Millis(0));
  runRanks(n(), [&](int r) {
    int32_t v = r + 1;
    w[r]->allreduce(&v, 1, DataType::Int32, ReduceOp::Sum);
    EXPECT_EQ(v, n() * (n() + 1) / 2);
    w[r]->barrier(CallOptions{});
  });
  int32_t v = 0;
  CallOptions negative;
  negative.timeout = Millis(-1);
  EXPECT_THROW(w[0]->allreduceAsync(&v, 1, DataType::Int32, ReduceOp::Sum, negative),
               InvalidArgument);
  EXPECT_EQ(w[0]->sequenceNumber(), 2u) << "a refused call takes no sequence number";
}

// Four ranks as a 2x2 grid: rows (0,1) (2,3) and columns (0,2) (1,3), as tensor- and
// pipeline-parallel jobs arrange them; collectives in both directions run at the same time.
TEST_P(Conformance, SplitIntoRowsAndColumnsWithCollectivesInBothAtOnce) {
  if (n() != 4) GTEST_SKIP() << "a 2x2 grid needs four ranks";
  auto w = world();
  runRanks(4, [&](int r) {
    auto row = w[r]->split(r / 2);
    auto col = w[r]->split(r % 2, /*key=*/3 - r);  // columns ranked in reverse
    ASSERT_TRUE(row && col);
    EXPECT_EQ(row->size(), 2);
    EXPECT_EQ(row->rank(), r % 2);
    EXPECT_EQ(col->rank(), r < 2 ? 1 : 0) << "key orders the column";
    for (int iter = 0; iter < 20; ++iter) {
      std::vector<float> a(100003, static_cast<float>(r + iter));
      std::vector<int64_t> b(513, r * 10 + iter);
      auto wa = row->allreduceAsync(a.data(), a.size(), DataType::Float32, ReduceOp::Sum);
      auto wb = col->allreduceAsync(b.data(), b.size(), DataType::Int64, ReduceOp::Max);
      wb->wait();
      wa->wait();
      const int rowBase = r / 2 * 2;
      ASSERT_EQ(a[7], static_cast<float>(rowBase + rowBase + 1 + 2 * iter)) << "row of rank " << r;
      ASSERT_EQ(b[512], (r % 2 + 2) * 10 + iter) << "column of rank " << r;
    }
    // The groups also broadcast and gather like any communicator.
    int64_t v = r;
    col->broadcast(&v, 1, DataType::Int64, /*root=*/0);  // column rank 0 is world rank 2 or 3
    EXPECT_EQ(v, r % 2 + 2);
    int32_t mine = r, all[2] = {-1, -1};
    row->allgather(&mine, all, 1, DataType::Int32);
    EXPECT_EQ(all[0], r / 2 * 2);
    EXPECT_EQ(all[1], r / 2 * 2 + 1);
    // The world still works beside its groups.
    w[r]->barrier();
  });
}

TEST_P(Conformance, NewGroupOfSomeRanksAndNullForTheRest) {
  if (n() < 3) GTEST_SKIP() << "needs a rank outside the group";
  auto w = world();
  runRanks(n(), [&](int r) {
    auto g = w[r]->newGroup({n() - 1, 0});
    if (r != 0 && r != n() - 1) {
      EXPECT_EQ(g, nullptr);
      return;
    }
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->size(), 2);
    EXPECT_EQ(g->rank(), r == 0 ? 0 : 1) << "ascending order of world ranks";
    double x = r + 0.5;
    g->allreduce(&x, 1, DataType::Float64, ReduceOp::Sum);
    EXPECT_EQ(x, n() - 1 + 0.5 + 0.5);
  });
}

TEST_P(Conformance, NewGroupWithDifferentListsFailsOnEveryRankNamingThem) {
  if (n() < 2) GTEST_SKIP();
  auto w = world();
  runRanks(n(), [&](int r) {
    try {
      w[r]->newGroup(r == 1 ? std::vector<int>{0} : std::vector<int>{0, 1});
      ADD_FAILURE() << "rank " << r << ": no error";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("rank 0 passed [0,1], rank 1 passed [0]"),
                std::string::npos)
          << e.what();
    }
  });
}

std::vector<WorldKind> kinds() {
  std::vector<WorldKind> out;
  for (int size : {1, 2, 3, 4}) out.push_back({"shm", size});
  out.push_back({"shm", 3, 1, false, true});
  if (glooAvailable()) {  // Gloo alone, and across the pretend nodes of the hierarchical ones
    for (int size : {1, 2, 3, 4}) out.push_back({"gloo", size});
    out.push_back({"hier", 4, 2});
    out.push_back({"hier", 4, 2, false, true});
    out.push_back({"hier", 6, 2, true});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::ValuesIn(kinds()),
                         [](const auto& info) { return info.param.label(); });

}  // namespace
}  // namespace dtrain::comm::communicator_conformance_test
