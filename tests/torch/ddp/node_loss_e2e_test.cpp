// Surviving a lost node, end to end: `launch --on-node-loss continue` over a simulated cluster
// (network namespaces + sshd), 3 nodes x 2 ranks under DDP (shared memory within a node, Gloo
// across). Node 2 is lost at step 3 -- its rank 4 SIGKILLed, so its agent ends rank 5 and reports
// the node lost -- and the survivors discard that step, re-form as 4 ranks in epoch 1 and train
// on. The job must end 0 with every survivor bitwise equal to the others and, within 1e-5, to one
// process that trained every step on the whole global batch.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <vector>

#include <fmt/format.h>

#include "multinode_support.h"
#include "test_support.h"

namespace dtrain::testing::node_loss_e2e_test {
namespace {

std::string worker() { return binaryDir() + "/node_loss_worker"; }

std::vector<float> floats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

TEST(NodeLossE2E, ANodeKilledMidStepCostsOneStepAndTheSurvivorsEndAsOneProcess) {
  if (::access(worker().c_str(), X_OK) != 0) GTEST_SKIP() << "node_loss_worker not built";
  DTRAIN_CLUSTER_OR_SKIP(c, 3);
  const std::string out = c->dir() + "/params";
  const std::string ref = c->dir() + "/ref.params";
  LaunchResult job = runLaunch(
      fanOut(*c, {"--on-node-loss", "continue", "--nnodes", "2:3", "--nproc-per-node", "2",
                  worker(), "--steps", "8", "--out", out}),
      {"DTRAIN_FAULT=signal:KILL@rank=4,step=3"}, 120);
  if (std::getenv("DTRAIN_TEST_SHOW")) std::cout << job.all();
  ASSERT_EQ(job.exitCode, 0) << job.all();
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(job.out.find(fmt::format("rank {} final identical across ranks world 4 epoch 1 "
                                       "discarded 1",
                                       rank)),
              std::string::npos)
        << "rank " << rank << ":\n"
        << job.all();
  }
  EXPECT_NE(job.all().find("epoch 1"), std::string::npos) << job.all();

  ASSERT_EQ(std::system((worker() + " --reference --steps 8 --out " + ref).c_str()), 0);
  const auto got = floats(readFile(out));
  const auto want = floats(readFile(ref));
  ASSERT_EQ(got.size(), want.size());
  ASSERT_FALSE(want.empty());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(got[i] - want[i])));
    scale = std::max(scale, static_cast<double>(std::abs(want[i])));
  }
  EXPECT_LE(worst / scale, 1e-5) << "the survivors' parameters differ from one process's";
}

}  // namespace
}  // namespace dtrain::testing::node_loss_e2e_test
