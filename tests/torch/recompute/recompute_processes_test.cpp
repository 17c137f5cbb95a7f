// Activation recompute under DDP across real processes: `launch` starts recompute_worker
// (tests/torch/recompute/recompute_worker.cpp) on 2 ranks over Gloo; each rank checks that training
// with recompute is bitwise the training without it (Dropout, BatchNorm) and prints PASS/FAIL.
// And what recompute does to resident memory on the CPU (recompute_rss_worker).
#include <gtest/gtest.h>

#include <cstdio>
#include <regex>
#include <string>
#include <vector>

#include "launcher_support.h"
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

struct Rss {
  double added = 0;       // MiB of resident memory the step added
  double tensorPeak = 0;  // MiB of tensors it added at most
};

Rss measure(const std::string& mode, const std::vector<std::string>& env = {}) {
  auto result = runLaunch({"--nproc-per-node", "1", binaryPath("recompute_rss_worker"), mode}, env,
                          120);
  EXPECT_EQ(result.exitCode, 0) << result.all();
  std::smatch m;
  const std::string out = result.out;
  if (!std::regex_search(out, m, std::regex(mode + " rss_added=([0-9]+) tensor_peak=([0-9]+)"))) {
    ADD_FAILURE() << "no measurement line: " << result.all();
    return {};
  }
  Rss r{std::stod(m[1]) / (1 << 20), std::stod(m[2]) / (1 << 20)};
  std::printf("%s%s: resident memory added %.0f MiB, tensors added at most %.0f MiB\n",
              mode.c_str(), env.empty() ? "" : (" (" + env[0] + ")").c_str(), r.added,
              r.tensorPeak);
  return r;
}

// Recompute lowers the resident memory of a CPU step without the program knowing about
// allocators: dtrain::init() installs the host memory cache, and the recomputed step adds at
// most its peak of tensor bytes + 10 % (glibc alone added more than the plain step: freed 16 MB
// activations allocated again in its heap, fragmented).
TEST(RecomputeProcesses, ARecomputedStepAddsNoMoreResidentMemoryThanItsTensors) {
  const Rss plain = measure("plain");
  const Rss recomputed = measure("recompute");
  measure("recompute", {"DTRAIN_HOST_MEMORY_CACHE=0"});  // for the record: glibc's
  ASSERT_GT(recomputed.tensorPeak, 0) << "the cache counted no tensors: not installed by init()";
  EXPECT_LE(recomputed.added, recomputed.tensorPeak * 1.10);
  EXPECT_LT(recomputed.added, plain.added) << "recompute must lower resident memory";
  EXPECT_LT(recomputed.tensorPeak, plain.tensorPeak);
}

}  // namespace
}  // namespace dtrain::testing::recompute_processes_test
