// ZeRO across real processes: `launch` starts zero_worker (tests/integration/zero_worker.cpp) on
// 2, 3 and 4 ranks, over shared memory and over Gloo; every rank checks that stages 1 and 2 end
// within 1e-6 of DDP's parameters and bitwise equal across ranks, with one rank's gradient
// poisoned (DTRAIN_FAULT=nan-grad) so that every rank must agree to skip that step.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "launcher_harness.h"
#include "test_support.h"

namespace dtrain::testing {
namespace {

struct Case {
  int ranks;
  bool shm;
};

class ZeroProcesses : public ::testing::TestWithParam<Case> {};

TEST_P(ZeroProcesses, StagesOneAndTwoMatchDdpWithAnOverflowOnOneRank) {
  const Case c = GetParam();
  const std::string backend = c.shm ? "shm" : "gloo";
  // The last rank's gradient is poisoned at the 8th synchronising backward of every training.
  const std::string fault = "DTRAIN_FAULT=nan-grad@rank=" + std::to_string(c.ranks - 1) + ",step=7";
  auto result = runLaunch({"--nproc-per-node", std::to_string(c.ranks), binaryPath("zero_worker"),
                           "--scenarios", "adamw,sgd-groups", "--skipped", "1"},
                          {fault, std::string("DTRAIN_SHM=") + (c.shm ? "1" : "0")}, 240);
  const std::string out = result.all();
  EXPECT_EQ(result.exitCode, 0) << out;
  EXPECT_EQ(out.find(" FAIL "), std::string::npos) << out;
  for (int r = 0; r < c.ranks; ++r) {
    for (const char* s : {"adamw", "sgd-groups"}) {
      const std::string line = "rank " + std::to_string(r) + " PASS " + s + "\n";
      EXPECT_NE(out.find(line), std::string::npos) << "missing: " << line << out;
    }
    const std::string used = "rank " + std::to_string(r) + " backend " + backend + "\n";
    EXPECT_NE(out.find(used), std::string::npos) << "missing: " << used << out;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, ZeroProcesses,
                         ::testing::Values(Case{2, true}, Case{3, true}, Case{4, true},
                                           Case{2, false}, Case{3, false}, Case{4, false}),
                         [](const auto& info) {
                           return std::to_string(info.param.ranks) + "Ranks" +
                                  (info.param.shm ? "SharedMemory" : "Gloo");
                         });

}  // namespace
}  // namespace dtrain::testing
