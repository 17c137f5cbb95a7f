// The test seam of the collective faults (runtime/comm/collective_faults.h): a communicator takes
// the faults of the innermost ScopedCollectiveFaults of the thread that constructs it, other
// threads see none of them, and a communicator's subgroups inject none (faults count the world's
// collectives), whatever their thread holds.
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>
#include <vector>

#include "collective_faults.h"
#include "comm_support.h"

namespace dtrain::comm::collective_faults_test {
namespace {

using testing::faultAt;
using testing::runRanks;
using testing::WorldKind;

TEST(CollectiveFaults, TheInnermostScopeOfTheConstructingThreadCounts) {
  if (std::getenv("DTRAIN_FAULT") != nullptr) GTEST_SKIP() << "DTRAIN_FAULT is set";
  const ScopedCollectiveFaults outer({faultAt(fault::Kind::Hang, 1, 2)});
  EXPECT_NE(CollectiveFaults::forThisThread(1).at(fault::Kind::Hang, 2), nullptr);
  EXPECT_EQ(CollectiveFaults::forThisThread(1).at(fault::Kind::Hang, 1), nullptr);
  EXPECT_EQ(CollectiveFaults::forThisThread(0).at(fault::Kind::Hang, 2), nullptr) << "rank 1's";
  {
    const ScopedCollectiveFaults none({});
    EXPECT_TRUE(CollectiveFaults::forThisThread(1).empty());
  }
  EXPECT_NE(CollectiveFaults::forThisThread(1).at(fault::Kind::Hang, 2), nullptr);
  std::thread other([] { EXPECT_TRUE(CollectiveFaults::forThisThread(1).empty()); });
  other.join();
}

class SubgroupFaults : public ::testing::TestWithParam<WorldKind> {};

// Every rank's thread holds a fault that skips collective 0 on every rank: a subgroup that took it
// would skip its first allreduce and leave the buffer as it was.
TEST_P(SubgroupFaults, ASubgroupInjectsNoneOfTheFaultsItsThreadHolds) {
  const WorldKind kind = GetParam();
  if (kind.backend != "shm" && !glooAvailable()) GTEST_SKIP() << "built without Gloo";
  auto world = testing::makeWorld(kind);
  runRanks(kind.size, [&](int r) {
    const ScopedCollectiveFaults faults({faultAt(fault::Kind::SkipCollective, -1, 0)});
    auto group = world[r]->split(0);
    std::vector<int32_t> x(4, r + 1);
    group->allreduce(x.data(), x.size(), DataType::Int32, ReduceOp::Sum);
    EXPECT_EQ(x[0], kind.size * (kind.size + 1) / 2) << "rank " << r;
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, SubgroupFaults,
                         ::testing::Values(WorldKind{"gloo", 2}, WorldKind{"shm", 2},
                                           WorldKind{"hier", 4, 2}),
                         [](const auto& info) { return info.param.label(); });

}  // namespace
}  // namespace dtrain::comm::collective_faults_test
