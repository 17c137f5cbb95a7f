// The torch facade on CUDA tensors (built only against a CUDA libtorch; skipped without a GPU):
// init() picks NCCL on cuda:0, collectives run in place, ordered with torch's current stream.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "dtrain/init.h"
#include "dtrain/nccl_communicator.h"

namespace dtrain {
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
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16, torch::kInt,
                     torch::kLong}) {
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

}  // namespace
}  // namespace dtrain
