// ZeRO stage 3 (dtrain/torch/fully_shard.h), ranks as threads: the units' layout (a pure
// function), marked modules keeping their parameter names, training against plain DDP with
// AdamW, and the parameters of marked modules freed between uses.
#include <algorithm>
#include <limits>
#include <optional>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "dtrain/torch/checkpoint.h"
#include "dtrain/torch/fully_shard.h"
#include "zero3_support.h"
#include "zero_expect.h"

namespace dtrain::testing::zero3_test {
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
  EXPECT_TRUE(
      torch::equal(marked->forward(torch::ones({2, 3})), plain->forward(torch::ones({2, 3}))));
}

// `got`'s gathered parameters: every rank's bitwise equal, rank 0's within 1e-4 of `want`'s.
// Stage 3 and DDP run the same arithmetic and end bitwise equal in a typical run here; once, in a
// clean-clone CI run on a loaded VM, LayersMatchDdp at 2 ranks ended 1.2-1.5e-5 apart in every
// layer (not reproduced in 12 runs beside 3 busy loops): a rounding difference in one kernel call,
// which 30 AdamW steps at lr 1e-2 amplify. A unit used stale or ungathered is ~lr apart (1e-2).
void expectSameTraining(const Zero3Result& got, const Zero3Result& want) {
  ZeroResult g, w;
  g.params = got.params;
  w.params = want.params;
  ASSERT_EQ(g.params[0].size(), w.params[0].size());
  expectRanksBitwiseEqual(g);
  expectClose(g, w, 1e-4);
}

