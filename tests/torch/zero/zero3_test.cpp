// ZeRO stage 3 (dtrain/torch/fully_shard.h), ranks as threads: the units' layout (a pure
// function), marked modules keeping their parameter names, training against plain DDP with
// AdamW, and the parameters of marked modules freed between uses.
#include <algorithm>
#include <limits>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "dtrain/base/store.h"
#include "dtrain/torch/checkpoint.h"
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

// Nesting and reuse: a marked block with a parameter of its own around a marked layer (the block
// owns `scale`, the layer its weight and bias), and a marked layer called twice in one forward
// (its second boundary, met first in backward, gathers it; the first finds it gathered).
struct Zero3BlockImpl : torch::nn::Module {
  explicit Zero3BlockImpl(int64_t n) {
    scale = register_parameter("scale", torch::full({n}, 0.5));
    inner = register_module("inner", ShardedUnit(torch::nn::Linear(n, n)));
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::tanh(inner(x) * scale) + x; }
  torch::Tensor scale;
  ShardedUnit inner{nullptr};
};
TORCH_MODULE(Zero3Block);

struct Zero3NestedNetImpl : torch::nn::Module {
  Zero3NestedNetImpl() {
    in = register_module("in", ShardedUnit(torch::nn::Linear(7, 12)));
    block = register_module("block", ShardedUnit(Zero3Block(12)));
    twice = register_module("twice", ShardedUnit(torch::nn::Linear(12, 12)));
    head = register_module("head", torch::nn::Linear(12, 5));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return head(twice(torch::tanh(twice(block(in(x))))));
  }
  ShardedUnit in{nullptr}, block{nullptr}, twice{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Zero3NestedNet);

// Unused parameters (findUnusedParameters): a marked module whose forward never runs, and a
// marked module with a parameter its forward does not use.
struct Zero3PartlyUsedImpl : torch::nn::Module {
  explicit Zero3PartlyUsedImpl(int64_t n) {
    scale = register_parameter("scale", torch::full({n}, 0.5));
    spare = register_parameter("spare", torch::ones({n}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::tanh(x * scale); }
  torch::Tensor scale, spare;
};
TORCH_MODULE(Zero3PartlyUsed);

struct Zero3UnusedNetImpl : torch::nn::Module {
  Zero3UnusedNetImpl() {
    in = register_module("in", ShardedUnit(torch::nn::Linear(7, 12)));
    partly = register_module("partly", ShardedUnit(Zero3PartlyUsed(12)));
    never = register_module("never", ShardedUnit(torch::nn::Linear(12, 12)));
    head = register_module("head", torch::nn::Linear(12, 5));
  }
  torch::Tensor forward(const torch::Tensor& x) { return head(partly(in(x))); }
  ShardedUnit in{nullptr}, partly{nullptr}, never{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Zero3UnusedNet);

// Bytes of the parameter storages of every marked module (each parameter once).
size_t markedBytes(torch::nn::Module& net) {
  size_t bytes = 0;
  for (const auto& m : net.modules(/*include_self=*/true)) {
    if (std::dynamic_pointer_cast<ShardedUnitImpl>(m) == nullptr) continue;
    for (const auto& p : m->parameters(/*recurse=*/false)) bytes += p.storage().nbytes();
  }
  return bytes;
}

struct Zero3Result {
  std::vector<std::map<std::string, torch::Tensor>> params;  // by rank
  // Rank 0, step 0: bytes of the marked modules' parameter storages once forward has returned,
  // and once backward has.
  size_t markedAfterForward = 1;
  size_t markedAfterBackward = 1;
  // Rank 0, after the last step: the same, and the bytes of the head's one storage (the root's
  // unit: weight and bias are views of it).
  size_t markedBytes = 1;
  size_t headBytes = 0;
  // Rank 0, after the last step: stats().memory.parameters, and the owned blocks' bytes.
  size_t parameterBytes = 0;
  size_t ownedBytes = 0;
  int64_t skipped = 0;  // rank 0's GradScaler
};

struct Zero3Run {
  int world = 2;
  int stage = 3;  // 0: DDP with torch::optim::AdamW; 2, 3: a ShardedOptimizer over the same
  int steps = 30;
  at::ScalarType dtype = at::kFloat;  // of the parameters (16-bit: float32 master shards)
  bool findUnused = false;
  // >= 0: an enabled GradScaler, and at this step the last rank's gradient of the model's first
  // parameter gets an inf (after the reduce-scatter only its owner sees it).
  int overflowStep = -1;
};

template <typename Net>
Zero3Result trainZero3(const Zero3Run& how) {
  const int world = how.world;
  const int stage = how.stage;
  const at::ScalarType dtype = how.dtype;
  Zero3Result result;
  result.params.resize(static_cast<size_t>(world));
  ZeroRun run;
  run.world = world;
  auto threads = ThreadWorld::create(world);
  threads->run([&](int rank) {
    auto group = threadGroup(*threads, rank);
    Net net = buildSeeded(run.seed, [] { return Net(); });
    net->to(dtype);
    DdpOptions ddpOptions;
    ddpOptions.findUnusedParameters = how.findUnused;
    DistributedDataParallel<Net> ddp(net, group, ddpOptions);
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
    GradScalerOptions so;
    so.enabled = how.overflowStep >= 0;
    GradScaler scaler(group, so);
    const bool probe = rank == 0 && stage == 3;
    for (int s = 0; s < how.steps; ++s) {
      optimizer->zero_grad();
      auto [x, y] = wholeBatch(run, s, 0, 7, 5);
      auto out = ddp(shard(x, rank, world).to(dtype)).to(torch::kFloat);
      auto loss = torch::mse_loss(out, shard(y, rank, world));
      if (s == 0 && probe) result.markedAfterForward = markedBytes(*net);
      const bool poison = s == how.overflowStep && rank == world - 1;
      torch::Tensor first = net->parameters().front();
      const unsigned hook = poison ? first.register_hook([](torch::Tensor g) {
        g = g.clone();
        g.view(-1)[0] = std::numeric_limits<double>::infinity();
        return g;
      }) : 0;
      scaler.scale(loss).backward();
      if (poison) first.remove_hook(hook);
      if (s == 0 && probe) result.markedAfterBackward = markedBytes(*net);
      scaler.step(*optimizer);
      scaler.update();
    }
    if (rank == 0) result.skipped = scaler.skippedSteps();
    if (probe) {
      result.markedBytes = markedBytes(*net);
      result.headBytes = net->head->weight.storage().nbytes();
      result.parameterBytes = sharded->stats().memory.parameters;
      result.ownedBytes = static_cast<size_t>(sharded->layout().shardNumel()) *
                          c10::elementSize(dtype);
    }
    auto& mine = result.params[static_cast<size_t>(rank)];
    if (sharded) {
      for (auto& [name, t] : gatherFullParameters(*sharded)) mine[name] = t;
    } else {
      for (const auto& p : net->named_parameters()) mine[p.key()] = p.value().detach().clone();
    }
  });
  return result;
}

// `got`'s gathered parameters: every rank's bitwise equal, rank 0's within 1e-5 of `want`'s.
void expectSameTraining(const Zero3Result& got, const Zero3Result& want) {
  ZeroResult g, w;
  g.params = got.params;
  w.params = want.params;
  ASSERT_EQ(g.params[0].size(), w.params[0].size());
  expectRanksBitwiseEqual(g);
  expectClose(g, w, 1e-5);
}

template <typename Net>
void expectStage3MatchesDdp(int world, int64_t headNumel) {
  const Zero3Result ddp = trainZero3<Net>({world, 0});
  const Zero3Result zero = trainZero3<Net>({world, 3});
  expectSameTraining(zero, ddp);
  double worst = 0;
  for (const auto& [name, t] : ddp.params[0]) {
    worst = std::max(worst, relativeError(zero.params[0].at(name).to(torch::kDouble),
                                          t.to(torch::kDouble)));
  }
  std::ostringstream text;
  text << worst;
  ::testing::Test::RecordProperty("max_relative_error", text.str());
  // Forward frees each marked module after it ran, backward once its gradients were in, and
  // between steps they hold nothing in full; the head (the root's unit) stays full, padded.
  EXPECT_EQ(zero.markedAfterForward, 0u);
  EXPECT_EQ(zero.markedAfterBackward, 0u);
  EXPECT_EQ(zero.markedBytes, 0u);
  const int64_t padded = (headNumel + world - 1) / world * world;
  EXPECT_EQ(zero.headBytes, static_cast<size_t>(padded) * sizeof(float));
  EXPECT_EQ(zero.parameterBytes, zero.ownedBytes + zero.headBytes)
      << "stats(): the owned blocks and the root's full unit, nothing gathered";
}

class ZeroStage3Ranks : public ::testing::TestWithParam<int> {};

// 30 AdamW steps within 1e-5 (relative) of DDP's, every rank's gathered parameters bitwise equal.
TEST_P(ZeroStage3Ranks, LayersMatchDdp) { expectStage3MatchesDdp<Zero3Net>(GetParam(), 9 * 5 + 5); }

TEST_P(ZeroStage3Ranks, NestedAndReusedUnitsMatchDdp) {
  expectStage3MatchesDdp<Zero3NestedNet>(GetParam(), 12 * 5 + 5);
}

// bfloat16 parameters with float32 master shards: stage 3 steps what stage 2 steps (the same
// gradients, divided before the reduce-scatter, the same master arithmetic).
TEST_P(ZeroStage3Ranks, Bfloat16WithMasterWeightsMatchesStage2) {
  const Zero3Result two = trainZero3<Zero3NestedNet>({GetParam(), 2, 20, at::kBFloat16});
  const Zero3Result three = trainZero3<Zero3NestedNet>({GetParam(), 3, 20, at::kBFloat16});
  expectSameTraining(three, two);
  EXPECT_EQ(three.markedBytes, 0u);
}

// A marked module that never runs, and one with an unused parameter, under findUnusedParameters:
// their parameters take part with zero gradients and are stepped as at stage 2 (where DDP's
// libtorch optimizer would skip them: Note [Sharded backward]); the module that never runs is
// never gathered.
TEST_P(ZeroStage3Ranks, UnusedParametersStepAsStage2) {
  const Zero3Result two = trainZero3<Zero3UnusedNet>({GetParam(), 2, 20, at::kFloat, true});
  const Zero3Result three = trainZero3<Zero3UnusedNet>({GetParam(), 3, 20, at::kFloat, true});
  expectSameTraining(three, two);
  EXPECT_EQ(three.markedAfterBackward, 0u);
  EXPECT_EQ(three.markedBytes, 0u);
}

// An enabled GradScaler over the shards: an inf in one rank's gradient of a marked layer lands
// in one rank's shard, and every rank skips that step, as under DDP.
TEST_P(ZeroStage3Ranks, GradScalerSkipsAnOverflowOnOneRankAsDdp) {
  Zero3Run how{GetParam(), 0, 20};
  how.overflowStep = 5;
  const Zero3Result ddp = trainZero3<Zero3Net>(how);
  how.stage = 3;
  const Zero3Result zero = trainZero3<Zero3Net>(how);
  EXPECT_EQ(ddp.skipped, 1);
  EXPECT_EQ(zero.skipped, 1);
  expectSameTraining(zero, ddp);
}

INSTANTIATE_TEST_SUITE_P(World, ZeroStage3Ranks, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

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
