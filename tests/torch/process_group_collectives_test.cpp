// ProcessGroup over Gloo with ranks as threads: every dtype and op on tensors, non-contiguous
// tensors in place, async work keeping its tensors alive, shapes in the collective check.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <iostream>
#include <thread>

#include <torch/torch.h>

#include "dtrain/base/error.h"
#include "dtrain/comm/gloo_communicator.h"
#include "dtrain/torch/process_group.h"
#include "process_group_support.h"

namespace dtrain::process_group_collectives_test {
namespace {

std::vector<std::shared_ptr<ProcessGroup>> makeGroups(int n, bool check = false) {
  return testing::glooGroups(n, [&](comm::GlooOptions& o) { o.checkCollectives = check; });
}

// Rank r contributes r + (i % 5) at flat index i.
at::Tensor contribution(int rank, at::IntArrayRef shape, at::ScalarType dtype) {
  int64_t numel = 1;
  for (auto d : shape) numel *= d;
  return (torch::arange(numel, torch::kLong).remainder(5) + rank).to(dtype).reshape(shape);
}

at::Tensor expected(int n, ReduceOp op, at::IntArrayRef shape, at::ScalarType dtype) {
  auto m = contribution(0, shape, torch::kDouble);
  at::Tensor e;
  switch (op) {
    case ReduceOp::Sum: e = m * n + n * (n - 1) / 2.0; break;
    case ReduceOp::Avg: e = (m * n + n * (n - 1) / 2.0) / n; break;
    case ReduceOp::Max: e = m + (n - 1); break;
    case ReduceOp::Min: e = m; break;
  }
  if (!at::isFloatingType(dtype)) e = e.trunc();
  return e.to(dtype);
}

// dtrain's Gloo backend in a process whose libtorch carries a Gloo of its own (pip's libtorch
// exports one): after torch ops, a small allreduce and one of
// 4 MiB (the ring, in segments) give exact sums. Linked the usual way, dtrain's Gloo code bound to
// libtorch's Gloo and crashed here; see Note [One Gloo per process] in
// runtime/comm/gloo_loader.cpp.
TEST(ProcessGroupCollectives, GlooRunsBesideTheGlooInsideLibtorch) {
  if (!comm::glooAvailable()) GTEST_SKIP() << "built without Gloo";
  const auto product = torch::ones({64, 64}).matmul(torch::ones({64, 64}));
  ASSERT_EQ(product[0][0].item<float>(), 64.0f);
  std::cout << "libtorch's own Gloo is "
            << (::dlsym(RTLD_DEFAULT, "_ZN4gloo7Context8nextSlotEi") ? "in" : "not in")
            << " this process\n";
  {
    comm::GlooOptions one;
    one.store = std::make_shared<store::HashStore>();
    one.checkCollectivesFromEnv = false;
    try {
      comm::createGlooCommunicator(one);
    } catch (const Error& e) {
      FAIL() << e.what();
    }
  }
  const int n = 2;
  auto pgs = makeGroups(n);
  testing::runRanks(n, [&](int r) {
    for (int64_t numel : {int64_t{17}, int64_t{1} << 20}) {
      auto t = contribution(r, {numel}, torch::kFloat);
      pgs[r]->allreduce(t);
      EXPECT_TRUE(t.equal(expected(n, ReduceOp::Sum, {numel}, torch::kFloat)))
          << "rank " << r << ", " << numel << " floats";
    }
  });
}

TEST(ProcessGroupCollectives, AllreduceEveryDtypeAndOpInPlace) {
  if (!comm::glooAvailable()) GTEST_SKIP() << "built without Gloo";
  const int n = 3;
  auto pgs = makeGroups(n);
  for (auto dtype :
       {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16, torch::kInt, torch::kLong}) {
    for (auto op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
      testing::runRanks(n, [&](int r) {
        auto t = contribution(r, {7, 13}, dtype);
        void* before = t.data_ptr();
        pgs[r]->allreduce(t, op);
        EXPECT_EQ(t.data_ptr(), before) << "in place";
        EXPECT_TRUE(t.equal(expected(n, op, {7, 13}, dtype)))
            << c10::toString(dtype) << " " << comm::reduceOpName(op) << "\n"
            << t;
      });
    }
  }
}

TEST(ProcessGroupCollectives, NonContiguousTensorsAreWrittenBackInPlace) {
  if (!comm::glooAvailable()) GTEST_SKIP() << "built without Gloo";
  const int n = 2;
  auto pgs = makeGroups(n);
  testing::runRanks(n, [&](int r) {
    // A transposed view and a strided slice of a bigger tensor: only the view's elements change.
    auto base = contribution(r, {6, 10}, torch::kFloat);
    auto view = base.t();
    ASSERT_FALSE(view.is_contiguous());
    pgs[r]->allreduce(view);
    EXPECT_TRUE(base.equal(expected(n, ReduceOp::Sum, {6, 10}, torch::kFloat)));

    auto big = torch::full({8, 8}, 100.0 + r, torch::kDouble);
    auto slice = big.index({torch::indexing::Slice(), torch::indexing::Slice(0, 8, 3)});
    pgs[r]->allreduce(slice, ReduceOp::Max);
    EXPECT_TRUE(slice.eq(101.0).all().item<bool>());
    EXPECT_EQ(big[0][1].item<double>(), 100.0 + r) << "elements outside the slice untouched";

    auto b = torch::full({4, 4}, static_cast<int64_t>(r == 1 ? 42 : -1), torch::kLong).t();
    pgs[r]->broadcast(b, 1);
    EXPECT_TRUE(b.eq(42).all().item<bool>());
  });
}

TEST(ProcessGroupCollectives, AsyncWorkKeepsItsTensorAlive) {
  // Only weak references are kept here: if the work let its tensor go, the tensor would be freed
  // (and the collective would write into freed memory), and `expired()` says so.
  if (!comm::glooAvailable()) GTEST_SKIP() << "built without Gloo";
  const int n = 2;
  auto pgs = makeGroups(n);
  using WeakTensor = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
  testing::runRanks(n, [&](int r) {
    std::vector<std::shared_ptr<comm::Work>> works;
    std::vector<WeakTensor> weak;
    for (int k = 0; k < 20; ++k) {
      auto t = torch::full({1000}, static_cast<float>(k + r));
      weak.emplace_back(t.getIntrusivePtr());
      works.push_back(pgs[r]->allreduceAsync(t));
    }  // the `t`s are gone here; only the works hold them
    for (int k = 0; k < 20; ++k) {
      ASSERT_FALSE(weak[k].expired()) << "work " << k << " let its tensor go before wait()";
      works[k]->wait();
      at::Tensor t(weak[k].lock());
      EXPECT_TRUE(t.eq(static_cast<float>(2 * k + 1)).all().item<bool>()) << k;
    }
    works.clear();
    for (int k = 0; k < 20; ++k)
      EXPECT_TRUE(weak[k].expired()) << "work " << k << " leaked its tensor";
  });
}

TEST(ProcessGroupCollectives, WorkIsWaitedOnTheCurrentStream) {
  // ProcessGroup's works (and its synchronous calls) wait through waitOnStream() with torch's
  // stream current at wait time, as c10d does (comm.h); on the CPU that stream is null.
  auto world = testing::ThreadWorld::create(2);
  testing::runRanks(2, [&](int r) {
    auto recorder = std::make_shared<testing::WaitRecordingCommunicator>(world->communicator(r));
    ProcessGroup pg(recorder, r, c10::kCPU);
    auto t = torch::ones({8});
    pg.allreduceAsync(t)->wait();
    pg.allreduce(t);
    auto b = torch::ones({4, 4}).t();  // non-contiguous: waited on, then written back
    pg.broadcast(b, 0);
    EXPECT_EQ(recorder->counts().wait, 0) << "waited on the stream of the issue";
    EXPECT_EQ(recorder->counts().waitOnStream, 3);
    EXPECT_TRUE(t.eq(4).all().item<bool>());
  });
}

TEST(ProcessGroupCollectives, BoolSumIsALogicalOr) {
  // Bool travels as uint8: a plain Sum would leave 2 in bool memory (not a valid bool). Sum is
  // reduced as Max, as c10d does; Avg is refused.
  if (!comm::glooAvailable()) GTEST_SKIP() << "built without Gloo";
  const int n = 3;
  auto pgs = makeGroups(n);
  testing::runRanks(n, [&](int r) {
    auto t = torch::tensor({true, r == 1, false});
    pgs[r]->allreduce(t);
    auto bytes = t.view(torch::kUInt8);
    EXPECT_EQ(bytes[0].item<int>(), 1) << "three trues summed into one bool byte";
    EXPECT_EQ(bytes[1].item<int>(), 1);
    EXPECT_EQ(bytes[2].item<int>(), 0);
    auto all = torch::tensor({true, r != 0});
    pgs[r]->allreduce(all, ReduceOp::Min);
    EXPECT_EQ(all.view(torch::kUInt8)[0].item<int>(), 1);
    EXPECT_EQ(all.view(torch::kUInt8)[1].item<int>(), 0);
  });
  EXPECT_EQ(reduceOpFor(at::kBool, ReduceOp::Sum), ReduceOp::Max);
  EXPECT_EQ(reduceOpFor(at::kFloat, ReduceOp::Sum), ReduceOp::Sum);
  EXPECT_THROW(reduceOpFor(at::kBool, ReduceOp::Avg), InvalidArgument);
}

TEST(ProcessGroupCollectives, ATensorOnAnotherDeviceIsRefusedNamingBoth) {
  // A cuda:1 tensor must not reach a cuda:0 communicator (NCCL would read it on the wrong device).
  // The check is a pure function of the devices, so it runs without a GPU.
  auto message = [](c10::Device tensor, c10::Device group) {
    try {
      checkTensorDevice(tensor, group, "nccl", "allreduce");
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const c10::Device cuda0(c10::kCUDA, 0), cuda1(c10::kCUDA, 1), cpu(c10::kCPU);
  EXPECT_NE(message(cuda1, cuda0)
                .find("allreduce: the tensor is on cuda:1, but this nccl process "
                      "group works on cuda:0 tensors"),
            std::string::npos)
      << message(cuda1, cuda0);
  EXPECT_NE(message(cpu, cuda0).find("the tensor is on cpu"), std::string::npos);
  EXPECT_EQ(message(cuda0, cuda0), "");
  EXPECT_EQ(message(cpu, cpu), "");
  EXPECT_NE(message(cuda0, cpu), "");
}

TEST(ProcessGroupCollectives, AllgatherAndReduceScatter) {
  if (!comm::glooAvailable()) GTEST_SKIP() << "built without Gloo";
  const int n = 4;
  auto pgs = makeGroups(n);
  testing::runRanks(n, [&](int r) {
    auto in = torch::full({2, 3}, static_cast<int>(r), torch::kInt);
    auto all = pgs[r]->allgather(in);
    ASSERT_EQ(all.size(), static_cast<size_t>(n));
    for (int s = 0; s < n; ++s) EXPECT_TRUE(all[s].eq(s).all().item<bool>()) << s;

    auto input = torch::arange(n * 5, torch::kFloat) + r;  // block b holds 5b..5b+4 (+r)
    auto out = torch::empty({10}, torch::kFloat).index({torch::indexing::Slice(0, 10, 2)});
    ASSERT_FALSE(out.is_contiguous());
    pgs[r]->reduceScatter(out, input);
    auto want = (torch::arange(5, torch::kFloat) + 5 * r) * n + n * (n - 1) / 2;
    EXPECT_TRUE(out.equal(want)) << out;
  });
}

// Small host values (steps, lengths, headers) through any group: broadcastHost writes into the
// caller's tensor, allgatherHost returns host tensors; a tensor that is not on the host is refused
// (on a CUDA group they travel on its device: dtrain_gpu_torch_tests).
TEST(ProcessGroupCollectives, HostValuesComeBackIntoHostTensors) {
  if (!comm::glooAvailable()) GTEST_SKIP() << "built without Gloo";
  const int n = 3;
  auto pgs = makeGroups(n);
  testing::runRanks(n, [&](int r) {
    auto v = torch::full({2}, int64_t{10} * r, torch::kLong);
    const void* storage = v.data_ptr();
    pgs[r]->broadcastHost(v, 2);
    EXPECT_EQ(v.data_ptr(), storage);
    EXPECT_TRUE(v.equal(torch::full({2}, int64_t{20}, torch::kLong))) << v;
    auto all = pgs[r]->allgatherHost(torch::tensor({int64_t{r} + 1}));
    ASSERT_EQ(all.size(), static_cast<size_t>(n));
    for (int s = 0; s < n; ++s) {
      EXPECT_TRUE(all[s].device().is_cpu());
      EXPECT_EQ(all[s].item<int64_t>(), s + 1);
    }
    auto elsewhere = torch::empty({1}, torch::TensorOptions(torch::kLong).device(torch::kMeta));
    EXPECT_THROW(pgs[r]->allgatherHost(elsewhere), InvalidArgument);
    EXPECT_THROW(pgs[r]->broadcastHost(elsewhere, 0), InvalidArgument);
  });
}

TEST(ProcessGroupCollectives, ZeroElementTensors) {
  if (!comm::glooAvailable()) GTEST_SKIP() << "built without Gloo";
  const int n = 2;
  auto pgs = makeGroups(n);
  testing::runRanks(n, [&](int r) {
    auto t = torch::empty({0, 4});
    pgs[r]->allreduce(t);
    pgs[r]->broadcast(t, 0);
    EXPECT_EQ(pgs[r]->allgather(t).size(), 2u);
  });
}

TEST(ProcessGroupCollectives, TheCollectiveCheckNamesBothShapes) {
  if (!comm::glooAvailable()) GTEST_SKIP() << "built without Gloo";
  const int n = 2;
  auto pgs = makeGroups(n, /*check=*/true);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto t = r == 0 ? torch::ones({4, 8}) : torch::ones({8, 4});
      try {
        pgs[r]->allreduce(t);
      } catch (const InvalidArgument& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_NE(errors[0].find("this rank calls seq 0 allreduce(float32 [4, 8], sum); rank 1 calls "
                           "seq 0 allreduce(float32 [8, 4], sum)"),
            std::string::npos)
      << errors[0];
}

TEST(ProcessGroupCollectives, RejectsUnsupportedTensors) {
  if (!comm::glooAvailable()) GTEST_SKIP() << "built without Gloo";
  auto pgs = makeGroups(1);
  auto c = torch::ones({2}, torch::kComplexFloat);
  EXPECT_THROW(pgs[0]->allreduce(c), InvalidArgument);
  at::Tensor undefined;
  EXPECT_THROW(pgs[0]->allreduce(undefined), InvalidArgument);
}

}  // namespace
}  // namespace dtrain::process_group_collectives_test
