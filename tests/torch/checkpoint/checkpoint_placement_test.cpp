// The Checkpointer's placement alone (runtime/torch/checkpoint/placement.h), four ranks as
// threads on two simulated nodes: which node each rank is on and which rank writes each node's
// directory, a node without a writer refused on every rank, the deadline the ranks wait, and a
// failure on some ranks named on every rank -- through the job's store and through the
// collectives.
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../../../runtime/torch/checkpoint/placement.h"
#include "../ddp/ddp_support.h"
#include "checkpoint_support.h"
#include "dtrain/base/error.h"
#include "test_support.h"

namespace dtrain::testing::checkpoint_placement_test {
namespace {

TEST(CheckpointPlacement, FourRanksOnTwoNodesHaveOneWriterPerNode) {
  TempDir tmp;
  TwoNodes job(tmp.path());  // rank r: node r / 2, local rank r % 2
  std::vector<std::vector<int>> nodeOf(4);
  std::vector<std::map<int, int>> writerOf(4);
  std::vector<int> writer(4, -1);
  job.world->run([&](int rank) {
    checkpoint::Placement p(threadGroup(*job.world, rank), job.options(rank));
    EXPECT_EQ(p.rank, rank);
    EXPECT_EQ(p.world, 4);
    EXPECT_EQ(p.nodeId, rank / 2);
    EXPECT_EQ(p.localRank, rank % 2);
    EXPECT_TRUE(p.nodeOf.empty());  // known once placed: place() is collective
    p.place();
    nodeOf[rank] = p.nodeOf;
    writerOf[rank] = p.writerOf;
    writer[rank] = p.writer ? 1 : 0;
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(nodeOf[r], (std::vector<int>{0, 0, 1, 1})) << "rank " << r;
    EXPECT_EQ(writerOf[r], (std::map<int, int>{{0, 0}, {1, 2}})) << "rank " << r;
  }
  EXPECT_EQ(writer, (std::vector<int>{1, 0, 1, 0}));
}

TEST(CheckpointPlacement, ANodeWithoutLocalRankZeroIsRefusedOnEveryRank) {
  TempDir tmp;
  TwoNodes job(tmp.path());
  std::vector<std::string> errors(4);
  job.world->run([&](int rank) {
    CheckpointOptions o = job.options(rank);
    if (rank >= 2) o.localRank = rank - 1;  // node 1's ranks say local ranks 1 and 2
    checkpoint::Placement p(threadGroup(*job.world, rank), o);
    try {
      p.place();
    } catch (const InvalidArgument& e) {
      errors[rank] = e.what();
    }
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(errors[r].find("node 1 (rank 2) has no local rank 0"), std::string::npos)
        << "rank " << r << ": " << errors[r];
  }
}

TEST(CheckpointPlacement, TheDeadlineIsTheTimeoutAndAGraceOfHalfItWithinOneToSixtySeconds) {
  auto deadlineFor = [](std::chrono::milliseconds timeout) {
    CheckpointOptions o = optionsFor("unused");
    o.timeout = timeout;
    return checkpoint::Placement(soloGroup(), o).deadline();
  };
  EXPECT_EQ(deadlineFor(std::chrono::milliseconds(400)), std::chrono::milliseconds(1400));
  EXPECT_EQ(deadlineFor(std::chrono::seconds(4)), std::chrono::seconds(6));
  EXPECT_EQ(deadlineFor(std::chrono::minutes(10)), std::chrono::minutes(11));
}

// Ranks 1 and 3 fail: each names its own error and the other's rank and node; the ranks that did
// not fail name both.
void expectFailuresNamedEverywhere(bool throughStore) {
  TempDir tmp;
  TwoNodes job(tmp.path());
  std::vector<std::string> errors(4);
  job.world->run([&](int rank) {
    CheckpointOptions o = job.options(rank);
    if (!throughStore) o.store = nullptr;  // the thread group has none: its collectives
    checkpoint::Placement p(threadGroup(*job.world, rank), o);
    p.place();
    try {
      p.agree(rank % 2 ? "disk " + std::to_string(rank) + " full" : "", "saving step 7");
    } catch (const CheckpointError& e) {
      errors[rank] = e.what();
    }
  });
  for (int r : {0, 2}) {
    EXPECT_NE(errors[r].find(std::to_string(r) + "/4: saving step 7 failed on rank 1 (node 0) "
                                                 "and rank 3 (node 1); see the error there"),
              std::string::npos)
        << errors[r];
  }
  EXPECT_NE(errors[1].find("rank 1/4: saving step 7 failed: disk 1 full (it failed on rank 3 "
                           "(node 1) too)"),
            std::string::npos)
      << errors[1];
  EXPECT_NE(errors[3].find("rank 3/4: saving step 7 failed: disk 3 full (it failed on rank 1 "
                           "(node 0) too)"),
            std::string::npos)
      << errors[3];
}

TEST(CheckpointPlacement, AFailureOnSomeRanksIsNamedOnEveryRankThroughTheStore) {
  expectFailuresNamedEverywhere(/*throughStore=*/true);
}

TEST(CheckpointPlacement, AFailureOnSomeRanksIsNamedOnEveryRankThroughTheCollectives) {
  expectFailuresNamedEverywhere(/*throughStore=*/false);
}

}  // namespace
}  // namespace dtrain::testing::checkpoint_placement_test
