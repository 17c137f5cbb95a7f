// ZeRO stage 3 (dtrain/torch/fully_shard.h), ranks as threads: the units' layout (a pure
// function), marked modules keeping their parameter names, training against plain DDP with
// AdamW, and the parameters of marked modules freed between uses.
#include <gtest/gtest.h>

#include "dtrain/torch/fully_shard.h"
#include "zero_expect.h"

namespace dtrain::testing {
namespace {

TEST(ZeroLayoutUnits, OneUnitPerGroupAndDtypeInParameterOrder) {
  // Keys 0 (float32) and 1 (bfloat16): group 0 mixes them, group 1 is float32 only.
  const std::vector<ShardInput> params = {{5, 4, 0}, {3, 2, 1}, {4, 4, 0}, {7, 4, 0}, {2, 2, 1}};
  const ShardLayout layout = layoutUnits(params, {{3, 0, 1, 4}, {2}}, 2);
  ASSERT_EQ(layout.units.size(), 3u);
  EXPECT_EQ(layout.units[0].params, (std::vector<size_t>{0, 3}));  // key of 3 first, then sorted
  EXPECT_EQ(layout.units[0].offsets, (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(layout.units[0].numel, 12);
  EXPECT_EQ(layout.units[1].params, (std::vector<size_t>{1, 4}));
  EXPECT_EQ(layout.units[1].key, 1);
  EXPECT_EQ(layout.units[1].elementSize, 2u);
  EXPECT_EQ(layout.units[1].shardNumel, 3);  // 5 elements on 2 ranks: one of padding
  EXPECT_EQ(layout.units[2].params, (std::vector<size_t>{2}));
  EXPECT_EQ(layout.padding(), 1);
}

TEST(ZeroLayoutUnits, EveryParameterInExactlyOneGroup) {
  const std::vector<ShardInput> params = {{5, 4, 0}, {3, 4, 0}};
  EXPECT_THROW((layoutUnits(params, {{0}}, 2)), InvalidArgument);
  EXPECT_THROW((layoutUnits(params, {{0, 1}, {1}}, 2)), InvalidArgument);
  EXPECT_THROW((layoutUnits(params, {{0, 2}}, 2)), InvalidArgument);
}

// Four marked layers (their Tanh children marked too, with nothing to shard), and a head
// outside every marked module: the root's unit. Sizes 128, 272, 187 and 108 elements: padding
// at 2 ranks.
struct Zero3NetImpl : torch::nn::Module {
  Zero3NetImpl() {
    body = register_module("body", shardEveryChild(torch::nn::Sequential(
                                       torch::nn::Linear(7, 16), torch::nn::Tanh(),
                                       torch::nn::Linear(16, 16), torch::nn::Tanh(),
                                       torch::nn::Linear(16, 11), torch::nn::Tanh(),
                                       torch::nn::Linear(11, 9))));
    head = register_module("head", torch::nn::Linear(9, 5));
  }
  torch::Tensor forward(const torch::Tensor& x) { return head(body->forward(x)); }
  torch::nn::Sequential body{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Zero3Net);

TEST(ZeroShardedUnit, KeepsTheModulesParameterNames) {
  torch::nn::Sequential plain(torch::nn::Linear(3, 4), torch::nn::ReLU(), torch::nn::Linear(4, 2));
  torch::nn::Sequential marked = shardEveryChild(plain);
  const auto want = plain->named_parameters();
  const auto got = marked->named_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (const auto& p : want) {
    ASSERT_TRUE(got.contains(p.key())) << p.key();
    EXPECT_TRUE(got[p.key()].is_same(p.value())) << p.key() << ": shared, not copied";
  }
  EXPECT_TRUE(torch::equal(marked->forward(torch::ones({2, 3})), plain->forward(torch::ones({2, 3}))));
}

size_t storageBytes(torch::nn::Module& module) {
  size_t bytes = 0;
  for (const auto& p : module.parameters()) bytes += p.storage().nbytes();
  return bytes;
}

struct Zero3Result {
  std::vector<std::map<std::string, torch::Tensor>> params;  // by rank
  // Rank 0, step 0: bytes of the marked modules' parameter storages once forward has returned,
  // and once backward has.
  size_t markedAfterForward = 1;
  size_t markedAfterBackward = 1;
  // Rank 0, after the last step: bytes of the marked modules' parameter storages, and of the
  // head's one storage (its unit's: weight and bias are views of it).
  size_t markedBytes = 0;
  size_t headBytes = 0;
};

// `stage` 0: DDP with torch::optim::AdamW; 3: a stage-3 ShardedOptimizer over the same factory.
Zero3Result trainZero3(int world, int stage, int steps) {
  Zero3Result result;
  result.params.resize(static_cast<size_t>(world));
  ZeroRun run;
  run.world = world;
  auto threads = ThreadWorld::create(world);
  threads->run([&](int rank) {
    auto group = threadGroup(*threads, rank);
    Zero3Net net = buildSeeded(run.seed, [] { return Zero3Net(); });
    DistributedDataParallel<Zero3Net> ddp(net, group);
    OptimizerFactory factory = factoryFor("adamw");
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    ShardedOptimizer* sharded = nullptr;
    if (stage == 0) {
      optimizer = factory.make({torch::optim::OptimizerParamGroup(ddp.parameters())});
    } else {
      ZeroOptions zo;
      zo.stage = stage;
      auto owned = std::make_unique<ShardedOptimizer>(ddp, factory, zo);
      sharded = owned.get();
      optimizer = std::move(owned);
    }
    for (int s = 0; s < steps; ++s) {
      optimizer->zero_grad();
      auto [x, y] = wholeBatch(run, s, 0, 7, 5);
      auto loss = torch::mse_loss(ddp(shard(x, rank, world)), shard(y, rank, world));
      if (s == 0 && rank == 0 && sharded) result.markedAfterForward = storageBytes(*net->body);
      loss.backward();
      if (s == 0 && rank == 0 && sharded) result.markedAfterBackward = storageBytes(*net->body);
      optimizer->step();
    }
    auto& mine = result.params[static_cast<size_t>(rank)];
    if (sharded) {
      if (rank == 0) {
        result.markedBytes = storageBytes(*net->body);
        result.headBytes = net->head->weight.storage().nbytes();  // its bias shares it
      }
      for (auto& [name, t] : gatherFullParameters(*sharded)) mine[name] = t;
    } else {
      for (const auto& p : net->named_parameters()) mine[p.key()] = p.value().detach().clone();
    }
  });
  return result;
}

TEST(ZeroStage3, AdamWMatchesDdpAtTwoRanks) {
  const Zero3Result ddp = trainZero3(2, 0, 30);
  const Zero3Result zero = trainZero3(2, 3, 30);
  ZeroResult want, got;
  want.params = ddp.params;
  got.params = zero.params;
  ASSERT_EQ(got.params[0].size(), want.params[0].size());
  expectRanksBitwiseEqual(got);
  expectClose(got, want, 1e-5);
  // Forward frees each marked layer after it ran, backward once its gradients were in, and
  // between steps they hold nothing in full; the head (the root's unit) stays full.
  EXPECT_EQ(zero.markedAfterForward, 0u);
  EXPECT_EQ(zero.markedAfterBackward, 0u);
  EXPECT_EQ(zero.markedBytes, 0u);
  EXPECT_EQ(zero.headBytes, (9 * 5 + 5) * sizeof(float));
}

// Not built yet: a noSync() backward would leave the units it gathers in full.
TEST(ZeroStage3, RefusesNoSyncForNow) {
  auto threads = ThreadWorld::create(2);
  threads->run([&](int rank) {
    Zero3Net net = buildSeeded(3, [] { return Zero3Net(); });
    DistributedDataParallel<Zero3Net> ddp(net, threadGroup(*threads, rank));
    ZeroOptions zo;
    zo.stage = 3;
    ShardedOptimizer optimizer(ddp, factoryFor("adamw"), zo);
    auto guard = ddp.noSync();
    EXPECT_THROW(ddp(torch::ones({2, 7})), InvalidArgument);
  });
}

}  // namespace
}  // namespace dtrain::testing
