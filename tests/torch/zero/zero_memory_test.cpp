// Model-state memory per rank, measured from the tensors' storages (not from the formula), against
// ZeRO's formula for float32 Adam: stage 1 holds 8 + 8/N bytes per parameter, stage 2 4 + 12/N.
// Also what noSync() accumulation costs at stage 2 (full gradients until the synchronising
// backward) and that stage 2's bucket memory stays a few units.
#include <gtest/gtest.h>

#include <algorithm>

#include "zero_support.h"

namespace dtrain::testing::zero_memory_test {
namespace {

// Bytes of memory the tensors cover, each byte once (views and tensors over one buffer overlap).
size_t coveredBytes(const std::vector<torch::Tensor>& tensors) {
  std::vector<std::pair<uintptr_t, uintptr_t>> spans;
  for (const auto& t : tensors) {
    if (!t.defined() || t.storage().nbytes() == 0) continue;
    auto begin = reinterpret_cast<uintptr_t>(t.storage().data());
    spans.emplace_back(begin, begin + t.storage().nbytes());
  }
  std::sort(spans.begin(), spans.end());
  size_t bytes = 0;
  uintptr_t reached = 0;
  for (const auto& [b, e] : spans) {
    const uintptr_t from = std::max(b, reached);
    if (e > from) bytes += e - from;
    reached = std::max(reached, e);
  }
  return bytes;
}

struct Measured {
  size_t params = 0, grads = 0, state = 0;
  size_t total() const { return params + grads + state; }
};

Measured measure(torch::nn::Module& net, ShardedOptimizer& optimizer) {
  Measured m;
  std::vector<torch::Tensor> params, grads, state;
  for (auto& p : net.parameters()) {
    params.push_back(p);
    grads.push_back(p.grad());
  }
  for (auto& g : optimizer.param_groups()) {
    for (auto& p : g.params()) grads.push_back(p.grad());
  }
  for (const auto& record : optimizer.shardRecords()) {
    for (const auto& [field, t] : record.state) state.push_back(t);
  }
  m.params = coveredBytes(params);
  m.grads = coveredBytes(grads);
  m.state = coveredBytes(state);
  return m;
}

class ZeroMemory : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(ZeroMemory, ModelStateBytesFromStoragesMatchTheFormula) {
  const auto [world, stage] = GetParam();
  auto threads = ThreadWorld::create(world);
  threads->run([&, world = world, stage = stage](int rank) {
    auto group = threadGroup(*threads, rank);
    torch::manual_seed(1);
    Mlp net(64, 256, 64);  // 98,880 parameters
    DistributedDataParallel<Mlp> ddp(net, group);
    ZeroOptions zo;
    zo.stage = stage;
    zo.firstUnitBytes = 64 << 10;
    zo.unitBytes = 128 << 10;
    ShardedOptimizer adam(
        ddp, optimizerFactory<torch::optim::Adam>(torch::optim::AdamOptions(1e-3)), zo);
    for (int s = 0; s < 2; ++s) {
      adam.zero_grad();
      torch::manual_seed(10 + s);
      torch::mse_loss(ddp(torch::randn({4, 64})), torch::randn({4, 64})).backward();
      adam.step();
    }
    const double psi = 98880;
    const double n = world;
    const double formula = stage == 1 ? (8 + 8 / n) * psi : (4 + 12 / n) * psi;
    const Measured m = measure(*net, adam);
    EXPECT_NEAR(m.total(), formula, 0.02 * formula)
        << "rank " << rank << ": parameters " << m.params << ", gradients " << m.grads
        << ", optimizer state " << m.state;
    EXPECT_EQ(m.params, 4 * psi);
    const ZeroStats stats = adam.stats();
    EXPECT_NEAR(stats.memory.modelState(), m.total(), 0.002 * m.total())
        << "stats() counts what the storages hold (padding aside)";
    EXPECT_EQ(stats.memory.masterWeights, 0u) << "float32 parameters are stepped in place";
    EXPECT_EQ(stats.memory.looseGradients, 0u);
    if (stage == 2) {
      // Buckets: at most bucketsInFlight units' worth, the largest unit being ~128 KiB here.
      EXPECT_GT(stats.memory.buckets, 0u);
      EXPECT_LE(stats.memory.buckets, static_cast<size_t>(zo.bucketsInFlight + 1) * (300 << 10));
    } else {
      EXPECT_EQ(stats.memory.buckets, 0u);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, ZeroMemory,
                         ::testing::Values(std::make_pair(2, 1), std::make_pair(2, 2),
                                           std::make_pair(4, 1), std::make_pair(4, 2)),
                         [](const auto& info) {
                           return "world" + std::to_string(info.param.first) + "stage" +
                                  std::to_string(info.param.second);
                         });

// Stages 2 and 3 free a shard's gradient at zero_grad() -- the ShardedOptimizer's or libtorch's
// own through an Optimizer& -- and make it again at the next reduce-scatter (FSDP2's sharded
// gradients under set_to_none): between zero_grad() and backward a rank holds no gradient. A
// float32 reduce-scatter of bfloat16 units (reduceDtype) writes the master's float32 gradient
// itself, no second block: bfloat16 Adam then holds 2 + 16/N bytes per parameter after backward
// (parameters 2, the shard's gradient 4/N, master 4/N, Adam 8/N).
TEST(ZeroMemory, ShardGradientsLiveFromTheFirstReduceScatterToZeroGrad) {
  constexpr int kWorld = 2;
  auto threads = ThreadWorld::create(kWorld);
  threads->run([&](int rank) {
    auto group = threadGroup(*threads, rank);
    torch::manual_seed(1);
    Mlp net(64, 256, 64);  // 98,880 parameters
    net->to(torch::kBFloat16);
    DistributedDataParallel<Mlp> ddp(net, group);
    ZeroOptions zo;
    zo.stage = 2;
    zo.reduceDtype = torch::kFloat32;
    zo.firstUnitBytes = 64 << 10;
    zo.unitBytes = 128 << 10;
    ShardedOptimizer adam(
        ddp, optimizerFactory<torch::optim::Adam>(torch::optim::AdamOptions(1e-3)), zo);
    const double psi = 98880;
    const double shardGradient = 4 * psi / kWorld;
    const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16);
    std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> last;  // the last backward's
    for (int s = 0; s < 3; ++s) {
      if (s == 1) {
        static_cast<torch::optim::Optimizer&>(adam).zero_grad();  // libtorch's own, set_to_none
      } else {
        adam.zero_grad();
      }
      EXPECT_EQ(adam.stats().memory.gradients, 0u) << "step " << s << ": freed by zero_grad()";
      for (const auto& weak : last) {
        EXPECT_TRUE(weak.expired()) << "step " << s << ": a gradient's memory outlived zero_grad()";
      }
      last.clear();
      torch::manual_seed(10 + s);
      torch::mse_loss(ddp(torch::randn({4, 64}, bf16)), torch::randn({4, 64}, bf16)).backward();
      const dtrain::ZeroMemory after = adam.stats().memory;
      EXPECT_NEAR(static_cast<double>(after.gradients), shardGradient, 4 * 16)
          << "step " << s << ": the float32 shard's gradient once (padding aside)";
      EXPECT_EQ(after.looseGradients, 0u);
      for (auto& g : adam.param_groups()) {
        for (auto& p : g.params()) {
          if (p.grad().defined()) last.emplace_back(p.grad().storage().getWeakStorageImpl());
        }
      }
      EXPECT_FALSE(last.empty());
      adam.step();
    }
    const Measured m = measure(*net, adam);
    std::vector<torch::Tensor> masters;  // what the optimizer steps: the float32 master shards
    for (auto& g : adam.param_groups()) {
      for (auto& p : g.params()) masters.push_back(p);
    }
    const size_t master = coveredBytes(masters);
    const double formula = (2 + 16.0 / kWorld) * psi;
    EXPECT_NEAR(m.total() + master, formula, 0.02 * formula)
        << "rank " << rank << ": parameters " << m.params << ", gradients " << m.grads
        << ", master " << master << ", optimizer state " << m.state
        << " (the master's own gradient would add " << shardGradient << ")";
    EXPECT_NEAR(m.grads, shardGradient, 4 * 16) << "the master's gradient is the shard's";
    EXPECT_NEAR(adam.stats().memory.modelState(), m.total() + master, 0.002 * m.total());
  });
}

// Accumulation::Local (Note [Sharded backward]): under noSync() stage 2 keeps the full gradients
// in the parameters' .grad, no communication, until the synchronising backward moves them into
// buckets and frees them.
TEST(ZeroMemory, LocalAccumulationHoldsFullGradientsUntilTheSynchronisingBackward) {
  auto threads = ThreadWorld::create(2);
  threads->run([&](int rank) {
    auto group = threadGroup(*threads, rank);
    torch::manual_seed(1);
    Mlp net(64, 256, 64);
    DistributedDataParallel<Mlp> ddp(net, group);
    ZeroOptions zo;
    zo.stage = 2;
    zo.accumulation = ZeroOptions::Accumulation::Local;
    ShardedOptimizer sgd(ddp, optimizerFactory<torch::optim::SGD>(torch::optim::SGDOptions(0.1)),
                         zo);
    const auto issued = threads->issued(rank);
    {
      auto guard = ddp.noSync();
      torch::mse_loss(ddp(torch::randn({4, 64})), torch::randn({4, 64})).backward();
    }
    EXPECT_EQ(threads->issued(rank), issued) << "no collective under noSync()";
    EXPECT_EQ(sgd.stats().memory.looseGradients, 98880u * 4);
    torch::mse_loss(ddp(torch::randn({4, 64})), torch::randn({4, 64})).backward();
    EXPECT_EQ(sgd.stats().memory.looseGradients, 0u);
    for (auto& p : net->parameters()) {
      // Note [Zeroed gradients]: a placeholder of zeros over one element, no memory of the size.
      ASSERT_TRUE(p.grad().defined());
      EXPECT_EQ(p.grad().storage().nbytes(), sizeof(float));
      EXPECT_EQ(p.grad().count_nonzero().item<int64_t>(), 0);
    }
    sgd.step();
  });
}

// The default accumulation (DeepSpeed's ZeRO-2 with gradient accumulation steps): every
// micro-batch's backward under noSync() reduce-scatters into the shard's gradient, so after eight
// micro-batches a rank holds its shard's gradient only -- 4 / N bytes per parameter, padding
// aside -- and nothing full-size outside the buckets; the step it makes is the Local one's.
TEST(ZeroMemory, ReduceScatteredAccumulationHoldsTheShardsGradientOnly) {
  {
    const int stage = 2;  // stage 3's accumulation: ZeroStage3Ranks.NoSyncAccumulationMatchesDdp
    auto threads = ThreadWorld::create(2);
    std::vector<std::vector<torch::Tensor>> after(2);
    // The ranks are threads of one process, which has one random generator: the data of every
    // rank and micro-batch is drawn before they start, and DDP gives every rank rank 0's model.
    torch::manual_seed(10);
    std::vector<std::vector<torch::Tensor>> data(2);
    for (auto& rankData : data) {
      for (int i = 0; i < 18; ++i) rankData.push_back(torch::randn({4, 64}));
    }
    for (bool local : {false, true}) {
      torch::manual_seed(1);
      Mlp first(64, 256, 64);
      threads->run([&](int rank) {
        auto group = threadGroup(*threads, rank);
        Mlp net = rank == 0 ? first : Mlp(64, 256, 64);
        DistributedDataParallel<Mlp> ddp(net, group);
        ZeroOptions zo;
        zo.stage = stage;
        if (local) zo.accumulation = ZeroOptions::Accumulation::Local;
        ShardedOptimizer sgd(
            ddp, optimizerFactory<torch::optim::SGD>(torch::optim::SGDOptions(0.1)), zo);
        auto& mine = data[static_cast<size_t>(rank)];
        for (int micro = 0; micro < 8; ++micro) {
          const auto issued = threads->issued(rank);
          {
            auto guard = ddp.noSync();
            torch::mse_loss(ddp(mine[2 * micro]), mine[2 * micro + 1]).backward();
          }
          if (local) continue;
          EXPECT_GT(threads->issued(rank), issued) << "each micro-batch reduce-scatters";
          const dtrain::ZeroMemory m = sgd.stats().memory;
          EXPECT_EQ(m.looseGradients, 0u);
          EXPECT_GT(m.gradients, 0u);
          EXPECT_LE(m.gradients, (98880u / 2 + 4 * 64) * 4) << "the shard's gradient only";
        }
        torch::mse_loss(ddp(mine[16]), mine[17]).backward();
        sgd.step();
        if (rank == 0) {
          for (auto& p : net->parameters()) after[local].push_back(p.detach().clone());
        }
      });
    }
    ASSERT_EQ(after[0].size(), after[1].size());
    for (size_t i = 0; i < after[0].size(); ++i) {
      EXPECT_TRUE(torch::allclose(after[0][i], after[1][i], 1e-5, 1e-6)) << "parameter " << i;
    }
  }
}

}  // namespace
}  // namespace dtrain::testing::zero_memory_test
