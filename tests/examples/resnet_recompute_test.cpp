// examples::ResNet with ResNetOptions::recompute: the same parameter names, and one training step
// bitwise equal to the model without it (BatchNorm statistics included), for both stems.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>

#include "models/resnet.h"

namespace examples::resnet_recompute_test {
namespace {

bool bitwiseEqual(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  auto x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

ResNet trainedOneStep(ResNetOptions options, bool recompute, int64_t size) {
  options.recompute = recompute;
  torch::manual_seed(1);
  ResNet net = makeResNet(options);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto x = torch::randn({4, 3, size, size});
  auto y = torch::randint(0, options.numClasses, {4});
  torch::nn::functional::cross_entropy(net->forward(x), y).backward();
  sgd.step();
  return net;
}

TEST(ResNetRecompute, OneStepBitwiseEqualForBothStems) {
  for (const auto& [arch, cifar, size] : {std::make_tuple("resnet18", true, int64_t{16}),
                                          std::make_tuple("resnet50", false, int64_t{48})}) {
    ResNetOptions o;
    o.arch = arch;
    o.cifarStem = cifar;
    o.width = 4;
    o.numClasses = 5;
    ResNet plain = trainedOneStep(o, false, size), recomputed = trainedOneStep(o, true, size);
    auto want = plain->named_parameters();
    auto got = recomputed->named_parameters();
    ASSERT_EQ(got.keys(), want.keys());
    for (const auto& p : want)
      EXPECT_TRUE(bitwiseEqual(got[p.key()], p.value())) << arch << " " << p.key();
    auto wantBuffers = plain->named_buffers();
    for (const auto& b : recomputed->named_buffers()) {
      EXPECT_TRUE(bitwiseEqual(b.value(), wantBuffers[b.key()])) << arch << " " << b.key();
    }
  }
}

}  // namespace
}  // namespace examples::resnet_recompute_test