template <typename Net>
void expectStage3MatchesDdp(int world, int64_t headNumel) {
  const Zero3Result ddp = trainZero3<Net>({world, 0});
  const Zero3Result zero = trainZero3<Net>({world, 3});
  expectSameTraining(zero, ddp);
  double worst = 0;
  for (const auto& [name, t] : ddp.params[0]) {
    worst = std::max(
        worst, relativeError(zero.params[0].at(name).to(torch::kDouble), t.to(torch::kDouble)));
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

// 30 AdamW steps within 1e-4 (relative) of DDP's, every rank's gathered parameters bitwise equal.
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

// Gradient accumulation: three micro-batches per step, the first two under noSync(). Their
// backwards reduce-scatter into the shards' gradients (the default accumulation) or, with
// Accumulation::Local, reduce nothing and keep the full gradients in .grad; either way they
// reshard every unit as a synchronising backward does: after the first (a noSync() one) no
// marked module holds its parameters. Nested units and a layer called twice, as above.
TEST_P(ZeroStage3Ranks, NoSyncAccumulationMatchesDdp) {
  Zero3Run how{GetParam(), 0, 20};
  how.micro = 3;
  const Zero3Result ddp = trainZero3<Zero3NestedNet>(how);
  how.stage = 3;
  for (bool local : {false, true}) {
    SCOPED_TRACE(local ? "local accumulation" : "reduce-scattered accumulation");
    how.localAccumulation = local;
    const Zero3Result zero = trainZero3<Zero3NestedNet>(how);
    expectSameTraining(zero, ddp);
    EXPECT_EQ(zero.markedAfterForward, 0u);
    EXPECT_EQ(zero.markedAfterBackward, 0u) << "a noSync() backward resharded every unit";
    EXPECT_EQ(zero.markedBytes, 0u);
  }
}

// Note [Zeroed gradients]: a micro-batch accumulated under noSync() and then dropped by
// zero_grad() leaves no trace, whichever zero_grad() drops it (ZeroEquivalence's test of stages
// 1 and 2), with nested units and a layer called twice.
TEST_P(ZeroStage3Ranks, AnAbandonedAccumulationIsDroppedByEitherZeroGrad) {
  for (const char* who : {"optimizer", "module", "module-none"}) {
    SCOPED_TRACE(who);
    Zero3Run how{GetParam(), 0, 8};
    how.micro = 2;
    how.abandoned = true;
    how.zeroGrad = who;
    const Zero3Result ddp = trainZero3<Zero3NestedNet>(how);
    how.stage = 3;
    const Zero3Result zero = trainZero3<Zero3NestedNet>(how);
    expectSameTraining(zero, ddp);
  }
}

// Note [Prefetching units]: from the second step on, every gather for backward but the first is
// issued before its unit is needed, and with forwardPrefetch every forward gather but the first
// too. Training stays within 1e-4 of DDP's either way, and the marked units' full parameters
// held at once never exceed the two largest units (one computing, the next arriving; measured
// by the pool's buffers as the units hold them).
TEST_P(ZeroStage3Ranks, PrefetchedGathersTrainAsDdpHoldingAtMostTwoUnits) {
  const Zero3Result ddp = trainZero3<Zero3Net>({GetParam(), 0, 10});
  Zero3Run how{GetParam(), 3, 10};
  how.forwardPrefetch = true;
  const Zero3Result both = trainZero3<Zero3Net>(how);
  expectSameTraining(both, ddp);
  EXPECT_EQ(both.unitGathers, 8u) << "four marked layers, gathered in forward and in backward";
  EXPECT_EQ(both.prefetchedGathers, 6u) << "all but the first of each pass";
  EXPECT_GT(both.peakGathered, 0u);
  EXPECT_LE(both.peakGathered, both.twoLargestUnits);
  EXPECT_EQ(both.markedBytes, 0u);
  how.forwardPrefetch = false;
  const Zero3Result backward = trainZero3<Zero3Net>(how);
  EXPECT_EQ(backward.prefetchedGathers, 3u);
  how.backwardPrefetch = false;
  const Zero3Result none = trainZero3<Zero3Net>(how);
  EXPECT_EQ(none.unitGathers, 8u);
  EXPECT_EQ(none.prefetchedGathers, 0u);
  expectSameTraining(none, ddp);
}

// bfloat16 compute with float32 master weights against a single-process reference written
// without the library: one process runs every rank's share of the batch through one bfloat16
// model, sums the gradients in float32 in rank order and divides by the ranks (what the
// float32 reduce-scatter's average computes), steps float32 masters with AdamW and rounds them
// into the model. At a learning rate whose updates are below half a bfloat16 step of most weights
// (1e-4 a step against weights of ~0.2: a step of 2^-10 ~ 1e-3), the parameters move only
// because the masters accumulate them: stage 3 must end where the reference ends, bitwise.
TEST_P(ZeroStage3Ranks, Bfloat16WithFloat32MastersMatchesASingleProcessReference) {
  const int world = GetParam();
  constexpr int kSteps = 20;
  constexpr double kLr = 1e-4;
  const auto adamw = torch::optim::AdamWOptions(kLr).weight_decay(0.05);
  ZeroRun run;
  run.world = world;
  // The reference.
  Zero3Net ref = buildSeeded(run.seed, [] { return Zero3Net(); });
  ref->to(at::kBFloat16);
  std::map<std::string, torch::Tensor> initial;
  std::vector<torch::Tensor> params, masters;
  for (const auto& p : ref->named_parameters()) {
    initial[p.key()] = p.value().detach().clone();
    params.push_back(p.value());
    masters.push_back(p.value().detach().to(at::kFloat).clone());
  }
  torch::optim::AdamW refOptimizer(masters, adamw);
  for (int s = 0; s < kSteps; ++s) {
    std::vector<torch::Tensor> sums;
    for (const auto& m : masters) sums.push_back(torch::zeros_like(m));
    auto [x, y] = wholeBatch(run, s, 0, 7, 5);
    for (int r = 0; r < world; ++r) {
      for (auto& p : params) p.mutable_grad() = torch::Tensor();
      auto out = ref->forward(shard(x, r, world).to(at::kBFloat16)).to(torch::kFloat);
      torch::mse_loss(out, shard(y, r, world)).backward();
      for (size_t i = 0; i < params.size(); ++i) sums[i].add_(params[i].grad().to(at::kFloat));
    }
    torch::NoGradGuard noGrad;
    for (size_t i = 0; i < masters.size(); ++i) masters[i].mutable_grad() = sums[i].div_(world);
    refOptimizer.step();
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(masters[i]);
  }
  // Stage 3 at `world` ranks.
  std::vector<std::map<std::string, torch::Tensor>> got(static_cast<size_t>(world));
  auto threads = ThreadWorld::create(world);
  threads->run([&](int rank) {
    const auto group = threadGroup(*threads, rank);
    Zero3Net net = buildSeeded(run.seed, [] { return Zero3Net(); });
    net->to(at::kBFloat16);
    DistributedDataParallel<Zero3Net> ddp(net, group);
    ZeroOptions zo;
    zo.stage = 3;
    zo.reduceDtype = at::kFloat;
    ShardedOptimizer optimizer(ddp, optimizerFactory<torch::optim::AdamW>(adamw), zo);
    for (int s = 0; s < kSteps; ++s) {
      optimizer.zero_grad();
      auto [x, y] = wholeBatch(run, s, 0, 7, 5);
      auto out = ddp(shard(x, rank, world).to(at::kBFloat16)).to(torch::kFloat);
      torch::mse_loss(out, shard(y, rank, world)).backward();
      optimizer.step();
    }
    for (auto& [name, t] : gatherFullParameters(optimizer))
      got[static_cast<size_t>(rank)][name] = t;
  });
  int64_t moved = 0, elements = 0;
  for (const auto& p : ref->named_parameters()) {
    const torch::Tensor& want = p.value();
    moved += want.ne(initial.at(p.key())).sum().item<int64_t>();
    elements += want.numel();
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(torch::equal(got[static_cast<size_t>(r)].at(p.key()), want))
          << p.key() << " on rank " << r;
    }
  }
  EXPECT_GT(moved, elements / 2) << "the masters moved most parameters by a bfloat16 step or more";
}

// ZeroOptions::offload on a CPU-only job: the optimizer state is on the host already, so it is
// accepted and changes nothing -- no master copy of float32 parameters, nothing counted as
// offloaded, training bitwise as without it (float32, and bfloat16 with float32 masters).
TEST_P(ZeroStage3Ranks, OffloadOnTheCpuChangesNothing) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    Zero3Run how{GetParam(), 3, 10, dtype};
    const Zero3Result plain = trainZero3<Zero3NestedNet>(how);
    how.offload = true;
    const Zero3Result offloaded = trainZero3<Zero3NestedNet>(how);
    EXPECT_EQ(offloaded.offloadedBytes, 0u);
    EXPECT_EQ(offloaded.masterBytes, plain.masterBytes);
    EXPECT_EQ(plain.masterBytes == 0, dtype == at::kFloat);
    for (int r = 0; r < GetParam(); ++r) {
      for (const auto& [name, t] : plain.params[r]) {
        EXPECT_TRUE(torch::equal(offloaded.params[r].at(name), t)) << name << " on rank " << r;
      }
    }
  }
}

