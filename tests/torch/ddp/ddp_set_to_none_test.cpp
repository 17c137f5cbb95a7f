// DDP with gradients reset to undefined between steps: zero_grad(set_to_none = true), what
// libtorch 2.x's Optimizer::zero_grad() and Module::zero_grad() do by default. With
// gradientAsBucketView, autograd then creates every gradient anew; the reducer copies it into its
// bucket slot once and points .grad back at the slot (Note [Gradients in the buckets] in
// runtime/torch/ddp/reducer.cpp). These tests reset through Module::zero_grad(true).
#include <cstring>

#include <gtest/gtest.h>

#include "ddp_support.h"

namespace dtrain::testing::ddp_set_to_none_test {
namespace {

constexpr int kWorld = 2;
constexpr int kSteps = 3;

// The MLP's gradients in three buckets.
DdpOptions smallBuckets() {
  DdpOptions o;
  o.firstBucketBytes = 256;
  o.bucketBytes = 1024;
  o.gradientAsBucketView = true;
  return o;
}

bool bitwiseEqual(const torch::Tensor& a, const torch::Tensor& b) {
  auto x = a.contiguous();
  auto y = b.contiguous();
  return x.sizes() == y.sizes() && x.scalar_type() == y.scalar_type() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

// Every rank trains on the same batches, so DDP's average equals each rank's own gradient bit for
// bit ((g + g) / 2 == g): after each backward every .grad is compared bitwise with the gradient an
// unwrapped copy of the model computes, and its address with the one it had after the first step.
// `resetAll`: every parameter's gradient is reset to undefined before each step; otherwise only
// fc1's, while fc2's and fc3's are zeroed in place, so one backward mixes gradients autograd
// creates anew with gradients it adds into their slots.
void checkSetToNone(bool resetAll) {
  torch::manual_seed(resetAll ? 60 : 61);
  Mlp reference;
  auto nets = rankModels<Mlp>(reference, kWorld, [] { return Mlp(); });
  std::vector<torch::Tensor> inputs, targets;
  for (int s = 0; s < kSteps; ++s) {
    inputs.push_back(torch::randn({4, 8}));
    targets.push_back(torch::randn({4, 4}));
  }
  auto threads = ThreadWorld::create(kWorld);
  threads->run([&](int rank) {
    Mlp& net = nets[rank];
    DistributedDataParallel<Mlp> ddp(net, threadGroup(*threads, rank), smallBuckets());
    Mlp local;
    copyState(*net, *local);  // rank 0's parameters, as DDP's construction broadcast them
    auto sgd = makeSgd(ddp.parameters());
    auto localSgd = makeSgd(local->parameters());
    std::vector<void*> slots;
    for (int s = 0; s < kSteps; ++s) {
      if (resetAll) {
        net->zero_grad(/*set_to_none=*/true);
      } else {
        net->fc1->zero_grad(/*set_to_none=*/true);
        net->fc2->zero_grad(/*set_to_none=*/false);
        net->fc3->zero_grad(/*set_to_none=*/false);
      }
      local->zero_grad(/*set_to_none=*/true);
      EXPECT_FALSE(net->fc1->weight.grad().defined());
      mseLoss(ddp(inputs[s]), targets[s]).backward();
      mseLoss(local->forward(inputs[s]), targets[s]).backward();

      auto params = net->named_parameters();
      auto expected = local->named_parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        const auto& grad = params[i].value().grad();
        const auto& name = params[i].key();
        ASSERT_TRUE(grad.defined()) << "rank " << rank << " step " << s << ": " << name;
        EXPECT_TRUE(bitwiseEqual(grad, expected[name].grad()))
            << "rank " << rank << " step " << s << ": " << name << "'s gradient differs from an "
            << "unwrapped model's";
        if (s == 0) {
          slots.push_back(grad.data_ptr());
        } else {
          EXPECT_EQ(grad.data_ptr(), slots[i])
              << "rank " << rank << " step " << s << ": " << name << "'s .grad left its slot";
        }
      }
      // fc1.bias and fc1.weight are neighbours in one bucket: .grad is the bucket's memory, not
      // the tensor autograd created.
      auto& w = net->fc1->weight;
      auto& b = net->fc1->bias;
      EXPECT_EQ(static_cast<char*>(w.grad().data_ptr()),
                static_cast<char*>(b.grad().data_ptr()) + b.numel() * sizeof(float))
          << "rank " << rank << " step " << s;
      sgd.step();
      localSgd.step();
    }
  });
}

TEST(DdpSetToNone, NewGradientsLandInTheirSlotsWithTheUnwrappedModelsValues) {
  checkSetToNone(/*resetAll=*/true);
}

TEST(DdpSetToNone, ABucketMixingNewAndAccumulatedGradients) { checkSetToNone(/*resetAll=*/false); }

}  // namespace
}  // namespace dtrain::testing::ddp_set_to_none_test
