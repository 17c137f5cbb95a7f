// DDP across real processes: `launch` starts ddp_worker (tests/torch/ddp/ddp_worker.cpp) on N
// ranks talking over Gloo; the worker checks each scenario on every rank and prints PASS/FAIL.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "launcher_support.h"
#include "test_support.h"

namespace dtrain::testing::ddp_processes_test {
namespace {

struct Run {
  int exitCode = -1;
  std::string output;
};

// Runs `launch --nproc-per-node N ddp_worker args...`; stdout and stderr together.
Run launchWorkers(int ranks, const std::vector<std::string>& workerArgs, double seconds = 120) {
  std::vector<std::string> args = {"--nproc-per-node", std::to_string(ranks),
                                   binaryPath("ddp_worker")};
  args.insert(args.end(), workerArgs.begin(), workerArgs.end());
  auto result = runLaunch(args, {}, seconds);
  return {result.exitCode, result.all()};
}

void expectAllPassed(const Run& run, int ranks, const std::vector<std::string>& scenarios) {
  EXPECT_EQ(run.exitCode, 0) << run.output;
  EXPECT_EQ(run.output.find(" FAIL "), std::string::npos) << run.output;
  for (int r = 0; r < ranks; ++r) {
    for (const auto& s : scenarios) {
      std::string line = "rank " + std::to_string(r) + " PASS " + s + "\n";
      EXPECT_NE(run.output.find(line), std::string::npos) << "missing: " << line << run.output;
    }
  }
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ",") + s;
  return out;
}

TEST(DdpProcesses, TwoRanks) {
  const std::vector<std::string> scenarios = {"mlp",      "cnn",     "batchnorm",
                                              "nosync",   "unused",  "unused-error",
                                              "mismatch", "overlap", "compression"};
  expectAllPassed(launchWorkers(2, {"--scenarios", join(scenarios)}), 2, scenarios);
}

TEST(DdpProcesses, ThreeRanks) {
  const std::vector<std::string> scenarios = {"mlp", "cnn", "nosync", "unused", "mismatch"};
  expectAllPassed(launchWorkers(3, {"--scenarios", join(scenarios)}), 3, scenarios);
}

TEST(DdpProcesses, FourRanks) {
  const std::vector<std::string> scenarios = {"mlp", "cnn"};
  expectAllPassed(launchWorkers(4, {"--scenarios", join(scenarios)}), 4, scenarios);
}

TEST(DdpProcesses, SamplerResumesMidEpochAtAnotherWorldSize) {
  TempDir dir;
  std::string state = dir.file("sampler.state");
  expectAllPassed(
      launchWorkers(3, {"--scenarios", "sampler-save", "--state", state, "--consumed", "4"}), 3,
      {"sampler-save"});
  for (int world : {2, 3, 4}) {
    expectAllPassed(launchWorkers(world, {"--scenarios", "sampler-resume", "--state", state,
                                          "--consumed", "4", "--original-world", "3"}),
                    world, {"sampler-resume"});
  }
}

}  // namespace
}  // namespace dtrain::testing::ddp_processes_test
