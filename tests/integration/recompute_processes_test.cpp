// Activation recompute under DDP across real processes: `launch` starts recompute_worker
// (tests/integration/recompute_worker.cpp) on 2 ranks over Gloo; each rank checks that training
// with recompute is bitwise the training without it (Dropout, BatchNorm) and prints PASS/FAIL.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "launcher_harness.h"
#include "test_support.h"

namespace dtrain::testing::recompute_processes_test {
namespace {

TEST(RecomputeProcesses, DropoutAndBatchNormUnderDdpTrainBitwiseEqual) {
  auto result = runLaunch({"--nproc-per-node", "2", binaryPath("recompute_worker")}, {}, 120);
  const std::string output = result.all();
  EXPECT_EQ(result.exitCode, 0) << output;
  for (int rank = 0; rank < 2; ++rank) {
    for (const std::string scenario : {"recompute-ddp", "recompute-ddp-unused"}) {
      const std::string line = "rank " + std::to_string(rank) + " PASS " + scenario + "\n";
      EXPECT_NE(output.find(line), std::string::npos) << "missing: " << line << output;
    }
  }
}

}  // namespace
}  // namespace dtrain::testing::recompute_processes_test