// Every unit sharded as it is built (fullyShard), the block's inner layer before the block that
// holds it: 20 steps of three micro-batches end bitwise where the model built whole ends, with
// and without reshardAfterForward.
TEST_P(ZeroStage3Ranks, NestedUnitsShardedAsBuiltTrainBitwiseAsBuiltWhole) {
  for (bool reshard : {true, false}) {
    Zero3Run how{GetParam(), 3, 20};
    how.micro = 3;
    how.unit.reshardAfterForward = reshard;
    const Zero3Result whole = trainZero3<Zero3NestedNet>(how);
    how.builtSharded = true;
    const Zero3Result built = trainZero3<Zero3NestedNet>(how);
    for (int r = 0; r < GetParam(); ++r) {
      ASSERT_EQ(built.params[r].size(), whole.params[r].size());
      for (const auto& [name, t] : whole.params[r]) {
        EXPECT_TRUE(torch::equal(built.params[r].at(name), t)) << name << " on rank " << r;
      }
    }
  }
}

// ShardedUnitOptions::reshardAfterForward = false: each unit stays from its forward to its
// backward (the marked modules hold their parameters once forward has returned), the backward
// gathers nothing and frees each unit once its gradients are in. Nested units and a layer
// called twice, forward prefetch on, within 1e-4 of DDP's.
TEST_P(ZeroStage3Ranks, UnitsKeptFromForwardToBackwardMatchDdp) {
  Zero3Run how{GetParam(), 0, 20};
  const Zero3Result ddp = trainZero3<Zero3NestedNet>(how);
  how.stage = 3;
  how.unit.reshardAfterForward = false;
  how.forwardPrefetch = true;
  const Zero3Result kept = trainZero3<Zero3NestedNet>(how);
  expectSameTraining(kept, ddp);
  EXPECT_GT(kept.markedAfterForward, 0u);
  EXPECT_EQ(kept.markedAfterBackward, 0u);
  EXPECT_EQ(kept.markedBytes, 0u);
  EXPECT_EQ(kept.unitGathers, 4u) << "in, block, block.inner and twice, once each, in forward";
}

