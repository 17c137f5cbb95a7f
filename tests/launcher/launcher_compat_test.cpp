// A PyTorch script written for torchrun (gloo, env://, DDP) runs unchanged under launch, and the
// error file torchrun's @record writes shows up in launch's failure report. Uses DTRAIN_PYTHON,
// whose torch this is (a python3 on PATH may lack it).
#include <gtest/gtest.h>

#include "launcher_support.h"
#include "test_support.h"

namespace dtrain::testing::launcher_compat_test {
namespace {

std::string script() { return sourceDir() + "/tests/launcher/ddp_compat.py"; }

TEST(LaunchCompat, TorchrunDdpScriptRunsUnchanged) {
  const std::string missing = pythonImportError("torch.distributed");
  ASSERT_TRUE(missing.empty()) << missing;
  LaunchResult r = runLaunch({"--nproc-per-node", "2", "--python", python(), script()}, {}, 80);
  ASSERT_EQ(r.exitCode, 0) << r.all();
  for (int rank : {0, 1}) {
    std::string line = "[rank " + std::to_string(rank) +
                       "]: ddp_compat rank=" + std::to_string(rank) +
                       " local_rank=" + std::to_string(rank) +
                       " world=2 replicas_equal=True restart_count=0";
    EXPECT_NE(r.out.find(line), std::string::npos) << r.out;
  }
}

TEST(LaunchCompat, RecordErrorFileReachesTheReport) {
  const std::string missing = pythonImportError("torch.distributed");
  ASSERT_TRUE(missing.empty()) << missing;
  LaunchResult r = runLaunch({"--nproc-per-node", "2", "--grace-period", "3", "--python", python(),
                              script(), "--fail-rank", "1"},
                             {}, 80);
  EXPECT_EQ(r.exitCode, 1) << r.all();
  EXPECT_NE(r.err.find("launch: job failed: rank 1 exited with code 1"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("compat test failure on rank 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("error file:"), std::string::npos)
      << "from TORCHELASTIC_ERROR_FILE: " << r.err;
}

}  // namespace
}  // namespace dtrain::testing::launcher_compat_test
