// GradScaler: torch.amp.GradScaler's semantics (defaults, skip and backoff, growth, the errors it
// raises) and the cross-rank agreement on overflow, with ranks as threads. The same agreement
// across real processes with DTRAIN_FAULT=nan-grad is in
// tests/torch/checkpoint/checkpoint_processes_test.cpp.
#include <cmath>
#include <limits>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp/ddp_models.h"
#include "ddp/ddp_support.h"
#include "dtrain/torch/ddp.h"
#include "dtrain/torch/grad_scaler.h"

namespace dtrain::testing::grad_scaler_test {
namespace {

std::vector<torch::Tensor> snapshot(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

bool sameParams(torch::nn::Module& m, const std::vector<torch::Tensor>& before) {
  auto now = m.parameters();
  for (size_t i = 0; i < now.size(); ++i) {
    if (!torch::equal(now[i], before[i])) return false;
  }
  return true;
}

TEST(GradScaler, DefaultsAreTorchAmps) {
  GradScalerOptions o;
  EXPECT_EQ(o.initScale, 65536.0);
  EXPECT_EQ(o.growthFactor, 2.0);
  EXPECT_EQ(o.backoffFactor, 0.5);
  EXPECT_EQ(o.growthInterval, 2000);
  EXPECT_TRUE(o.enabled);
  GradScaler scaler;
  EXPECT_EQ(scaler.getScale(), 65536.0);
  auto loss = torch::tensor(1.5f);
  EXPECT_EQ(scaler.scale(loss).item<float>(), 1.5f * 65536.0f);
  GradScalerOptions bad;
  bad.backoffFactor = 1.5;
  EXPECT_THROW(GradScaler(nullptr, bad), InvalidArgument);
}

TEST(GradScaler, UnscalesExactlyAndSteps) {
  torch::manual_seed(1);
  Mlp net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  GradScalerOptions o;
  o.initScale = 1024;
  GradScaler scaler(nullptr, o);
  auto x = torch::randn({4, 8}), y = torch::randn({4, 4});
  // The reference gradient, unscaled.
  torch::mse_loss(net->forward(x), y).backward();
  auto expected = net->fc1->weight.grad().clone();
  sgd.zero_grad();
  scaler.scale(torch::mse_loss(net->forward(x), y)).backward();
  scaler.unscale(sgd);
  EXPECT_TRUE(torch::allclose(net->fc1->weight.grad(), expected, 1e-6, 1e-7));
  EXPECT_THROW(scaler.unscale(sgd), Error);  // twice between updates
  auto before = snapshot(*net);
  EXPECT_TRUE(scaler.step(sgd));
  EXPECT_FALSE(sameParams(*net, before));
  EXPECT_THROW(scaler.step(sgd), Error);  // step twice
  scaler.update();
  EXPECT_EQ(scaler.getScale(), 1024.0);
  EXPECT_THROW(scaler.update(), Error);  // no step since
}

TEST(GradScaler, OverflowSkipsTheStepAndBacksOff) {
  for (double poison : {std::numeric_limits<double>::infinity(), std::nan("")}) {
    Mlp net;
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    GradScalerOptions o;
    o.initScale = 256;
    GradScaler scaler(nullptr, o);
    scaler.scale(torch::mse_loss(net->forward(torch::randn({2, 8})), torch::randn({2, 4})))
        .backward();
    net->fc2->bias.mutable_grad()[1] = poison;
    auto before = snapshot(*net);
    EXPECT_FALSE(scaler.step(sgd));
    EXPECT_TRUE(scaler.lastStepSkipped());
    EXPECT_TRUE(sameParams(*net, before));
    EXPECT_TRUE(sgd.state().empty()) << "a skipped step must not create momentum";
    scaler.update();
    EXPECT_EQ(scaler.getScale(), 128.0);
    EXPECT_EQ(scaler.state().growthTracker, 0);
    EXPECT_EQ(scaler.skippedSteps(), 1);
  }
}

TEST(GradScaler, GrowsAfterTheIntervalOfCleanSteps) {
  Mlp net;
  torch::optim::SGD sgd(net->parameters(), 0.01);
  GradScalerOptions o;
  o.initScale = 8;
  o.growthInterval = 3;
  GradScaler scaler(nullptr, o);
  std::vector<double> scales;
  for (int step = 0; step < 7; ++step) {
    sgd.zero_grad();
    scaler.scale(torch::mse_loss(net->forward(torch::randn({2, 8})), torch::randn({2, 4})))
        .backward();
    if (step == 4) net->fc1->weight.mutable_grad()[0][0] = INFINITY;
    scaler.step(sgd);
    scaler.update();
    scales.push_back(scaler.getScale());
  }
  // Clean, clean, clean -> x2; clean, inf -> /2 (tracker reset); clean, clean.
  EXPECT_EQ(scales, (std::vector<double>{8, 8, 16, 16, 8, 8, 8}));
  EXPECT_EQ(scaler.state().growthTracker, 2);
  // Growth stops where the scale would overflow float32.
  GradScaler big(nullptr, [] {
    GradScalerOptions g;
    g.initScale = 3e38;
    g.growthInterval = 1;
    return g;
  }());
  sgd.zero_grad();
  big.scale(torch::mse_loss(net->forward(torch::randn({2, 8})), torch::randn({2, 4}))).backward();
  net->zero_grad();  // finite (zero) gradients
  for (auto& p : net->parameters()) p.mutable_grad() = torch::zeros_like(p);
  big.step(sgd);
  big.update();
  EXPECT_FLOAT_EQ(static_cast<float>(big.getScale()), 3e38f);
}

TEST(GradScaler, DisabledIsAPassThrough) {
  Mlp net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  GradScalerOptions o;
  o.enabled = false;
  GradScaler scaler(nullptr, o);
  auto loss = torch::mse_loss(net->forward(torch::randn({2, 8})), torch::randn({2, 4}));
  EXPECT_TRUE(scaler.scale(loss).equal(loss));
  loss.backward();
  net->fc1->weight.mutable_grad()[0][0] = INFINITY;
  EXPECT_TRUE(scaler.step(sgd));  // no checks when disabled
  scaler.update();
  EXPECT_EQ(scaler.getScale(), 1.0);
}

TEST(GradScaler, StateRoundTrips) {
  GradScalerOptions o;
  o.initScale = 512;
  o.growthInterval = 10;
  GradScaler a(nullptr, o);
  Mlp net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  for (int i = 0; i < 3; ++i) {
    sgd.zero_grad();
    a.scale(torch::mse_loss(net->forward(torch::randn({2, 8})), torch::randn({2, 4}))).backward();
    a.step(sgd);
    a.update();
  }
  GradScaler b;
  b.loadState(a.state());
  EXPECT_EQ(b.state(), a.state());
  EXPECT_EQ(b.state().growthTracker, 3);
  EXPECT_EQ(b.getScale(), 512.0);
  GradScalerState broken = a.state();
  broken.scale = -1;
  EXPECT_THROW(b.loadState(broken), InvalidArgument);
}

// One rank alone sees an inf after DDP's allreduce. With the agreement every rank skips and the
// replicas stay bitwise equal; a scaler without a group (PyTorch's plain GradScaler) lets the
// other rank step, and the replicas drift apart -- the failure the agreement exists for.
std::vector<std::vector<torch::Tensor>> trainWithLonelyInf(bool agree, std::vector<bool>* skipped,
                                                           bool accumulate = false) {
  const int kWorld = 2;
  auto world = ThreadWorld::create(kWorld);
  std::vector<std::vector<torch::Tensor>> finals(kWorld);
  skipped->assign(kWorld, false);
  world->run([&](int rank) {
    auto group = threadGroup(*world, rank);
    torch::manual_seed(3);
    Mlp net;
    DistributedDataParallel<Mlp> ddp(net, group);
    torch::optim::SGD sgd(ddp.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    GradScaler scaler(agree ? group : nullptr);
    for (int step = 0; step < 4; ++step) {
      sgd.zero_grad();
      torch::manual_seed(100 + 10 * step + rank);
      if (accumulate) {  // one micro-batch accumulated locally under noSync(), then the synced one
        auto guard = ddp.noSync();
        scaler.scale(torch::mse_loss(ddp(torch::randn({3, 8})), torch::randn({3, 4}))).backward();
      }
      scaler.scale(torch::mse_loss(ddp(torch::randn({3, 8})), torch::randn({3, 4}))).backward();
      if (step == 2 && rank == 1) net->fc3->weight.mutable_grad()[0][0] = INFINITY;
      bool stepped = scaler.step(sgd);
      if (step == 2) (*skipped)[rank] = !stepped;
      scaler.update();
    }
    finals[rank] = snapshot(*net);
  });
  return finals;
}

TEST(GradScaler, EveryRankSkipsWhenOneRankAloneOverflows) {
  std::vector<bool> skipped;
  auto finals = trainWithLonelyInf(/*agree=*/true, &skipped);
  EXPECT_TRUE(skipped[0] && skipped[1]);
  for (size_t i = 0; i < finals[0].size(); ++i) {
    EXPECT_TRUE(torch::equal(finals[0][i], finals[1][i])) << "parameter " << i << " differs";
  }
  // Without the agreement the same run diverges: this test can fail.
  auto drifted = trainWithLonelyInf(/*agree=*/false, &skipped);
  EXPECT_FALSE(skipped[0]);
  EXPECT_TRUE(skipped[1]);
  bool allEqual = true;
  for (size_t i = 0; i < drifted[0].size(); ++i)
    allEqual = allEqual && torch::equal(drifted[0][i], drifted[1][i]);
  EXPECT_FALSE(allEqual);
}

TEST(GradScaler, EveryRankSkipsUnderNoSyncAccumulationToo) {
  std::vector<bool> skipped;
  auto finals = trainWithLonelyInf(/*agree=*/true, &skipped, /*accumulate=*/true);
  EXPECT_TRUE(skipped[0] && skipped[1]);
  for (size_t i = 0; i < finals[0].size(); ++i)
    EXPECT_TRUE(torch::equal(finals[0][i], finals[1][i]));
}

}  // namespace
}  // namespace dtrain::testing::grad_scaler_test
