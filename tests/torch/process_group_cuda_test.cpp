// The torch facade on CUDA tensors (built only against a CUDA libtorch; skipped without a GPU):
// init() picks NCCL on cuda:0, collectives run in place, ordered with torch's current stream;
// DistributedDataParallel on a CUDA module; a newcomer's settling (node loss and join) on CUDA.
// One GPU: world size 1, where the averaged gradient is the rank's own, so a plain copy of the
// model is the reference.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "dtrain/base/error.h"
#include "dtrain/base/store.h"
#include "dtrain/comm/nccl_communicator.h"
#include "dtrain/torch/ddp.h"
#include "dtrain/torch/distributed_sampler.h"
#include "dtrain/torch/init.h"
#include "dtrain/torch/training_state.h"

namespace dtrain::process_group_cuda_test {
namespace {

TEST(ProcessGroupCuda, InitPicksNcclAndReducesCudaTensorsInPlace) {
  if (comm::cudaDeviceCount() == 0 || !torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  InitOptions o;
  o.rank = 0;
  o.worldSize = 1;
  o.store = std::make_shared<store::HashStore>();
  auto pg = init(o);
  EXPECT_STREQ(pg->backend(), "nccl");
  EXPECT_EQ(pg->device(), c10::Device(c10::kCUDA, 0));
  for (auto dtype :
       {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16, torch::kInt, torch::kLong}) {
    auto opts = torch::TensorOptions().dtype(dtype).device(torch::kCUDA, 0);
    auto t = torch::arange(1000, opts).remainder(5).reshape({10, 100});
    auto expect = t.clone();
    pg->allreduce(t);
    EXPECT_TRUE(t.equal(expect)) << c10::toString(dtype);
    auto view = t.t();  // non-contiguous: copied, reduced, written back on the current stream
    pg->allreduce(view, ReduceOp::Max);
    EXPECT_TRUE(t.equal(expect));
  }
  auto big = torch::ones({1 << 22}, torch::device(torch::kCUDA));
  auto work = pg->allreduceAsync(big);
  work->wait();
  EXPECT_EQ(big.sum().item<float>(), static_cast<float>(1 << 22));
  auto cpu = torch::ones({2});
  EXPECT_THROW(pg->allreduce(cpu), InvalidArgument) << "a CPU tensor on an NCCL group";
  pg->shutdown();
}

// Conv + BatchNorm + Linear: parameters of several dtypes' worth of sizes, and buffers.
struct SmallCnnImpl : torch::nn::Module {
  SmallCnnImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)));
    bn = register_module("bn", torch::nn::BatchNorm2d(8));
    fc = register_module("fc", torch::nn::Linear(8 * 8 * 8, 5));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc(torch::relu(bn(conv(x))).flatten(1)); }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(SmallCnn);

std::shared_ptr<ProcessGroup> ncclGroupOfOne() {
  InitOptions o;
  o.rank = 0;
  o.worldSize = 1;
  o.store = std::make_shared<store::HashStore>();
  return init(o);
}

