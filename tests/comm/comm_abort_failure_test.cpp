// Communicator::abort() from another thread, on every CPU backend with ranks as threads
// (docs/reliability.md P20-P23, P26): what a watcher thread does when a node of the job is lost.
// A rank blocked in a collective that can never finish leaves it at once with MembershipChanged
// (bound 1 s; designed for ~100 ms); every later call fails fast with it; shutdown() returns.
// Also an abort before any collective, of an idle communicator, in the middle of a 64 MiB
// transfer, and of the subgroups made from a world (abortWithGroups).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "comm_support.h"
#include "dtrain/base/error.h"

namespace dtrain::comm::comm_abort_failure_test {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using testing::elapsedMs;
using testing::makeWorld;
using testing::messageOf;
using testing::runRanks;
using testing::WorldKind;

// Far beyond the bounds below: a wait that abort() did not release fails them.
constexpr milliseconds kTimeout{10000};
constexpr double kBoundMs = 1000;
constexpr double kMarginMs = 1000;  // for a loaded 2-core machine
const char* const kReason = "node 7 (10.0.0.7) lost";

std::string label(const ::testing::TestParamInfo<WorldKind>& info) { return info.param.label(); }

// What fn() throws: MembershipChanged's message, or a test failure naming what came instead.
std::string membershipChangedFrom(const std::function<void()>& fn, int rank) {
  try {
    fn();
  } catch (const MembershipChanged& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "rank " << rank << ": not MembershipChanged: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "rank " << rank << ": returned instead of throwing MembershipChanged";
  return "";
}

// After abort(): error() is abort()'s MembershipChanged, every call rethrows it at once, and
// shutdown() returns.
void expectAbortedForGood(Communicator& c, int rank) {
  ASSERT_NE(c.error(), nullptr) << "rank " << rank;
  const std::string error = membershipChangedFrom([&] { std::rethrow_exception(c.error()); }, rank);
  EXPECT_CONTAINS(error, fmt::format("membership changed: {}", kReason));
  EXPECT_CONTAINS(error, c.describe());
  for (int call = 0; call < 2; ++call) {
    const auto start = Clock::now();
    std::vector<float> x(16, 1.0f);
    const std::string later = membershipChangedFrom(
        [&] {
          if (call == 0) c.allreduce(x.data(), x.size(), DataType::Float32, ReduceOp::Sum);
          if (call == 1) c.barrier();
        },
        rank);
    EXPECT_EQ(later, error) << "rank " << rank << ": a later call rethrows abort()'s error";
    EXPECT_LT(elapsedMs(start), 100) << "rank " << rank << ": fails fast";
  }
  const auto start = Clock::now();
  c.shutdown();
  EXPECT_LT(elapsedMs(start), 2000) << "rank " << rank << ": shutdown() after abort()";
}

// P20-P22: every rank but the last is blocked in a collective the last never joins (a lost node);
// another thread aborts every rank 300 ms later. `barrier`: Gloo's own algorithm (else our
// direct allreduce), whose wait Gloo's pairs must release (Note [Interrupting Gloo]).
// The collective the abort tests block in: a barrier, or an allreduce of `x`.
void barrierOrAllreduce(Communicator& c, bool barrier, std::vector<float>& x) {
  if (barrier) {
    c.barrier();
  } else {
    c.allreduce(x.data(), x.size(), DataType::Float32, ReduceOp::Sum);
  }
}

void expectBlockedCollectivesThrowMembershipChanged(const WorldKind& kind, bool barrier) {
  auto world = makeWorld(kind, kTimeout);
  const int n = static_cast<int>(world.size());
  const auto start = Clock::now();
  double abortedAtMs = 0;
  std::thread watcher([&] {
    std::this_thread::sleep_for(milliseconds(300));
    abortedAtMs = elapsedMs(start);
    for (auto& c : world) c->abort(kReason);
  });
  std::vector<std::string> errors(static_cast<size_t>(n - 1));
  std::vector<double> tookMs(static_cast<size_t>(n - 1));
  runRanks(n - 1, [&](int r) {
    std::vector<float> x(1024, 1.0f);
    errors[r] = membershipChangedFrom([&] { barrierOrAllreduce(*world[r], barrier, x); }, r);
    tookMs[r] = elapsedMs(start);
  });
  watcher.join();
  for (int r = 0; r < n - 1; ++r) {
    EXPECT_GE(tookMs[r], abortedAtMs - 1) << "rank " << r << " returned before the abort";
    EXPECT_LE(tookMs[r] - abortedAtMs, kBoundMs) << "rank " << r << ": bound of the abort";
    EXPECT_CONTAINS(errors[r], fmt::format("membership changed: {}", kReason));
    EXPECT_CONTAINS(errors[r], fmt::format("rank {}/{}", r, n));
  }
  for (int r = 0; r < n; ++r) expectAbortedForGood(*world[r], r);
}

class Abort : public ::testing::TestWithParam<WorldKind> {};

TEST_P(Abort, BlockedAllreduceThrowsMembershipChangedAtOnce) {
  expectBlockedCollectivesThrowMembershipChanged(GetParam(), /*barrier=*/false);
}

TEST_P(Abort, BlockedBarrierThrowsMembershipChangedAtOnce) {
  expectBlockedCollectivesThrowMembershipChanged(GetParam(), /*barrier=*/true);
}

// P21: on one node the ranks share a segment, so abort() on one rank alone -- the watcher of that
// process -- fails the node's other ranks blocked in the collective with MembershipChanged too,
// quoting its reason: they re-form together. Rank 3 never joins; only rank 1 is aborted.
TEST(ShmAbort, OneRanksAbortFailsTheNodesOtherBlockedRanksAtOnce) {
  auto world = makeWorld(WorldKind{"shm", 4}, kTimeout);
  constexpr int kAborted = 1;
  const auto start = Clock::now();
  double abortedAtMs = 0;
  std::thread watcher([&] {
    std::this_thread::sleep_for(milliseconds(300));
    abortedAtMs = elapsedMs(start);
    world[kAborted]->abort(kReason);
  });
  std::vector<std::string> errors(3);
  std::vector<double> tookMs(3);
  runRanks(3, [&](int r) {
    std::vector<float> x(1024, 1.0f);
    errors[r] = membershipChangedFrom(
        [&] { world[r]->allreduce(x.data(), x.size(), DataType::Float32, ReduceOp::Sum); }, r);
    tookMs[r] = elapsedMs(start);
  });
  watcher.join();
  for (int r = 0; r < 3; ++r) {
    EXPECT_GE(tookMs[r], abortedAtMs - 1) << "rank " << r << " returned before the abort";
    EXPECT_LE(tookMs[r] - abortedAtMs, kBoundMs + kMarginMs)
        << "rank " << r << ": bound of the abort, " << tookMs[r] - abortedAtMs << " ms";
    EXPECT_CONTAINS(errors[r], fmt::format("rank {}/4", r));
    EXPECT_CONTAINS(errors[r], fmt::format("membership changed: {}", kReason));
    if (r != kAborted) {
      // Rank 1 itself, not a peer that failed because of it (Note [A failure is final for the
      // segment] in runtime/comm/shm/shm_engine.cpp).
      EXPECT_CONTAINS(errors[r], fmt::format("failed: rank {} (pid", kAborted));
    }
  }
  expectAbortedForGood(*world[kAborted], kAborted);
  for (auto& c : world) c->shutdown();
}

// P21: a rank that enters a collective after one rank of its node was aborted fails at once with
// MembershipChanged too, quoting the aborted rank, before the collective check and before any data
// moves. Rank 3 had not joined the allreduce ranks 0-2 threw out of: a barrier must not fail as a
// mismatch against the allreduce its peers posted, and that allreduce must not complete from the
// inputs they left behind (Note [A failure is final for the segment] in
// runtime/comm/shm/shm_engine.cpp).
TEST(ShmAbort, ARankEnteringAfterTheAbortFailsWithMembershipChangedToo) {
  constexpr int kAborted = 1;
  constexpr int kLate = 3;
  for (const bool barrier : {true, false}) {
    SCOPED_TRACE(barrier ? "late barrier" : "late allreduce");
    auto world = makeWorld(WorldKind{"shm", 4}, kTimeout);
    std::thread watcher([&] {
      std::this_thread::sleep_for(milliseconds(100));
      world[kAborted]->abort(kReason);
    });
    runRanks(kLate, [&](int r) {  // ranks 0-2, blocked until rank 1's abort
      std::vector<float> x(1024, 1.0f);
      membershipChangedFrom(
          [&] { world[r]->allreduce(x.data(), x.size(), DataType::Float32, ReduceOp::Sum); }, r);
    });
    watcher.join();
    std::vector<float> x(1024, 1.0f);
    const auto start = Clock::now();
    const std::string error = membershipChangedFrom(
        [&] { barrierOrAllreduce(*world[kLate], barrier, x); }, kLate);
    EXPECT_LT(elapsedMs(start), kBoundMs) << "at once, not at the timeout";
    EXPECT_CONTAINS(error, fmt::format("rank {}/4", kLate));
    EXPECT_CONTAINS(error, fmt::format("failed: rank {} (pid", kAborted));
    EXPECT_CONTAINS(error, fmt::format("membership changed: {}", kReason));
    EXPECT_EQ(x, std::vector<float>(1024, 1.0f)) << "the late rank's buffer is untouched";
    for (auto& c : world) c->shutdown();
  }
}

// P20-P22: abort() before any collective; a second abort() keeps the first reason.
TEST_P(Abort, BeforeAnyCollective) {
  auto world = makeWorld(GetParam(), kTimeout);
  for (auto& c : world) c->abort(kReason);
  for (auto& c : world) c->abort("a second reason");
  for (size_t r = 0; r < world.size(); ++r) {
    EXPECT_EQ(messageOf([&] { std::rethrow_exception(world[r]->error()); }).find("second"),
              std::string::npos)
        << "the first reason stays";
    expectAbortedForGood(*world[r], static_cast<int>(r));
  }
}

// P20-P22: an idle communicator that has run collectives is aborted, then shut down; abort() after
// shutdown() changes nothing and never hangs.
TEST_P(Abort, IdleThenShutdown) {
  auto world = makeWorld(GetParam(), kTimeout);
  runRanks(static_cast<int>(world.size()), [&](int r) {
    std::vector<float> x(4096, 1.0f);
    world[r]->allreduce(x.data(), x.size(), DataType::Float32, ReduceOp::Sum);
    world[r]->barrier();
  });
  for (auto& c : world) c->abort(kReason);
  for (auto& c : world) {
    const auto start = Clock::now();
    c->shutdown();
    c->abort("after shutdown");
    EXPECT_LT(elapsedMs(start), 2000);
    EXPECT_CONTAINS(messageOf([&] { std::rethrow_exception(c->error()); }), kReason);
  }
}

// P26: the membership watcher aborts the world with abortWithGroups(), which takes the groups
// made from it too: a rank blocked in a subgroup's collective with the lost rank leaves it, at
// every depth (g1 of the world, g2 split from g1). Rank 3 never joins; ranks 0 and 2 wait in g1
// (all four ranks), rank 1 in its g2 pair with rank 3. A group the program let go is not kept.
TEST_P(Abort, AbortWithGroupsReleasesTheGroupsMadeFromIt) {
  auto world = makeWorld(GetParam(), kTimeout);
  const int n = static_cast<int>(world.size());
  std::vector<std::shared_ptr<Communicator>> g1(n), g2(n);
  std::vector<std::weak_ptr<Communicator>> dropped(n);
  runRanks(n, [&](int r) {
    g1[r] = world[r]->newGroup({0, 1, 2, 3});
    g2[r] = g1[r]->split(r % 2);
    dropped[r] = world[r]->newGroup({0, 1});
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(dropped[r].expired()) << "rank " << r << ": the world keeps no group alive";
    EXPECT_EQ(world[r]->errorWithGroups(), nullptr) << "rank " << r << ": healthy";
  }
  // abort() alone leaves the groups working (the world's own communicator only).
  world[0]->abort(kReason);
  EXPECT_EQ(g1[0]->error(), nullptr);
  EXPECT_NE(world[0]->errorWithGroups(), nullptr);
  const auto start = Clock::now();
  double abortedAtMs = 0;
  std::thread watcher([&] {
    std::this_thread::sleep_for(milliseconds(300));
    abortedAtMs = elapsedMs(start);
    for (auto& c : world) c->abortWithGroups(kReason);
  });
  std::vector<std::string> errors(static_cast<size_t>(n - 1));
  std::vector<double> tookMs(static_cast<size_t>(n - 1));
  runRanks(n - 1, [&](int r) {
    std::vector<float> x(1024, 1.0f);
    Communicator& blockedIn = r == 1 ? *g2[r] : *g1[r];
    errors[r] = membershipChangedFrom(
        [&] { blockedIn.allreduce(x.data(), x.size(), DataType::Float32, ReduceOp::Sum); }, r);
    tookMs[r] = elapsedMs(start);
  });
  watcher.join();
  for (int r = 0; r < n - 1; ++r) {
    EXPECT_GE(tookMs[r], abortedAtMs - 1) << "rank " << r << " returned before the abort";
    EXPECT_LE(tookMs[r] - abortedAtMs, kBoundMs) << "rank " << r << ": bound of the abort";
    EXPECT_CONTAINS(errors[r], kReason);  // its own abort's, or (shm) a node peer's quoting it
  }
  for (int r = 0; r < n; ++r) {
    for (const auto& c : {world[r], g1[r], g2[r]}) {
      const std::string error = messageOf([&] { std::rethrow_exception(c->error()); });
      EXPECT_CONTAINS(error, fmt::format("membership changed: {}", kReason)) << c->describe();
      const bool says = error.find("this is a subgroup (split/newGroup), which is not re-formed: "
                                   "make it again") != std::string::npos;
      EXPECT_EQ(says, c != world[r]) << "rank " << r << ": " << c->describe() << ": " << error;
    }
    EXPECT_NE(world[r]->errorWithGroups(), nullptr);
  }
  for (int r = 0; r < n; ++r) {
    g2[r]->shutdown();
    g1[r]->shutdown();
    world[r]->shutdown();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Abort,
                         ::testing::Values(WorldKind{"gloo", 4}, WorldKind{"shm", 4},
                                           WorldKind{"hier", 4, 2}),
                         label);

class AbortLarge : public ::testing::TestWithParam<WorldKind> {};

// P20-P22: every rank is in a 64 MiB allreduce, data moving, when the watcher aborts them all.
TEST_P(AbortLarge, InTheMiddleOfATransfer) {
  auto world = makeWorld(GetParam(), kTimeout);
  const int n = static_cast<int>(world.size());
  constexpr size_t kCount = (64u << 20) / sizeof(float);
  std::vector<std::vector<float>> data(static_cast<size_t>(n));
  runRanks(n, [&](int r) { data[r].assign(kCount, 1.0f); });  // pages touched before the clock
  const auto start = Clock::now();
  double abortedAtMs = 0;
  std::thread watcher([&] {
    std::this_thread::sleep_for(milliseconds(30));
    abortedAtMs = elapsedMs(start);
    for (auto& c : world) c->abort(kReason);
  });
  std::vector<double> tookMs(static_cast<size_t>(n));
  runRanks(n, [&](int r) {
    // Back to back until aborted, so that the abort finds data moving whatever the backend's
    // speed (shared memory moves 64 MiB in well under the 30 ms).
    const std::string error = membershipChangedFrom(
        [&] {
          for (int i = 0; i < 1000; ++i) {
            world[r]->allreduce(data[r].data(), kCount, DataType::Float32, ReduceOp::Max);
          }
        },
        r);
    EXPECT_CONTAINS(error, kReason);
    tookMs[r] = elapsedMs(start);
  });
  watcher.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_LE(tookMs[r] - abortedAtMs, kBoundMs) << "rank " << r << ": bound of the abort";
  }
  for (int r = 0; r < n; ++r) expectAbortedForGood(*world[r], r);
}

// Gloo across four ranks runs Gloo's own ring for a large allreduce, whose transfer in flight
// abort() cannot cut short (Note [Interrupting Gloo]): the transfer test runs Gloo at two ranks,
// our direct exchange, as the hierarchical backend's groups across nodes do.
INSTANTIATE_TEST_SUITE_P(Backends, AbortLarge,
                         ::testing::Values(WorldKind{"gloo", 2}, WorldKind{"shm", 4},
                                           WorldKind{"hier", 4, 2}),
                         label);

// P23: the blocked case for the thread-backed fake that the torch tests use.
TEST(AbortThreadWorld, BlockedCollectiveThrowsMembershipChanged) {
  auto world = testing::ThreadWorld::create(2, {kTimeout});
  auto c = world->communicator(0);
  std::thread watcher([&] {
    std::this_thread::sleep_for(milliseconds(100));
    c->abort(kReason);
  });
  const auto start = Clock::now();
  std::vector<float> x(8, 1.0f);
  const std::string error = membershipChangedFrom(
      [&] { c->allreduce(x.data(), x.size(), DataType::Float32, ReduceOp::Sum); }, 0);
  watcher.join();
  EXPECT_LT(elapsedMs(start), 100 + kBoundMs);
  EXPECT_CONTAINS(error, fmt::format("membership changed: {}", kReason));
  EXPECT_CONTAINS(messageOf([&] { c->barrier(); }), kReason);
  c->shutdown();
}

}  // namespace
}  // namespace dtrain::comm::comm_abort_failure_test
