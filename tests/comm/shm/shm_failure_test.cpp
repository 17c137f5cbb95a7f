// Failure behaviour of the shared-memory communicator with ranks as threads (docs/reliability.md
// H1, H3-H5): a silent rank times out naming it and where it is; a rank that fails or shuts down
// makes its peers fail at once, quoting it; ranks that call different collectives, or skip one,
// fail at once on both sides; fail-fast afterwards. Dead processes are in
// tests/comm/comm_processes_test.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "comm_support.h"
#include "dtrain/base/error.h"

namespace dtrain::comm::shm_failure_test {
namespace {

using std::chrono::milliseconds;
using testing::elapsedMs;
using testing::expectQueuedCollectivesFailWithTheFirstError;
using testing::faultAt;
using testing::messageOf;
using testing::runRanks;
using testing::shmTestOptions;

constexpr milliseconds kTimeout{1500};

std::vector<std::shared_ptr<Communicator>> world(int n, std::vector<fault::Fault> faults = {},
                                                 milliseconds timeout = kTimeout) {
  auto store = std::make_shared<store::HashStore>();
  std::vector<std::shared_ptr<Communicator>> w(n);
  runRanks(n, [&](int r) {
    const ScopedCollectiveFaults injected(faults);
    w[r] = createShmCommunicator(shmTestOptions(r, n, store, timeout));
  });
  return w;
}

TEST(ShmFailure, TimeoutNamesTheSilentRankAndLaterCallsFailFast) {
  auto w = world(2);
  std::vector<float> x(1 << 16, 1.0f);
  auto start = std::chrono::steady_clock::now();
  std::string first;
  try {
    w[0]->allreduce(x.data(), x.size(), DataType::Float32, ReduceOp::Sum);
    ADD_FAILURE() << "allreduce without a peer returned";
  } catch (const TimeoutError& e) {
    first = e.what();
  }
  const double ms = elapsedMs(start);
  EXPECT_GE(ms, kTimeout.count() - 10);
  EXPECT_LE(ms, kTimeout.count() + 2000) << "P2: within T + 2 s";
  EXPECT_CONTAINS(first, "rank 0/2: seq 0 allreduce(float32 x 65536, sum) failed: timed out "
                         "waiting for rank 1 (pid ");
  EXPECT_CONTAINS(first, "rank 1 has not started a collective yet; the process is alive");
  EXPECT_CONTAINS(first, "HINT: the collective timeout is 1500 ms");

  start = std::chrono::steady_clock::now();
  EXPECT_EQ(messageOf([&] { w[0]->barrier(); }), first) << "every later call rethrows it";
  EXPECT_LT(elapsedMs(start), 100);

  // The silent rank, arriving late, finds out at once: rank 0 marked itself failed in the segment.
  start = std::chrono::steady_clock::now();
  const std::string peer = messageOf(
      [&] { w[1]->allreduce(x.data(), x.size(), DataType::Float32, ReduceOp::Sum); });
  EXPECT_LT(elapsedMs(start), 500);
  EXPECT_CONTAINS(peer, "rank 1/2: seq 0 allreduce(float32 x 65536, sum) failed: rank 0 (pid ");
  EXPECT_CONTAINS(peer,
                  "failed: rank 0/2: seq 0 allreduce(float32 x 65536, sum) failed: timed out");
}

TEST(ShmFailure, QueuedCollectivesBehindAFailureFailWithTheFirstError) {
  auto w = world(2);
  expectQueuedCollectivesFailWithTheFirstError(*w[0]);
}

TEST(ShmFailure, DifferentCollectivesFailAtOnceOnBothSidesNamingBoth) {
  // H4: the descriptors every rank posts are compared before any data moves.
  auto w = world(2, {faultAt(fault::Kind::WrongShape, 1, 1)}, milliseconds(20000));
  std::vector<std::string> errors(2);
  std::vector<double> took(2);
  runRanks(2, [&](int r) {
    std::vector<float> x(4096, 1.0f);
    CallOptions o;
    o.shape = {64, 64};
    auto start = std::chrono::steady_clock::now();
    errors[r] = messageOf([&] {
      w[r]->allreduce(x.data(), x.size(), DataType::Float32, ReduceOp::Sum, o);
      EXPECT_EQ(x[0], 2.0f);
      w[r]->allreduce(x.data(), x.size(), DataType::Float32, ReduceOp::Sum, o);
    });
    took[r] = elapsedMs(start);
    EXPECT_THROW(std::rethrow_exception(w[r]->error()), InvalidArgument);
  });
  EXPECT_CONTAINS(errors[0], "collective check failed: this rank calls seq 1 allreduce(float32 "
                             "[64, 64], sum); rank 1 calls seq 1 allreduce(float32 [64, 63], sum)");
  EXPECT_CONTAINS(errors[1], "this rank calls seq 1 allreduce(float32 [64, 63], sum); rank 0 "
                             "calls seq 1 allreduce(float32 [64, 64], sum)");
  for (double ms : took) EXPECT_LT(ms, 1000) << "no timeout needed";
}

TEST(ShmFailure, CallsThatDifferOnlyInTheirLabelFailAtOnceNamingBothLabels) {
  // T27: ZeRO-3's gathers of two units of one size differ only in the caller's label.
  auto w = world(2, {}, milliseconds(20000));
  std::vector<std::string> errors(2);
  std::vector<double> took(2);
  runRanks(2, [&](int r) {
    std::vector<float> send(8, 1.0f), recv(16, 0.0f);
    CallOptions o;
    o.label = r == 0 ? "unit 3 forward 2" : "unit 4 forward 2";
    auto start = std::chrono::steady_clock::now();
    errors[r] = messageOf(
        [&] { w[r]->allgather(send.data(), recv.data(), send.size(), DataType::Float32, o); });
    took[r] = elapsedMs(start);
    EXPECT_EQ(recv[8 * (1 - r)], 0.0f) << "no data crossed";
  });
  EXPECT_CONTAINS(errors[0], "collective check failed: this rank calls seq 0 allgather(float32 "
                             "x 8) [unit 3 forward 2]; rank 1 calls seq 0 allgather(float32 x 8) "
                             "[unit 4 forward 2]");
  EXPECT_CONTAINS(errors[1], "this rank calls seq 0 allgather(float32 x 8) [unit 4 forward 2]; "
                             "rank 0 calls seq 0 allgather(float32 x 8) [unit 3 forward 2]");
  for (double ms : took) EXPECT_LT(ms, 1000) << "no timeout needed";
}

TEST(ShmFailure, SkippedCollectiveFailsAtOnceSayingWhoIsAheadAndBehind) {
  // H4: rank 1 skips seq 1; its seq 2 meets rank 0's seq 1.
  auto w = world(2, {faultAt(fault::Kind::SkipCollective, 1, 1)}, milliseconds(20000));
  std::vector<std::string> errors(2);
  std::vector<double> took(2);
  runRanks(2, [&](int r) {
    std::vector<float> x(1000, 1.0f);
    auto start = std::chrono::steady_clock::now();
    errors[r] = messageOf([&] {
      for (int i = 0; i < 3; ++i)
        w[r]->allreduce(x.data(), x.size(), DataType::Float32, ReduceOp::Sum);
    });
    took[r] = elapsedMs(start);
  });
  EXPECT_CONTAINS(errors[0],
                  "rank 0/2: seq 1 allreduce(float32 x 1000, sum) failed: rank 1 is "
                  "ahead at seq 2 (allreduce(float32 x 1000, sum); this rank is at seq 1)");
  EXPECT_CONTAINS(errors[1], "rank 1/2: seq 2 allreduce(float32 x 1000, sum) failed: rank 0 is "
                             "behind at seq 1");
  for (double ms : took) EXPECT_LT(ms, 1000) << "no timeout needed";
}

TEST(ShmFailure, AHungRankTimesOutItsPeersNamingWhereItIs) {
  // H1 (frozen): rank 1 hangs inside seq 1 (DTRAIN_FAULT hang); rank 0 waits for it until the
  // collective timeout and says it is inside that collective.
  auto w = world(2, {faultAt(fault::Kind::Hang, 1, 1)});
  std::string error;
  double took = 0;
  runRanks(2, [&](int r) {
    std::vector<double> x(100000, 1.0);
    if (r == 1) {
      w[1]->allreduce(x.data(), x.size(), DataType::Float64, ReduceOp::Sum);
      auto hung = w[1]->allreduceAsync(x.data(), x.size(), DataType::Float64, ReduceOp::Sum);
      std::this_thread::sleep_for(kTimeout + milliseconds(1000));
      w[1]->shutdown();  // releases the injected hang
      EXPECT_THROW(hung->wait(), Error);
      return;
    }
    w[0]->allreduce(x.data(), x.size(), DataType::Float64, ReduceOp::Sum);
    auto start = std::chrono::steady_clock::now();
    error = messageOf(
        [&] { w[0]->allreduce(x.data(), x.size(), DataType::Float64, ReduceOp::Sum); });
    took = elapsedMs(start);
  });
  EXPECT_GE(took, kTimeout.count() - 10);
  EXPECT_LE(took, kTimeout.count() + 2000);
  EXPECT_CONTAINS(error, "timed out waiting for rank 1 (pid ");
  EXPECT_CONTAINS(error, "rank 1 is outside any collective, its last was seq 0")
      << "the hang is injected before the collective starts, as a rank stuck in user code";
}

TEST(ShmFailure, APeerThatShutsDownFailsTheWaitingOnesAtOnce) {
  // H3: rank 2 leaves (shutdown) while ranks 0 and 1 wait for it, far from their deadline.
  auto w = world(3, {}, milliseconds(20000));
  std::vector<std::string> errors(3);
  std::vector<double> took(3);
  auto start = std::chrono::steady_clock::now();
  runRanks(3, [&](int r) {
    if (r == 2) {
      std::this_thread::sleep_for(milliseconds(200));
      w[2]->shutdown();
      return;
    }
    std::vector<double> x(100000, 1.0);
    errors[r] = messageOf(
        [&] { w[r]->allreduce(x.data(), x.size(), DataType::Float64, ReduceOp::Sum); });
    took[r] = elapsedMs(start) - 200;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_LT(took[r], 500) << "rank " << r;
    EXPECT_CONTAINS(errors[r], "rank 2 (pid ");
    EXPECT_CONTAINS(errors[r], "shut down its communicator");
  }
}

TEST(ShmFailure, APeerThatFinishedAndShutDownDoesNotFailASlowerOne) {
  // The other side of H3: a rank may leave as soon as its own part is done.
  auto w = world(2, {}, milliseconds(5000));
  for (int i = 0; i < 50; ++i) {
    runRanks(2, [&](int r) {
      std::vector<float> x(300000, 1.0f);
      if (r == 1) std::this_thread::sleep_for(milliseconds(i % 3));
      w[r]->allreduce(x.data(), x.size(), DataType::Float32, ReduceOp::Sum);
      EXPECT_EQ(x[299999], 2.0f);
    });
  }
  runRanks(2, [&](int r) {
    std::vector<float> x(300000, 1.0f);
    w[r]->allreduce(x.data(), x.size(), DataType::Float32, ReduceOp::Sum);
    w[r]->shutdown();
  });
}

}  // namespace
}  // namespace dtrain::comm::shm_failure_test