// Gradients of `micro` forward/backward passes of a plain copy and of a DDP-wrapped copy (the
// first micro - 1 under noSync), on the same CUDA batches.
void expectDdpMatchesPlainModel(const DdpOptions& options, int micro, double tolerance) {
  torch::manual_seed(11);
  SmallCnn plain;
  plain->to(torch::kCUDA);
  SmallCnn wrapped;
  wrapped->to(torch::kCUDA);
  {
    torch::NoGradGuard noGrad;
    auto from = plain->parameters();
    auto to = wrapped->parameters();
    for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
  }
  auto pg = ncclGroupOfOne();
  DistributedDataParallel<SmallCnn> ddp(wrapped, pg, options);
  for (int m = 0; m < micro; ++m) {
    auto x = torch::randn({4, 3, 8, 8}, torch::kCUDA);
    auto y = torch::randint(0, 5, {4},
                            torch::TensorOptions().dtype(torch::kLong).device(torch::kCUDA));
    torch::nn::functional::cross_entropy(plain->forward(x), y).backward();
    if (m + 1 < micro) {
      auto guard = ddp.noSync();
      torch::nn::functional::cross_entropy(ddp(x), y).backward();
    } else {
      torch::nn::functional::cross_entropy(ddp(x), y).backward();
    }
  }
  auto expected = plain->parameters();
  auto actual = wrapped->parameters();
  ASSERT_EQ(expected.size(), actual.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_TRUE(actual[i].grad().defined()) << "parameter " << i << " has no gradient";
    EXPECT_TRUE(actual[i].grad().is_cuda()) << "parameter " << i;
    EXPECT_TRUE(torch::allclose(actual[i].grad(), expected[i].grad(), tolerance, tolerance))
        << "parameter " << i << ": largest difference "
        << (actual[i].grad() - expected[i].grad()).abs().max().item<double>();
  }
  EXPECT_EQ(ddp.lastIteration().iteration, 1u);
  pg->shutdown();
}

TEST(DdpCuda, GradientsMatchThePlainModel) {
  if (comm::cudaDeviceCount() == 0 || !torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  expectDdpMatchesPlainModel(DdpOptions{}, 1, 1e-6);
}

TEST(DdpCuda, GradientsAsBucketViewsAndAccumulationUnderNoSync) {
  if (comm::cudaDeviceCount() == 0 || !torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  DdpOptions options;
  options.gradientAsBucketView = true;
  options.firstBucketBytes = 1024;  // several buckets
  expectDdpMatchesPlainModel(options, 3, 1e-6);
}

TEST(DdpCuda, HalfPrecisionCompressionStaysClose) {
  if (comm::cudaDeviceCount() == 0 || !torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  DdpOptions options;
  options.compression = GradientCompression::Fp16;
  expectDdpMatchesPlainModel(options, 1, 2e-3);
}

// A rank taken into a running round on a GPU (`launch --on-node-join live`; world size 1: no
// member but itself). Its first tryStep settles -- the allgather of the ranks' steps, the sampler's
// position broadcast -- and those host values travel on the group's device: an NCCL group takes
// no host tensor. Then a step trains on CUDA.
TEST(NodeJoinCuda, ANewcomersSettlingCarriesItsHostValuesOnTheGpu) {
  if (comm::cudaDeviceCount() == 0 || !torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  InitOptions o;
  o.rank = 0;
  o.worldSize = 1;
  o.localRank = 0;
  o.store = std::make_shared<store::HashStore>();
  o.reformOnNodeLoss = true;
  o.nodeId = "0";
  o.joinEpoch = 1;
  auto pg = init(o);
  ASSERT_TRUE(pg->joinPending());
  EXPECT_EQ(pg->device(), c10::Device(c10::kCUDA, 0));
  torch::nn::Linear net(4, 2);
  net->to(pg->device());
  DistributedDataParallel<torch::nn::Linear> ddp(net, pg);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  DistributedSampler sampler(16, 1, 0);
  TrainingState state(pg);
  state.addModule("model", net.ptr());
  state.addOptimizer("sgd", sgd);
  state.addSampler("data", sampler);
  auto work = [&] {
    sgd.zero_grad();
    auto batch = sampler.next(4).value();
    ddp(torch::ones({static_cast<int64_t>(batch.size()), 4}, torch::device(pg->device())))
        .sum()
        .backward();
  };
  state.beginStep(0);
  EXPECT_FALSE(state.tryStep(work));  // the settling
  EXPECT_FALSE(pg->joinPending());
  EXPECT_EQ(state.currentStep(), 0);
  state.beginStep(0);
  EXPECT_TRUE(state.tryStep(work));
  ASSERT_TRUE(net->weight.grad().defined());
  EXPECT_TRUE(net->weight.grad().is_cuda());
  pg->shutdown();
}

}  // namespace
}  // namespace dtrain::process_group_cuda_test
