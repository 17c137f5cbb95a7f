// dtrain::recompute under the ZeRO wrappers, ranks as threads: a ShardedOptimizer (stage 1, 2)
// over DDP with some blocks recomputed, and stage 3 with marked units (ShardedUnit) inside a
// recomputed segment, whose recompute in backward runs the units' forward again and so gathers
// them again. Each trains bitwise as the same run without recompute, every rank equal.
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../zero/zero_expect.h"
#include "dtrain/torch/fully_shard.h"
#include "dtrain/torch/recompute.h"
#include "recompute_models.h"

namespace dtrain::testing::recompute_zero_test {
namespace {

// Recomputes seen by ProbedLayer (both ranks), and those that found the layer's weight gathered.
std::atomic<int> recomputedLayers{0};
std::atomic<int> recomputedGathered{0};

// Linear then Tanh; during a recompute it records whether its weight holds memory (at stage 3
// it does only while its unit is gathered).
struct ProbedLayerImpl : torch::nn::Module {
  ProbedLayerImpl(int64_t in, int64_t out) {
    fc = register_module("fc", torch::nn::Linear(in, out));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    if (isRecomputing()) {
      ++recomputedLayers;
      if (fc->weight.storage().nbytes() > 0) ++recomputedGathered;
    }
    return torch::tanh(fc(x));
  }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ProbedLayer);

// Four layers (7 -> 16 -> 16 -> 11 -> 9) in `body`, then a head outside it. `recompute`: the body
// runs as a RecomputeSequential of 2 segments; `marked`: every layer is a ShardedUnit (a unit of
// stage 3). Either way the parameter names are the same ("body.0.fc.weight").
struct RecomputeZeroNetImpl : torch::nn::Module {
  RecomputeZeroNetImpl(bool recompute, bool marked, bool reshardAfterForward = true) {
    torch::nn::Sequential layers(ProbedLayer(7, 16), ProbedLayer(16, 16), ProbedLayer(16, 11),
                                 ProbedLayer(11, 9));
    ShardedUnitOptions unitOptions;
    unitOptions.reshardAfterForward = reshardAfterForward;
    if (marked) layers = shardEveryChild(layers, unitOptions);
    if (recompute) {
      recomputed = register_module("body", RecomputeSequential(layers, /*segments=*/2));
    } else {
      body = register_module("body", layers);
    }
    head = register_module("head", torch::nn::Linear(9, 5));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return head(recomputed ? recomputed(x) : body->forward(x));
  }
  torch::nn::Sequential body{nullptr};
  RecomputeSequential recomputed{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(RecomputeZeroNet);

struct Run {
  int stage = 1;
  bool recompute = false;
  bool marked = false;
  int steps = 5;
  bool reshardAfterForward = true;
};

struct Trained {
  ZeroResult result;           // every rank's full parameters, by name
  size_t markedAfterStep = 1;  // rank 0: bytes the marked layers' weights hold after each step
};

// AdamW steps of a ShardedOptimizer over DDP on 2 ranks; returns the gathered parameters.
Trained train(const Run& how) {
  constexpr int kWorld = 2;
  ZeroRun data;
  data.world = kWorld;
  Trained out;
  out.result.params.resize(kWorld);
  auto threads = ThreadWorld::create(kWorld);
  threads->run([&](int rank) {
    RecomputeZeroNet net = buildSeeded(data.seed, [&] {
      return RecomputeZeroNet(how.recompute, how.marked, how.reshardAfterForward);
    });
    DistributedDataParallel<RecomputeZeroNet> ddp(net, threadGroup(*threads, rank));
    ZeroOptions zo;
    zo.stage = how.stage;
    zo.firstUnitBytes = 128;  // several units at stages 1 and 2
    zo.unitBytes = 256;
    ShardedOptimizer optimizer(ddp, factoryFor("adamw"), zo);
    size_t marked = 0;
    for (int s = 0; s < how.steps; ++s) {
      optimizer.zero_grad();
      auto [x, y] = wholeBatch(data, s, 0, 7, 5);
      torch::mse_loss(ddp(shard(x, rank, kWorld)), shard(y, rank, kWorld)).backward();
      optimizer.step();
      if (how.marked) {
        for (const auto& p : net->named_parameters()) {
          if (p.key().rfind("body.", 0) == 0) marked += p.value().storage().nbytes();
        }
      }
    }
    if (rank == 0) out.markedAfterStep = marked;
    for (auto& [name, t] : gatherFullParameters(optimizer)) out.result.params[rank][name] = t;
  });
  return out;
}

// Every rank's parameters bitwise rank 0's, rank 0's bitwise the reference's.
void expectBitwiseEqual(const ZeroResult& got, const ZeroResult& want) {
  expectRanksBitwiseEqual(got);
  ASSERT_EQ(got.params[0].size(), want.params[0].size());
  for (const auto& [name, t] : want.params[0]) {
    ASSERT_EQ(got.params[0].count(name), 1u) << name;
    EXPECT_TRUE(bitwiseEqual(got.params[0].at(name), t)) << name;
  }
}

class RecomputeZero : public ::testing::TestWithParam<int> {};

// The recomputed segments' gradients leave the recompute's node in the ordinary backward and
// reach the shards' hooks once each, as without recompute.
TEST_P(RecomputeZero, RecomputedBlocksTrainBitwiseEqual) {
  const Trained plain = train({GetParam(), false});
  const Trained recomputed = train({GetParam(), true});
  expectBitwiseEqual(recomputed.result, plain.result);
  // The parameters moved.
  const Trained none = train({GetParam(), false, false, 0});
  EXPECT_FALSE(bitwiseEqual(plain.result.params[0].at("body.0.fc.weight"),
                            none.result.params[0].at("body.0.fc.weight")));
}

INSTANTIATE_TEST_SUITE_P(Stage, RecomputeZero, ::testing::Values(1, 2),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

// Stage 3, every layer a unit inside a recomputed segment: the segment's forward gathers and frees
// each unit; in backward its recompute runs the units' forward again, which gathers each again
// (every recomputed layer found its weight in memory), and the gradients are reduce-scattered and
// the units freed as without recompute.
TEST(RecomputeZeroStage3, UnitsInsideARecomputedSegmentAreGatheredAgainAndTrainBitwiseEqual) {
  constexpr int kSteps = 5;
  const Trained plain = train({3, false, true, kSteps});
  recomputedLayers = recomputedGathered = 0;
  const Trained recomputed = train({3, true, true, kSteps});
  EXPECT_EQ(recomputedLayers.load(), 2 * kSteps * 4) << "2 ranks, 4 layers recomputed per step";
  EXPECT_EQ(recomputedGathered.load(), recomputedLayers.load());
  EXPECT_EQ(plain.markedAfterStep, 0u);
  EXPECT_EQ(recomputed.markedAfterStep, 0u) << "a unit left gathered after the recompute";
  expectBitwiseEqual(recomputed.result, plain.result);
}

// Units kept from forward to backward (reshardAfterForward = false) inside a recomputed segment,
// whose forward runs with grad on (Note [Tensors a segment reads]): every recomputed layer finds
// its weight in memory, every unit is freed once its gradients are in, and training is bitwise the
// run without recompute.
TEST(RecomputeZeroStage3, UnitsKeptForBackwardInsideARecomputedSegmentTrainBitwiseEqual) {
  constexpr int kSteps = 3;
  struct Run how {
    3, false, true, kSteps
  };  // "struct": Test::Run hides the name
  how.reshardAfterForward = false;
  const Trained plain = train(how);
  how.recompute = true;
  recomputedLayers = recomputedGathered = 0;
  const Trained recomputed = train(how);
  EXPECT_EQ(recomputedGathered.load(), recomputedLayers.load());
  EXPECT_EQ(recomputed.markedAfterStep, 0u) << "a unit left gathered after the step";
  expectBitwiseEqual(recomputed.result, plain.result);
}

}  // namespace
}  // namespace dtrain::testing::recompute_zero_test
