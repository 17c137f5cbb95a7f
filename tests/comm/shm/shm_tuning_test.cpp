// One tuning per segment (Note [One tuning per segment] in runtime/comm/shm/shm_segment.cpp,
// docs/reliability.md H7): ranks given different ShmOptions would pick different paths for one
// collective and wait for each other until the timeout; instead every rank refuses at creation,
// naming the option, both values and both ranks -- within a node through the segment's header,
// across nodes through the cross-node group.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>

#include "comm_support.h"
#include "dtrain/base/error.h"
#include "shm_segment.h"

namespace dtrain::comm::shm_tuning_test {
namespace {

using testing::elapsedMs;
using testing::runRanks;
using testing::shmTestOptions;

TEST(ShmTuning, TheFirstDifferenceIsNamedWithBothValuesAndRanks) {
  shm::Tuning a{4096, 2 << 20, 65536, 8 << 20};
  EXPECT_EQ(shm::tuningMismatch(a, 0, a, 3), "");
  struct Case {
    uint64_t shm::Tuning::*member;
    const char* expected;
  };
  for (const Case& c : {Case{&shm::Tuning::slotBytes, "ShmOptions::slotBytes is 4096 on rank 0 "
                                                      "and 4097 on rank 3"},
                        Case{&shm::Tuning::arenaBytes, "ShmOptions::arenaBytes is 2097152 on "
                                                       "rank 0 and 2097153 on rank 3"},
                        Case{&shm::Tuning::smallBytes, "ShmOptions::smallBytes is 65536 on rank "
                                                       "0 and 65537 on rank 3"},
                        Case{&shm::Tuning::ownedChunkBytes, "ShmOptions::ownedChunkBytes is "
                                                            "8388608 on rank 0 and 8388609 on "
                                                            "rank 3"}}) {
    shm::Tuning b = a;
    b.*c.member += 1;
    EXPECT_EQ(shm::tuningMismatch(a, 0, b, 3), c.expected);
  }
}

// Creates a communicator on every rank, `tweak` changing some ranks' options; returns each rank's
// error ("" when it was created) and the slowest rank's time.
std::vector<std::string> createAll(int size, int nodes,
                                   const std::function<void(int, ShmOptions&)>& tweak,
                                   double* slowestMs) {
  auto store = std::make_shared<store::HashStore>();
  std::vector<std::string> errors(static_cast<size_t>(size));
  std::vector<double> took(static_cast<size_t>(size));
  runRanks(size, [&](int r) {
    const auto start = std::chrono::steady_clock::now();
    ShmOptions o = shmTestOptions(r, size, store);
    tweak(r, o);
    try {
      if (nodes == 1) {
        createShmCommunicator(o);
      } else {
        HierarchicalOptions h;
        h.rank = r;
        h.size = size;
        h.store = store;
        for (int k = 0; k < size; ++k) {
          h.nodes.nodeOf.push_back("node" + std::to_string(k / (size / nodes)));
        }
        h.timeout = o.timeout;
        h.connectTimeout = o.connectTimeout;
        h.shm = o;
        createHierarchicalCommunicator(h);
      }
    } catch (const InvalidArgument& e) {
      errors[r] = e.what();
    } catch (const std::exception& e) {  // a peer that refused left the group
      errors[r] = std::string("not InvalidArgument: ") + e.what();
    }
    took[r] = elapsedMs(start);
  });
  *slowestMs = *std::max_element(took.begin(), took.end());
  return errors;
}

TEST(ShmTuning, ARankWithOtherOptionsIsRefusedOnEveryRankAtCreation) {
  double slowest = 0;
  auto errors = createAll(
      3, 1,
      [](int r, ShmOptions& o) {
        if (r == 2) o.smallBytes = 128 << 10;
      },
      &slowest);
  for (int r = 0; r < 3; ++r) {
    EXPECT_CONTAINS(errors[r], "rank " + std::to_string(r) +
                                   "/3: shared memory: the ranks of "
                                   "this node were given different options: ShmOptions::smallBytes "
                                   "is 65536 on rank 0 and 131072 on rank 2. HINT: every rank must "
                                   "pass the same ShmOptions");
  }
  EXPECT_LT(slowest, 5000) << "no timeout: the connect timeout is 10 s";

  errors = createAll(
      2, 1,
      [](int r, ShmOptions& o) {
        if (r == 1) o.ownedChunkBytes = 1 << 20;
      },
      &slowest);
  for (int r = 0; r < 2; ++r) {
    EXPECT_CONTAINS(errors[r], "ShmOptions::ownedChunkBytes is 8388608 on rank 0 and 1048576 on "
                               "rank 1");
  }
}

TEST(ShmTuning, NodesWithOtherOptionsAreRefusedOnEveryRankNamingTheirRanks) {
  if (!glooAvailable()) GTEST_SKIP() << "built without Gloo: no backend between the nodes";
  double slowest = 0;
  // Two pretend nodes of two ranks; node 1 (ranks 2, 3) agrees with itself, not with node 0.
  auto errors = createAll(
      4, 2,
      [](int r, ShmOptions& o) {
        if (r >= 2) o.slotBytes = 2 << 20;
      },
      &slowest);
  for (int r : {0, 2}) {
    EXPECT_CONTAINS(errors[r], "the nodes were given different options: ShmOptions::slotBytes is "
                               "1048576 on rank 0 and 2097152 on rank 2");
  }
  for (int r : {1, 3}) {
    EXPECT_CONTAINS(errors[r], "ShmOptions::slotBytes is 1048576 on rank 1 and 2097152 on rank 3");
  }
  EXPECT_LT(slowest, 5000);

  // Within a pretend node the ranks are named by the communicator's numbers.
  errors = createAll(
      4, 2,
      [](int r, ShmOptions& o) {
        if (r == 3) o.smallBytes = 1024;
      },
      &slowest);
  for (int r : {2, 3}) {
    EXPECT_CONTAINS(errors[r], "rank " + std::to_string(r) + "/4 (local rank " +
                                   std::to_string(r - 2) +
                                   "/2): shared memory: the ranks of this "
                                   "node were given different options: ShmOptions::smallBytes is "
                                   "65536 on rank 2 and 1024 on rank 3");
  }
  // Node 0's ranks lose their cross-node peer; its report says why.
  for (int r : {0, 1}) {
    EXPECT_CONTAINS(errors[r], "ShmOptions::smallBytes is 65536 on rank 2 and 1024 on rank 3");
  }
  EXPECT_LT(slowest, 5000);
}

}  // namespace
}  // namespace dtrain::comm::shm_tuning_test
