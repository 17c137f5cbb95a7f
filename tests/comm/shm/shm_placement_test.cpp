// Note [Moving off a shared core] in runtime/comm/shm/shm_engine.cpp: two ranks that take turns on
// one core while another core is free end up apart. Serial (the CPUs must be otherwise idle).
#include <sched.h>

#include <gtest/gtest.h>

#include <vector>

#include "comm_support.h"

namespace dtrain::comm::shm_placement_test {
namespace {

using testing::runRanks;
using testing::shmTestOptions;

TEST(ShmPlacement, RanksThatShareACoreWhileAnotherIsFreeEndUpApart) {
  cpu_set_t all;
  CPU_ZERO(&all);
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  if (CPU_COUNT(&all) < 2) GTEST_SKIP() << "one CPU: nowhere to move";
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);

  auto store = std::make_shared<store::HashStore>();
  std::vector<int> cpuAtEnd(2, -1);
  runRanks(2, [&](int r) {
    auto comm = createShmCommunicator(shmTestOptions(r, 2, store));
    std::vector<float> x(1024, 1.0f);  // 4 KiB: the engine's small path, on this thread
    // Both on one CPU to begin with, then free to run anywhere: from here only the scheduler and
    // the engine decide where the two run.
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
    for (int i = 0; i < 50; ++i) {
      comm->allreduce(x.data(), x.size(), DataType::Float32, ReduceOp::Max);
    }
    ASSERT_EQ(sched_setaffinity(0, sizeof(all), &all), 0);
    for (int i = 0; i < 3000; ++i) {
      comm->allreduce(x.data(), x.size(), DataType::Float32, ReduceOp::Max);
    }
    cpuAtEnd[r] = sched_getcpu();
    comm->barrier();
  });
  EXPECT_NE(cpuAtEnd[0], cpuAtEnd[1]) << "both ranks still on CPU " << cpuAtEnd[0];
}

}  // namespace
}  // namespace dtrain::comm::shm_placement_test
