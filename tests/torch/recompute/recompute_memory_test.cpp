// Activation memory of dtrain::recompute, counted by a CPU allocator installed in front of
// libtorch's: a 64-block MLP in 8 recomputed segments against the same MLP run plainly.
#include <gtest/gtest.h>

#include <cstdio>

#include <torch/torch.h>

#include "counting_allocator.h"
#include "dtrain/torch/recompute.h"

namespace dtrain::testing::recompute_memory_test {
namespace {

constexpr int64_t kBlocks = 64, kSegments = 8, kWidth = 64, kBatch = 1024;

// Linear -> LayerNorm -> tanh, 64 times.
torch::nn::Sequential deepMlp() {
  torch::manual_seed(1);
  torch::nn::Sequential net;
  for (int64_t b = 0; b < kBlocks; ++b) {
    net->push_back(torch::nn::Linear(kWidth, kWidth));
    net->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions({kWidth})));
    net->push_back(torch::nn::Functional(torch::tanh));
  }
  return net;
}

struct Bytes {
  int64_t afterForward;  // activations kept for backward (and the output)
  int64_t peak;          // the most alive at once over forward and backward
};

Bytes measure(bool withRecompute) {
  auto& counter = CountingCpuAllocator::install();
  auto net = deepMlp();
  auto x = torch::randn({kBatch, kWidth});
  auto forward = [&] {
    return withRecompute ? recomputeSequential(net, kSegments, x) : net->forward(x);
  };
  forward().pow(2).mean().backward();  // allocates the gradients: not activations
  Bytes bytes{};
  for (int rep = 0; rep < 2; ++rep) {
    for (auto& p : net->parameters()) p.mutable_grad().zero_();
    const int64_t base = counter.live();
    counter.resetPeak();
    auto out = forward();
    bytes.afterForward = counter.live() - base;
    out.pow(2).mean().backward();
    bytes.peak = counter.peak() - base;
  }
  return bytes;
}

TEST(RecomputeMemory, SixtyFourBlocksInEightSegments) {
  const Bytes plain = measure(false), recomputed = measure(true);
  const double kept = static_cast<double>(recomputed.afterForward) / plain.afterForward;
  const double peak = static_cast<double>(recomputed.peak) / plain.peak;
  std::printf("after forward: %.2f MB plain, %.2f MB recomputed (%.3fx); peak %.2f MB plain, "
              "%.2f MB recomputed (%.3fx)\n",
              plain.afterForward / 1e6, recomputed.afterForward / 1e6, kept, plain.peak / 1e6,
              recomputed.peak / 1e6, peak);
  // 64 blocks keep two activations each (LayerNorm's input, tanh's output); 8 segments keep
  // their inputs, and the backward holds one segment's activations at a time.
  EXPECT_GT(plain.afterForward, 2 * kBlocks * kBatch * kWidth * 4);
  EXPECT_LE(kept, 0.15);
  EXPECT_LE(peak, 0.30);
}

}  // namespace
}  // namespace dtrain::testing::recompute_memory_test
