// Failure behaviour of the Gloo communicator with ranks as threads (docs/reliability.md P1-P5):
// timeouts that name the silent rank, desync and shape reports, fast failure when a peer goes
// away, fail-fast afterwards. Real processes (SIGKILL, SIGSTOP) are in comm_processes_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "comm_support.h"
#include "dtrain/base/error.h"

namespace dtrain::comm::gloo_failure_test {
namespace {

using std::chrono::milliseconds;
using testing::elapsedMs;
using testing::expectQueuedCollectivesFailWithTheFirstError;
using testing::faultAt;
using testing::makeGlooWorld;
using testing::messageOf;
using testing::runRanks;

constexpr milliseconds kTimeout{1500};
constexpr double kGraceMs = 500;  // reportGrace(kTimeout)

std::vector<std::shared_ptr<Communicator>> world(int n, std::vector<fault::Fault> faults = {},
                                                 bool check = false) {
  return makeGlooWorld(
      n,
      [&](GlooOptions& o) {
        o.timeout = kTimeout;
        o.checkCollectives = check;
      },
      faults);
}

TEST(GlooFailure, TimeoutNamesTheSilentRankAndLaterCallsFailFast) {
  auto w = world(2);
  std::vector<float> x(16, 1.0f);
  auto start = std::chrono::steady_clock::now();
  std::string first;
  try {
    w[0]->allreduce(x.data(), x.size(), DataType::Float32, ReduceOp::Sum);
    ADD_FAILURE() << "allreduce without a peer returned";
  } catch (const TimeoutError& e) {
    first = e.what();
  }
  double ms = elapsedMs(start);
  EXPECT_GE(ms, kTimeout.count() - 50);
  EXPECT_LE(ms, kTimeout.count() + kGraceMs + 1000) << "P2: within T + 2 s";
  EXPECT_CONTAINS(first, "rank 0/2: seq 0 allreduce(float32 x 16, sum) failed");
  EXPECT_CONTAINS(first, "timed out after 1500 ms waiting for data from rank 1 (127.0.0.1)");
  EXPECT_CONTAINS(first, "rank 1 did not report within 500 ms");
  EXPECT_CONTAINS(first, "HINT");
  EXPECT_TRUE(w[0]->error() != nullptr);

  start = std::chrono::steady_clock::now();
  std::string again = messageOf([&] { w[0]->barrier(); });
  EXPECT_LT(elapsedMs(start), 100) << "a failed communicator fails fast";
  EXPECT_EQ(again, first) << "every later call rethrows the first error";

  // The silent rank finds its peer gone at once: rank 0 reset the connections.
  start = std::chrono::steady_clock::now();
  std::string peer = messageOf([&] { w[1]->barrier(); });
  EXPECT_LT(elapsedMs(start), 2000 + kGraceMs);
  EXPECT_CONTAINS(peer, "rank 1/2: seq 0 barrier() failed: connection");
  EXPECT_CONTAINS(peer, "by rank 0 (127.0.0.1:");
}

TEST(GlooFailure, QueuedCollectivesBehindAFailureFailWithTheFirstError) {
  auto w = world(2);
  expectQueuedCollectivesFailWithTheFirstError(*w[0]);
  w[1]->shutdown();
}

TEST(GlooFailure, SkippedCollectiveIsReportedAsDesync) {
  // P4: rank 1 skips seq 1. Sequence numbers still count the call, so rank 1's next collective
  // (seq 2) never matches rank 0's seq 1: both time out and compare notes.
  auto w = world(2, {faultAt(fault::Kind::SkipCollective, 1, 1)});
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
  EXPECT_CONTAINS(errors[0], "rank 0/2: seq 1 allreduce(float32 x 1000, sum) failed");
  EXPECT_CONTAINS(errors[0], "rank 1 is ahead at seq 2");
  EXPECT_CONTAINS(errors[1], "rank 1/2: seq 2 allreduce(float32 x 1000, sum) failed");
  EXPECT_CONTAINS(errors[1], "rank 0 is behind at seq 1");
  EXPECT_CONTAINS(errors[1], "seq 1 allreduce(float32 x 1000, sum) skipped");
  for (double ms : took) EXPECT_LE(ms, kTimeout.count() + 2000);
}

TEST(GlooFailure, WrongShapeTimesOutNamingBothShapes) {
  // P5 without the collective check: the counts differ, so the tags differ and no data mixes;
  // the report names both shapes.
  auto w = world(2, {faultAt(fault::Kind::WrongShape, 1, 0)});
  std::vector<std::string> errors(2);
  runRanks(2, [&](int r) {
    std::vector<float> x(32, 1.0f);
    CallOptions o;
    o.shape = {4, 8};
    errors[r] = messageOf(
        [&] { w[r]->allreduce(x.data(), 32, DataType::Float32, ReduceOp::Sum, o); });
  });
  EXPECT_CONTAINS(errors[0], "rank 1 calls allreduce(float32 [4, 7], sum) at seq 0 where this "
                             "rank calls allreduce(float32 [4, 8], sum)");
  EXPECT_CONTAINS(errors[1], "rank 0 calls allreduce(float32 [4, 8], sum) at seq 0 where this "
                             "rank calls allreduce(float32 [4, 7], sum)");
}

TEST(GlooFailure, CollectiveCheckCatchesAShapeMismatchAtOnce) {
  auto w = world(2, {faultAt(fault::Kind::WrongShape, 1, 1)}, /*check=*/true);
  std::vector<std::string> errors(2);
  std::vector<double> took(2);
  runRanks(2, [&](int r) {
    std::vector<float> x(32, 1.0f);
    CallOptions o;
    o.shape = {4, 8};
    auto start = std::chrono::steady_clock::now();
    errors[r] = messageOf([&] {
      w[r]->allreduce(x.data(), 32, DataType::Float32, ReduceOp::Sum, o);  // seq 0: fine
      EXPECT_EQ(x[0], 2.0f);
      w[r]->allreduce(x.data(), 32, DataType::Float32, ReduceOp::Sum, o);
    });
    took[r] = elapsedMs(start);
    EXPECT_THROW(std::rethrow_exception(w[r]->error()), InvalidArgument);
  });
  EXPECT_CONTAINS(errors[0], "collective check failed: this rank calls seq 1 allreduce(float32 "
                             "[4, 8], sum); rank 1 calls seq 1 allreduce(float32 [4, 7], sum)");
  EXPECT_CONTAINS(errors[1], "this rank calls seq 1 allreduce(float32 [4, 7], sum); rank 0 calls "
                             "seq 1 allreduce(float32 [4, 8], sum)");
  for (double ms : took) EXPECT_LT(ms, kTimeout.count() / 2) << "no timeout needed";
}

TEST(GlooFailure, ACheckedCallIsComparedWithTheCheckOffAndLabelsTellEqualCallsApart) {
  // T27: CallOptions::check compares this one call across ranks although the communicator's
  // check is off; two calls that differ only in their label fail at once naming both.
  auto w = world(2, {}, /*check=*/false);
  std::vector<std::string> errors(2);
  std::vector<double> took(2);
  runRanks(2, [&](int r) {
    std::vector<float> send(8, 1.0f), recv(16, 0.0f);
    CallOptions o;
    o.check = true;
    o.label = "unit 1 forward 1";
    w[r]->allgather(send.data(), recv.data(), send.size(), DataType::Float32, o);  // agreed
    EXPECT_EQ(recv[8 * (1 - r)], 1.0f);
    o.label = r == 0 ? "unit 2 forward 1" : "unit 3 forward 1";
    auto start = std::chrono::steady_clock::now();
    std::fill(recv.begin(), recv.end(), 0.0f);
    errors[r] = messageOf(
        [&] { w[r]->allgather(send.data(), recv.data(), send.size(), DataType::Float32, o); });
    took[r] = elapsedMs(start);
    EXPECT_EQ(recv[8 * (1 - r)], 0.0f) << "no data crossed";
    EXPECT_THROW(std::rethrow_exception(w[r]->error()), InvalidArgument);
  });
  EXPECT_CONTAINS(errors[0], "collective check failed: this rank calls seq 1 allgather(float32 "
                             "x 8) [unit 2 forward 1]; rank 1 calls seq 1 allgather(float32 x 8) "
                             "[unit 3 forward 1]");
  EXPECT_CONTAINS(errors[1], "rank 0 calls seq 1 allgather(float32 x 8) [unit 2 forward 1]");
  for (double ms : took) EXPECT_LT(ms, kTimeout.count() / 2) << "no timeout needed";
}

TEST(GlooFailure, CollectiveCheckCatchesASkippedCollectiveAtOnce) {
  // P4 with the collective check: rank 0 skips seq 0, so the ranks compare different calls and
  // both fail on the check, long before the timeout.
  auto w = world(2, {faultAt(fault::Kind::SkipCollective, 0, 0)}, /*check=*/true);
  std::vector<std::string> errors(2);
  std::vector<double> took(2);
  runRanks(2, [&](int r) {
    std::vector<int64_t> x(4, 1);
    auto start = std::chrono::steady_clock::now();
    errors[r] = messageOf([&] {
      w[r]->allreduce(x.data(), 4, DataType::Int64, ReduceOp::Sum);
      w[r]->broadcast(x.data(), 4, DataType::Int64, 0);
    });
    took[r] = elapsedMs(start);
  });
  EXPECT_CONTAINS(errors[0], "rank 0/2: collective check failed: this rank calls seq 1 broadcast("
                             "int64 x 4, root 0); rank 1 calls seq 0 allreduce(int64 x 4, sum)");
  EXPECT_CONTAINS(errors[1], "this rank calls seq 0 allreduce(int64 x 4, sum); rank 0 calls seq 1 "
                             "broadcast(int64 x 4, root 0)");
  for (int r = 0; r < 2; ++r) {
    EXPECT_LT(took[r], kTimeout.count() / 2) << "P4: rank " << r << " took " << took[r] << " ms";
  }
}

TEST(GlooFailure, APeerThatGoesAwayFailsTheOthersWithinTwoSeconds) {
  // P1 with threads: rank 2 closes its connections while ranks 0 and 1 wait for it in an
  // allreduce whose timeout is far away.
  auto w = makeGlooWorld(3, [](GlooOptions& o) { o.timeout = milliseconds(20000); });
  std::vector<std::string> errors(3);
  std::vector<double> took(3);
  auto start = std::chrono::steady_clock::now();
  runRanks(3, [&](int r) {
    if (r == 2) {
      std::this_thread::sleep_for(milliseconds(200));
      w[2]->shutdown();
      return;
    }
    std::vector<double> x(100000, 1.0);  // the ring path
    errors[r] = messageOf(
        [&] { w[r]->allreduce(x.data(), x.size(), DataType::Float64, ReduceOp::Sum); });
    took[r] = elapsedMs(start) - 200;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_LT(took[r], 2000) << "P1: rank " << r << " took " << took[r] << " ms";
    EXPECT_CONTAINS(errors[r], "failed: connection");
    EXPECT_CONTAINS(errors[r], "rank 2 (127.0.0.1:");
  }
}

TEST(GlooFailure, HangFaultLooksFrozenToThePeers) {
  auto w = world(2, {faultAt(fault::Kind::Hang, 1, 0)});
  std::string hung;
  std::thread frozen([&] { hung = messageOf([&] { w[1]->barrier(); }); });
  std::string error = messageOf([&] { w[0]->barrier(); });
  EXPECT_CONTAINS(error, "seq 0 barrier() failed: timed out");
  EXPECT_CONTAINS(error, "rank 1 did not report");
  w[1]->shutdown();  // releases the hang
  frozen.join();
  EXPECT_CONTAINS(hung, "hung (DTRAIN_FAULT hang@rank=1,step=0)");
}

}  // namespace
}  // namespace dtrain::comm::gloo_failure_test
