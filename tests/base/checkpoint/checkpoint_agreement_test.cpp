// Note [Checkpoint agreement] (runtime/base/checkpoint/agreement.h): ranks as threads over one
// HashStore agree on outcomes and share values; a rank that arrives late (a slow writer) is
// waited for up to the deadline, however short the collectives' timeout would be; one that never
// arrives is named; the store keeps two rounds of keys at most.
#include <algorithm>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "checkpoint/agreement.h"
#include "dtrain/base/error.h"

namespace dtrain::checkpoint::checkpoint_agreement_test {
namespace {

using std::chrono::milliseconds;

// Runs fn(rank, agreement) on one thread per rank; the first exception is rethrown per rank into
// `errors` (empty string: none).
std::vector<std::string> runRanks(int world, const std::shared_ptr<store::Store>& store,
                                  const std::function<void(int, StoreAgreement&)>& fn) {
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      StoreAgreement agreement(store, "checkpoint/1", r, world);
      try {
        fn(r, agreement);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

TEST(CheckpointAgreement, EveryRankLearnsWhoReportedWhat) {
  auto store = std::make_shared<store::HashStore>();
  std::vector<std::vector<Report>> seen(4);
  auto errors = runRanks(4, store, [&](int rank, StoreAgreement& a) {
    seen[rank] = a.exchange(rank == 1 ? 7 : rank == 3 ? 2 : 0, milliseconds(5000), "a test");
    auto again = a.exchange(0, milliseconds(5000), "a second round");
    EXPECT_TRUE(again.empty()) << rank;
  });
  const std::vector<Report> want = {{1, 7}, {3, 2}};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(errors[r], "") << r;
    EXPECT_EQ(seen[r], want) << "rank " << r;
  }
}

// A node's writer that takes 1.5 s (a slow disk) arrives long after the others: they wait for it
// within the checkpoint's deadline, whatever a collective's timeout would have been.
TEST(CheckpointAgreement, ASlowRankIsWaitedForUpToTheDeadline) {
  auto store = std::make_shared<store::HashStore>();
  std::vector<int64_t> shared(3, -1);
  auto errors = runRanks(3, store, [&](int rank, StoreAgreement& a) {
    if (rank == 0) std::this_thread::sleep_for(milliseconds(1500));
    EXPECT_TRUE(a.exchange(0, milliseconds(10000), "the save").empty());
    if (rank == 2) std::this_thread::sleep_for(milliseconds(300));
    shared[rank] = a.share(2, rank == 2 ? 12345 : -7, milliseconds(10000), "the file's size");
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(errors[r], "") << r;
    EXPECT_EQ(shared[r], 12345) << r;
  }
}

TEST(CheckpointAgreement, ARankThatNeverArrivesIsNamedAtTheDeadline) {
  auto store = std::make_shared<store::HashStore>();
  auto start = std::chrono::steady_clock::now();
  auto errors = runRanks(3, store, [&](int rank, StoreAgreement& a) {
    if (rank == 1) return;  // never arrives
    a.exchange(0, milliseconds(400), "the checkpoint of step 9");
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  for (int r : {0, 2}) {
    EXPECT_NE(errors[r].find("timed out after 400 ms agreeing on the checkpoint of step 9"),
              std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find("rank(s) 1 did not report (2 of 3 did"), std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find("HINT"), std::string::npos) << errors[r];
  }
}

// Two rounds of keys at most, however many rounds run.
TEST(CheckpointAgreement, TheStoreKeepsTwoRoundsAtMost) {
  auto store = std::make_shared<store::HashStore>();
  std::vector<int64_t> keys;
  std::mutex mutex;
  auto errors = runRanks(4, store, [&](int rank, StoreAgreement& a) {
    for (int i = 0; i < 50; ++i) {
      a.exchange(rank == i % 4 ? 1 : 0, milliseconds(5000), "a round");
      a.share(i % 4, i, milliseconds(5000), "a value");
      std::lock_guard<std::mutex> lock(mutex);
      keys.push_back(store->numKeys());
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  // A round is 4 `in`, arrived, done, failed, one failed slot and one shared value: whatever
  // the interleaving, about two rounds' keys, never the 50 rounds' 450.
  EXPECT_LE(*std::max_element(keys.begin(), keys.end()), 20);
}

TEST(CheckpointAgreement, OneRankNeedsNoStoreRoundTrips) {
  auto store = std::make_shared<store::HashStore>();
  StoreAgreement a(store, "checkpoint/1", 0, 1);
  EXPECT_EQ(a.exchange(3, milliseconds(1), "x"), (std::vector<Report>{{0, 3}}));
  EXPECT_EQ(a.share(0, 9, milliseconds(1), "x"), 9);
  EXPECT_EQ(store->numKeys(), 0);
}

}  // namespace
}  // namespace dtrain::checkpoint::checkpoint_agreement_test