// Tied parameters belong to the innermost marked module around all their users, else to the
// root: a.weight = b.weight stays full with the head (the root's one storage, counted once per
// user: a and b), pair's shared weight is freed with pair. Within 1e-4 of DDP's.
TEST_P(ZeroStage3Ranks, TiedParametersBelongToTheUnitAroundTheirUsers) {
  Zero3Run how{GetParam(), 0, 20};
  const Zero3Result ddp = trainZero3<Zero3TiedNet>(how);
  how.stage = 3;
  const Zero3Result zero = trainZero3<Zero3TiedNet>(how);
  expectSameTraining(zero, ddp);
  EXPECT_EQ(zero.markedAfterBackward, 2 * zero.headBytes);
  EXPECT_EQ(zero.markedBytes, 2 * zero.headBytes) << "a.weight and b.weight: the root's storage";
}

// ZeroOptions::reduceDtype = float32 with bfloat16 parameters and float32 master shards: the
// gradients are reduce-scattered in float32 (summed without bfloat16 rounding), at stage 3 as at
// stage 2, bitwise, and the result is not the bfloat16 reduction's.
TEST_P(ZeroStage3Ranks, Float32ReductionOfBfloat16GradientsMatchesStage2) {
  Zero3Run how{GetParam(), 0, 20};
  const Zero3Result reference = trainZero3<Zero3NestedNet>(how);  // float32 DDP
  how.dtype = at::kBFloat16;
  how.stage = 2;
  how.reduceDtype = at::kFloat;
  const Zero3Result two = trainZero3<Zero3NestedNet>(how);
  how.stage = 3;
  const Zero3Result three = trainZero3<Zero3NestedNet>(how);
  how.reduceDtype.reset();
  const Zero3Result bf16 = trainZero3<Zero3NestedNet>(how);
  ZeroResult a, b;
  a.params = three.params;
  b.params = two.params;
  expectRanksBitwiseEqual(a);
  expectClose(a, b, 0);
  auto worst = [&](const Zero3Result& r) {
    double err = 0;
    for (const auto& [name, t] : reference.params[0]) {
      err = std::max(err,
                     relativeError(r.params[0].at(name).to(torch::kDouble), t.to(torch::kDouble)));
    }
    return err;
  };
  bool differs = false;
  for (const auto& [name, t] : bf16.params[0])
    differs |= !torch::equal(three.params[0].at(name), t);
  EXPECT_TRUE(differs) << "the float32 reduction changed nothing";
  // For the record: how far each ends from float32 training (20 steps; which is closer varies
  // with the world size, the rounding of the parameters themselves dominating).
  ::testing::Test::RecordProperty("error_float32_reduce", std::to_string(worst(three)));
  ::testing::Test::RecordProperty("error_bfloat16_reduce", std::to_string(worst(bf16)));
}

INSTANTIATE_TEST_SUITE_P(World, ZeroStage3Ranks, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

}  // namespace
}  // namespace dtrain::testing::zero3_test
