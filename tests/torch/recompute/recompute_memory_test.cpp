// Activation memory of dtrain::recompute, counted by a CPU allocator installed in front of
// libtorch's: a 64-block MLP in 8 recomputed segments against the same MLP run plainly; and a
// segment's incoming gradient freed inside its backward.
#include <gtest/gtest.h>

#include <cstdio>
#include <optional>

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

// The last node of a recomputed segment's backward: records whether the gradient the segment
// received (watched) is gone by the time the recomputed graph reaches it.
c10::weak_intrusive_ptr<c10::StorageImpl> watched{c10::intrusive_ptr<c10::StorageImpl>()};
std::optional<bool> watchedGoneAtTheBottom;

struct Bottom : torch::autograd::Function<Bottom> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) {
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    watchedGoneAtTheBottom = watched.expired();
    return grads;
  }
};

// Note [Incoming gradients] in recompute.cpp: a recomputed segment's incoming gradient (a block
// output's, 25.7 MB in ResNet-50) is freed as soon as the recomputed graph's first nodes are done
// with it, not held until the segment's whole backward returns. The segment is relu(bottom(x) * 2):
// relu's backward makes a new tensor from the incoming one, so by the time the bottom node runs
// only a holder of the incoming gradient could keep it alive.
TEST(RecomputeMemory, TheIncomingGradientFreesBeforeTheSegmentsBackwardEnds) {
  auto x = torch::randn({256, 64}, torch::requires_grad());
  auto fn = [](const at::Tensor& in) { return torch::relu(Bottom::apply(in) * 2); };
  for (bool withRecompute : {false, true}) {
    watchedGoneAtTheBottom.reset();
    auto y = withRecompute ? recompute(RecomputeSegment(), fn, x) : fn(x);
    // The incoming gradient is (y * 3).sum()'s, made by MulBackward and held by autograd only.
    y.register_hook([](const at::Tensor& g) { watched = g.storage().getWeakStorageImpl(); });
    (y * 3).sum().backward();
    ASSERT_TRUE(watchedGoneAtTheBottom.has_value());
    EXPECT_TRUE(*watchedGoneAtTheBottom)
        << (withRecompute ? "recomputed" : "plain")
        << ": the segment's incoming gradient was still alive at the bottom of its backward";
    EXPECT_TRUE(torch::allclose(x.grad(), 6 * (x > 0).to(torch::kFloat)));
    x.mutable_grad().reset();
  }
}

}  // namespace
}  // namespace dtrain::testing::recompute_memory_test
