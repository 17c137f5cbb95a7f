// A PyTorch script written for torchrun (gloo, env://, DDP) runs unchanged under launch, and the
// error file torchrun's @record writes shows up in launch's failure report. Uses Debian's
// /usr/bin/python3, whose torch this is (a python3 earlier on PATH may lack it).
#include <unistd.h>

#include <gtest/gtest.h>

#include "launcher_harness.h"
#include "test_support.h"

namespace dtrain::testing::launcher_compat_test {
namespace {

constexpr const char* kPython = "/usr/bin/python3";

std::string script() { return sourceDir() + "/tests/integration/py/ddp_compat.py"; }

bool haveTorch() {
  if (::access(kPython, X_OK) != 0) return false;
  return std::system("/usr/bin/python3 -c 'import torch.distributed' >/dev/null 2>&1") == 0;
}

TEST(LaunchCompat, TorchrunDdpScriptRunsUnchanged) {
  if (!haveTorch()) GTEST_SKIP() << "python3-torch is not installed (scripts/setup.sh installs it)";
  LaunchResult r = runLaunch({"--nproc-per-node", "2", "--python", kPython, script()}, {}, 80);
  ASSERT_EQ(r.exitCode, 0) << r.all();
  for (int rank : {0, 1}) {
    std::string line = "[rank " + std::to_string(rank) + "]: ddp_compat rank=" +
                       std::to_string(rank) + " local_rank=" + std::to_string(rank) +
                       " world=2 replicas_equal=True restart_count=0";
    EXPECT_NE(r.out.find(line), std::string::npos) << r.out;
  }
}

TEST(LaunchCompat, RecordErrorFileReachesTheReport) {
  if (!haveTorch()) GTEST_SKIP() << "python3-torch is not installed (scripts/setup.sh installs it)";
  LaunchResult r = runLaunch({"--nproc-per-node", "2", "--grace-period", "3", "--python", kPython,
                              script(), "--fail-rank", "1"},
                             {}, 80);
  EXPECT_EQ(r.exitCode, 1) << r.all();
  EXPECT_NE(r.err.find("launch: job failed: rank 1 exited with code 1"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("compat test failure on rank 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("error file:"), std::string::npos) << "from TORCHELASTIC_ERROR_FILE: "
                                                          << r.err;
}

}  // namespace
}  // namespace dtrain::testing::launcher_compat_test
