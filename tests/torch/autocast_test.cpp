// AutocastGuard: bfloat16 on the CPU inside the guard, float32 outside, nesting restores, and a
// disabled guard changes nothing.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtrain/base/error.h"
#include "dtrain/torch/autocast.h"

namespace dtrain::autocast_test {
namespace {

TEST(Autocast, CpuForwardRunsInBfloat16InsideTheGuardOnly) {
  torch::nn::Linear linear(8, 4);
  torch::Tensor x = torch::randn({2, 8});
  {
    AutocastGuard guard(torch::kCPU);
    torch::Tensor y = linear(x);
    EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
    // Losses are on autocast's float32 list: they are computed in float32.
    torch::Tensor loss = torch::nn::functional::cross_entropy(y, torch::tensor({0, 1}));
    EXPECT_EQ(loss.scalar_type(), torch::kFloat);
    loss.backward();  // gradients reach the float32 parameters
  }
  EXPECT_EQ(linear->weight.grad().scalar_type(), torch::kFloat);
  EXPECT_EQ(linear(x).scalar_type(), torch::kFloat);
}

TEST(Autocast, NestedAndDisabledGuardsRestoreTheState) {
  torch::nn::Linear linear(4, 4);
  torch::Tensor x = torch::randn({1, 4});
  {
    AutocastGuard outer(torch::kCPU);
    {
      AutocastGuard off(torch::kCPU, /*enabled=*/false);
      EXPECT_EQ(linear(x).scalar_type(), torch::kBFloat16);  // a disabled guard does nothing
      AutocastGuard inner(torch::kCPU);
      EXPECT_EQ(linear(x).scalar_type(), torch::kBFloat16);
    }
    EXPECT_EQ(linear(x).scalar_type(), torch::kBFloat16);  // inner left the outer enabled
  }
  EXPECT_EQ(linear(x).scalar_type(), torch::kFloat);
  EXPECT_EQ(AutocastGuard::lowerPrecision(torch::kCPU), torch::kBFloat16);
  EXPECT_EQ(AutocastGuard::lowerPrecision(torch::Device(torch::kCUDA, 0)), torch::kHalf);
}

TEST(Autocast, UnsupportedDeviceIsRefused) {
  EXPECT_THROW(AutocastGuard(torch::Device(torch::kMeta)), InvalidArgument);
}

}  // namespace
}  // namespace dtrain::autocast_test
