// The collective check through the store (Note [Collective check through the store]): what the
// NCCL backend runs under DTRAIN_CHECK_COLLECTIVES=1, checked here with ranks as threads.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "comm_support.h"
#include "dtrain/base/error.h"
#include "store_collective_check.h"

namespace dtrain::comm::store_collective_check_test {
namespace {

using std::chrono::milliseconds;
using testing::runRanks;

CollectiveInfo allreduceOf(size_t count, uint64_t seq) {
  CollectiveInfo info = CollectiveInfo::allreduce(DataType::Float32, count, ReduceOp::Sum);
  info.seq = seq;
  return info;
}

std::string who(int rank, int size) {
  return "rank " + std::to_string(rank) + "/" + std::to_string(size);
}

TEST(StoreCollectiveCheck, AgreeingRanksPassAndTheStoreStaysSmall) {
  auto store = std::make_shared<store::HashStore>();
  runRanks(3, [&](int r) {
    for (uint64_t seq = 0; seq < 20; ++seq) {
      checkCollectiveThroughStore(*store, "pg/check", r, 3, allreduceOf(1024, seq),
                                  milliseconds(5000), who(r, 3));
    }
  });
  EXPECT_LE(store->numKeys(), 6) << "fingerprints of old collectives must be deleted";
}

TEST(StoreCollectiveCheck, ADifferentCountFailsEveryRankNamingBothSides) {
  auto store = std::make_shared<store::HashStore>();
  std::vector<std::string> errors(3);
  runRanks(3, [&](int r) {
    try {
      checkCollectiveThroughStore(*store, "pg/check", r, 3, allreduceOf(r == 1 ? 1023 : 1024, 0),
                                  milliseconds(5000), who(r, 3));
    } catch (const InvalidArgument& e) {
      errors[r] = e.what();
    }
  });
  EXPECT_NE(errors[0].find("rank 0/3: collective check failed: this rank calls seq 0 "
                           "allreduce(float32 x 1024, sum); rank 1 calls seq 0 "
                           "allreduce(float32 x 1023, sum)"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("rank 0 calls seq 0 allreduce(float32 x 1024, sum); rank 2 calls"),
            std::string::npos)
      << errors[1];
  EXPECT_NE(errors[2].find("rank 1 calls seq 0 allreduce(float32 x 1023, sum)"), std::string::npos)
      << errors[2];
}

TEST(StoreCollectiveCheck, ARankThatNeverArrivesIsNamedAtTheTimeout) {
  auto store = std::make_shared<store::HashStore>();
  std::vector<std::string> errors(3);
  runRanks(3, [&](int r) {
    if (r == 2) return;  // skipped the collective
    try {
      checkCollectiveThroughStore(*store, "pg/check", r, 3, allreduceOf(8, 0), milliseconds(200),
                                  who(r, 3));
    } catch (const TimeoutError& e) {
      errors[r] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("rank(s) 2 did not reach seq 0 within 200 ms"), std::string::npos)
        << errors[r];
  }
}

}  // namespace
}  // namespace dtrain::comm::store_collective_check_test
