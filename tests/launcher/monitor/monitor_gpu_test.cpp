// launch's GPU sampling against a real driver: NVML (dlopen) and nvidia-smi's CSV must describe
// the same GPUs, and the live CSV must parse without a problem. Skipped without an NVIDIA driver;
// the parsers themselves are tested everywhere against a recorded CSV
// (launcher_monitor_sampling_test.cpp).
#include <cmath>

#include <gtest/gtest.h>

#include "launcher/monitor/command.h"
#include "launcher/monitor/gpu_sampler.h"

namespace dtrain::launcher::monitor::monitor_gpu_test {
namespace {

TEST(GpuSampling, LiveNvidiaSmiCsvParsesWithoutProblems) {
  if (!commandExists("nvidia-smi")) GTEST_SKIP() << "nvidia-smi is not in PATH: no GPU here";
  CommandResult r = runCommand({"nvidia-smi", std::string("--query-gpu=") + kGpuQueryFields,
                                "--format=csv,noheader,nounits"},
                               std::chrono::milliseconds(10000));
  ASSERT_TRUE(r.ok()) << r.error << r.err << r.out;
  std::vector<std::string> problems;
  auto gpus = parseGpuQueryCsv(r.out, &problems);
  EXPECT_TRUE(problems.empty()) << problems.front() << "\nthe CSV:\n" << r.out;
  ASSERT_FALSE(gpus.empty()) << r.out;
  for (const auto& g : gpus) {
    EXPECT_EQ(g.uuid.rfind("GPU-", 0), 0u) << g.uuid;
    ASSERT_TRUE(g.memTotalBytes) << "GPU " << g.index;
    EXPECT_GT(*g.memTotalBytes, 1e9) << "GPU " << g.index;
    EXPECT_TRUE(g.utilPercent) << "GPU " << g.index;
    EXPECT_TRUE(g.temperatureC) << "GPU " << g.index;
  }
  std::printf("nvidia-smi: %zu GPU(s); GPU 0 %s, %.0f MiB, %.0f C\n", gpus.size(),
              gpus[0].uuid.c_str(), *gpus[0].memTotalBytes / (1 << 20), *gpus[0].temperatureC);
}

TEST(GpuSampling, NvmlAndNvidiaSmiDescribeTheSameGpus) {
  if (!commandExists("nvidia-smi")) GTEST_SKIP() << "nvidia-smi is not in PATH: no GPU here";
  GpuSourceOptions o;
  std::string why;
  auto nvml = openGpuSource(o, &why);
  ASSERT_TRUE(nvml) << why;
  if (nvml->describe().find("NVML") == std::string::npos) {
    GTEST_SKIP() << "libnvidia-ml.so.1 does not load here: " << why;
  }
  auto smi = nvidiaSmiSource(o);
  auto a = nvml->sample();
  auto b = smi->sample();
  ASSERT_FALSE(a.empty()) << nvml->lastError();
  ASSERT_EQ(a.size(), b.size()) << smi->lastError();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].index, b[i].index);
    EXPECT_EQ(a[i].uuid, b[i].uuid);
    ASSERT_TRUE(a[i].memTotalBytes && b[i].memTotalBytes);
    EXPECT_NEAR(*a[i].memTotalBytes, *b[i].memTotalBytes, 2.0 * (1 << 20)) << "MiB rounding only";
    if (a[i].temperatureC && b[i].temperatureC) {
      EXPECT_NEAR(*a[i].temperatureC, *b[i].temperatureC, 5.0);
    }
    // ECC: both read the driver's volatile counts (a GPU without ECC has none from either).
    EXPECT_EQ(a[i].eccUncorrected.has_value(), b[i].eccUncorrected.has_value()) << "GPU " << i;
    if (a[i].eccUncorrected && b[i].eccUncorrected) {
      EXPECT_EQ(*a[i].eccUncorrected, *b[i].eccUncorrected) << "GPU " << i;
    }
    // XIDs: NVML only; a count (0 on a healthy GPU) wherever the event registration worked.
    EXPECT_FALSE(b[i].xidEvents) << "nvidia-smi has no XID query";
  }
}

}  // namespace
}  // namespace dtrain::launcher::monitor::monitor_gpu_test
