// ZeroOptions::paramDtype: stage 3's marked units gathered and computed in bfloat16, their float32
// values kept as master shards (FSDP2's MixedPrecisionPolicy(param_dtype=torch.bfloat16)), under
// autocast.

#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "../process_group_support.h"
#include "counting_allocator.h"
#include "dtrain/comm/gloo_communicator.h"
#include "dtrain/torch/autocast.h"
#include "dtrain/torch/fully_shard.h"
#include "zero3_support.h"

namespace dtrain::testing {
namespace {

class ZeroParamDtype : public ::testing::TestWithParam<int> {};

// The loss of what `forward` returns under autocast, computed in float32 outside it.
torch::Tensor lossUnderAutocast(const std::function<torch::Tensor()>& forward,
                                const torch::Tensor& y) {
  torch::Tensor out;
  {
    AutocastGuard autocast(torch::kCPU);
    out = forward();
  }
  return torch::mse_loss(out.to(torch::kFloat), y);
}

// Against a single-process reference written without the library: one process runs every rank's
// share of the batch under autocast through one model whose marked layers are bfloat16 copies of
// float32 masters (the head, the root's unit, stays float32 and autocast casts it), sums the
// gradients in float32 in rank order and divides by the ranks (the float32 reduce-scatter's
// average), steps the masters with AdamW and rounds the layers' into the model. The masters
// start from the float32 values as built, not from their rounding; gatherFullParameters() gives
// them back bitwise, and the module's marked parameters are bfloat16 views.
TEST_P(ZeroParamDtype, UnderAutocastTrainsAsASingleProcessReferenceWithFloat32Masters) {
  const int world = GetParam();
  constexpr int kSteps = 12;
  const auto adamw = torch::optim::AdamWOptions(1e-3).weight_decay(0.05);
  ZeroRun run;
  run.world = world;
  auto isBody = [](const std::string& name) { return name.rfind("body.", 0) == 0; };
  // The reference.
  Zero3Net ref = buildSeeded(run.seed, [] { return Zero3Net(); });
  std::vector<std::string> names;
  std::vector<torch::Tensor> params, masters;
  for (const auto& p : ref->named_parameters()) {
    names.push_back(p.key());
    masters.push_back(isBody(p.key()) ? p.value().detach().clone() : p.value());
  }
  ref->body->to(at::kBFloat16);
  for (const auto& p : ref->named_parameters()) params.push_back(p.value());
  torch::optim::AdamW refOptimizer(masters, adamw);
  for (int s = 0; s < kSteps; ++s) {
    std::vector<torch::Tensor> sums;
    for (const auto& m : masters) sums.push_back(torch::zeros_like(m));
    auto [x, y] = wholeBatch(run, s, 0, 7, 5);
    for (int r = 0; r < world; ++r) {
      for (auto& p : params) p.mutable_grad() = torch::Tensor();
      lossUnderAutocast([&] { return ref->forward(shard(x, r, world)); }, shard(y, r, world))
          .backward();
      for (size_t i = 0; i < params.size(); ++i) sums[i].add_(params[i].grad().to(at::kFloat));
    }
    torch::NoGradGuard noGrad;
    for (size_t i = 0; i < masters.size(); ++i) masters[i].mutable_grad() = sums[i].div_(world);
    refOptimizer.step();
    for (size_t i = 0; i < params.size(); ++i) {
      if (isBody(names[i])) params[i].copy_(masters[i]);
    }
  }
  // Stage 3 with paramDtype at `world` ranks.
  std::vector<std::map<std::string, torch::Tensor>> got(static_cast<size_t>(world));
  std::vector<std::map<std::string, at::ScalarType>> dtypes(static_cast<size_t>(world));
  auto threads = ThreadWorld::create(world);
  threads->run([&](int rank) {
    const auto group = threadGroup(*threads, rank);
    Zero3Net net = buildSeeded(run.seed, [] { return Zero3Net(); });
    DistributedDataParallel<Zero3Net> ddp(net, group);
    ZeroOptions zo;
    zo.stage = 3;
    zo.reduceDtype = at::kFloat;
    zo.paramDtype = at::kBFloat16;
    ShardedOptimizer optimizer(ddp, optimizerFactory<torch::optim::AdamW>(adamw), zo);
    for (const auto& p : net->named_parameters()) {
      dtypes[static_cast<size_t>(rank)][p.key()] = p.value().scalar_type();
    }
    for (int s = 0; s < kSteps; ++s) {
      optimizer.zero_grad();
      auto [x, y] = wholeBatch(run, s, 0, 7, 5);
      lossUnderAutocast([&] { return ddp(shard(x, rank, world)); }, shard(y, rank, world))
          .backward();
      optimizer.step();
    }
    for (auto& [name, t] : gatherFullParameters(optimizer)) {
      got[static_cast<size_t>(rank)][name] = t;
    }
  });
  for (size_t i = 0; i < names.size(); ++i) {
    const torch::Tensor& want = isBody(names[i]) ? masters[i] : params[i];
    for (int r = 0; r < world; ++r) {
      const auto& mine = got[static_cast<size_t>(r)];
      ASSERT_TRUE(mine.count(names[i])) << names[i];
      EXPECT_EQ(mine.at(names[i]).scalar_type(), at::kFloat) << names[i];
      EXPECT_TRUE(torch::equal(mine.at(names[i]), want)) << names[i] << " on rank " << r;
      EXPECT_EQ(dtypes[static_cast<size_t>(r)].at(names[i]),
                isBody(names[i]) ? at::kBFloat16 : at::kFloat)
          << names[i] << ": marked units' parameters are views in paramDtype, the root's not";
    }
  }
}

// Units sharded as they are built (fullyShard: the master takes the float32 block as built),
// nested and reused, over three micro-batches (noSync() reduce-scatters into the float32 shard
// gradients), with and without reshardAfterForward: bitwise as the model built whole, ranks alike.
TEST_P(ZeroParamDtype, UnitsShardedAsBuiltTrainBitwiseAsBuiltWhole) {
  for (bool reshard : {true, false}) {
    Zero3Run how{GetParam(), 3, 8};
    how.micro = 3;
    how.unit.reshardAfterForward = reshard;
    how.paramDtype = at::kBFloat16;
    how.reduceDtype = at::kFloat;
    const Zero3Result whole = trainZero3<Zero3NestedNet>(how);
    how.builtSharded = true;
    const Zero3Result built = trainZero3<Zero3NestedNet>(how);
    for (int r = 0; r < GetParam(); ++r) {
      ASSERT_EQ(built.params[r].size(), whole.params[r].size());
      for (const auto& [name, t] : whole.params[r]) {
        EXPECT_EQ(t.scalar_type(), at::kFloat) << name;
        EXPECT_TRUE(torch::equal(built.params[r].at(name), t)) << name << " on rank " << r;
        EXPECT_TRUE(torch::equal(whole.params[0].at(name), t)) << name << " on rank " << r;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(World, ZeroParamDtype, ::testing::Values(2, 3),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

// Eight marked Linear(256, 256) at 2 ranks, a small batch: between forward and backward under
// autocast, the graph keeps autocast's bfloat16 copy of every layer's weight (autograd saves it)
// -- ~2 bytes per parameter of the whole model, long after each unit was resharded. With
// paramDtype the weights are bfloat16 already, the graph saves the unit's own parameters (freed
// at reshard, gathered again for backward), and what forward leaves alive is the activations:
// below the float32 run's, whose activations are twice as wide.
TEST(ZeroParamDtypeMemory, AutocastKeepsNoCopyOfTheWeightsBetweenForwardAndBackward) {
  CountingCpuAllocator& counter = CountingCpuAllocator::install();
  constexpr int kWorld = 2;
  constexpr int64_t kWidth = 256;
  constexpr int kLayers = 8;
  constexpr int64_t kBatch = 4;  // per rank
  const int64_t weightBytes = kLayers * (kWidth * kWidth + kWidth) * 4;
  enum class Mode { Float32, Autocast, AutocastParamDtype };
  auto heldAfterForward = [&](Mode mode) {
    std::vector<int64_t> held(2, 0);
    auto threads = ThreadWorld::create(kWorld);
    const torch::Tensor x = torch::randn({kWorld * kBatch, kWidth});
    threads->run([&](int rank) {
      const auto group = threadGroup(*threads, rank);
      torch::nn::Sequential body = buildSeeded(7, [&] {
        torch::nn::Sequential layers;
        for (int l = 0; l < kLayers; ++l) {
          layers->push_back(torch::nn::Linear(kWidth, kWidth));
          layers->push_back(torch::nn::Tanh());
        }
        return shardEveryChild(layers);
      });
      DistributedDataParallel<torch::nn::Sequential> ddp(body, group);
      ZeroOptions zo;
      zo.stage = 3;
      if (mode == Mode::AutocastParamDtype) zo.paramDtype = at::kBFloat16;
      ShardedOptimizer optimizer(
          ddp, optimizerFactory<torch::optim::SGD>(torch::optim::SGDOptions(0.01)), zo);
      const torch::Tensor mine = shard(x, rank, kWorld);
      for (int step = 0; step < 2; ++step) {  // the second with the pools warm
        optimizer.zero_grad();
        group->barrier();
        const int64_t before = counter.live();
        group->barrier();
        torch::Tensor out;
        {
          AutocastGuard autocast(torch::kCPU, mode != Mode::Float32);
          out = ddp(mine);
        }
        group->barrier();
        if (rank == 0) held[static_cast<size_t>(step)] = counter.live() - before;
        group->barrier();
        out.to(torch::kFloat).square().mean().backward();
        optimizer.step();
      }
    });
    return held[1];
  };
  const int64_t f32 = heldAfterForward(Mode::Float32);
  const int64_t autocast = heldAfterForward(Mode::Autocast);
  const int64_t paramDtype = heldAfterForward(Mode::AutocastParamDtype);
  RecordProperty("held_float32", std::to_string(f32));
  RecordProperty("held_autocast", std::to_string(autocast));
  RecordProperty("held_autocast_param_dtype", std::to_string(paramDtype));
  // Both ranks' copies, counted in one process: 2 bytes per weight element of every layer but
  // the first (whose input needs no gradient, so its weight is not saved).
  const int64_t copies = kWorld * (kLayers - 1) * kWidth * kWidth * 2;
  EXPECT_GE(autocast - paramDtype, copies * 9 / 10)
      << "autocast without paramDtype keeps a bfloat16 copy of every weight";
  EXPECT_LE(paramDtype, f32) << "with paramDtype forward leaves its activations only";
  EXPECT_LT(paramDtype, weightBytes / 8) << "nothing of the size of the weights is left";
}

// The option is stage 3's, with master weights, and 16-bit: anything else is refused by name.
// A converted unit keeps its float32 master alone between uses, as FSDP2 keeps its float32 shard:
// no bfloat16 rounding of its block beside it (each all-gather rounds the master into the
// gathered unit). The training is that of the units that kept one (the tests above: bitwise
// equal to units built whole, and to the reference).
TEST(ZeroParamDtypeMemory, AConvertedUnitKeepsItsMasterAloneBetweenUses) {
  constexpr int kWorld = 2;
  constexpr int64_t kWidth = 64;
  constexpr int kLayers = 4;
  auto threads = ThreadWorld::create(kWorld);
  threads->run([&](int rank) {
    const auto group = threadGroup(*threads, rank);
    torch::nn::Sequential body = buildSeeded(7, [&] {
      torch::nn::Sequential layers;
      for (int l = 0; l < kLayers; ++l) layers->push_back(torch::nn::Linear(kWidth, kWidth));
      return shardEveryChild(layers);
    });
    DistributedDataParallel<torch::nn::Sequential> ddp(body, group);
    ZeroOptions zo;
    zo.stage = 3;
    zo.paramDtype = at::kBFloat16;
    ShardedOptimizer optimizer(
        ddp, optimizerFactory<torch::optim::SGD>(torch::optim::SGDOptions(0.01)), zo);
    for (int step = 0; step < 2; ++step) {
      optimizer.zero_grad();
      AutocastGuard autocast(torch::kCPU, true);
      ddp(torch::randn({4, kWidth})).to(torch::kFloat).square().mean().backward();
      optimizer.step();
    }
    const ZeroMemory m = optimizer.stats().memory;
    const int64_t shard = (kWidth * kWidth + kWidth + kWorld - 1) / kWorld;  // per unit
    EXPECT_EQ(m.parameters, 0u) << "rank " << rank << ": no bfloat16 block between uses";
    EXPECT_EQ(m.masterWeights, static_cast<size_t>(kLayers * shard * 4));
  });
}

// Two Linear layers in one marked unit; `inside` runs when the gradient of the first layer's
// output is in, before that layer's backward: the second layer's gradients are in by then (its
// accumulators run before the nodes the engine has ready with them), the unit's are not all.
struct TwoLayerImpl : torch::nn::Module {
  TwoLayerImpl(int64_t width, std::function<void()> inside)
      : a(register_module("a", torch::nn::Linear(width, width))),
        b(register_module("b", torch::nn::Linear(width, width))),
        inside(std::move(inside)) {}
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = a(x);
    if (h.requires_grad()) {
      h.register_hook([this](const torch::Tensor& g) {
        inside();
        return g;
      });
    }
    return b(torch::tanh(h));
  }
  torch::nn::Linear a, b;
  std::function<void()> inside;
};
TORCH_MODULE(TwoLayer);

// Note [Gradients wider than the parameters] (runtime/torch/zero/shard_group.cpp): a unit gathered
// in bfloat16 whose gradients are reduced in float32 holds them as autograd made them, bfloat16 in
// the parameters' .grad, until its last one is in -- no float32 bucket, twice the parameters'
// bytes, beside the gathered unit during its backward -- and reduce-scatters them in float32 then.
TEST(ZeroParamDtypeMemory, AUnitHoldsItsGradientsInItsOwnDtypeUntilTheLastIsIn) {
  if (!comm::glooAvailable()) GTEST_SKIP() << "built without Gloo";
  constexpr int kWorld = 2;
  constexpr int64_t kWidth = 256;
  // The unit's full float32 gradients: what a bucket takes.
  constexpr size_t kBucketBytes = 2 * (kWidth * kWidth + kWidth) * 4;
  runOnGlooGroups(kWorld, comm::Millis(10000), [&](int rank, const auto& group) {
    std::vector<std::string> seen;
    TwoLayer layer{nullptr};
    torch::nn::Sequential body = buildSeeded(7, [&] {
      torch::nn::Sequential layers;
      layer = TwoLayer(kWidth, [] {});
      layers->push_back(layer);
      return shardEveryChild(layers);
    });
    TwoLayerImpl& unit = *layer;
    unit.inside = [&] {
      const at::Tensor& g = unit.b->weight.grad();
      const size_t inUse = group->communicator().bufferStats().inUseBytes;
      seen.push_back(g.defined() ? std::string(c10::toString(g.scalar_type())) : "none");
      EXPECT_LT(inUse, kBucketBytes)
          << "rank " << rank << ": buffers in use in the unit's backward: a float32 bucket";
    };
    DistributedDataParallel<torch::nn::Sequential> ddp(body, group);
    ZeroOptions zo;
    zo.stage = 3;
    zo.paramDtype = at::kBFloat16;
    zo.reduceDtype = at::kFloat;
    ShardedOptimizer optimizer(
        ddp, optimizerFactory<torch::optim::SGD>(torch::optim::SGDOptions(0.01)), zo);
    for (int step = 0; step < 2; ++step) {
      optimizer.zero_grad();
      torch::Tensor out;
      {
        AutocastGuard autocast(torch::kCPU, true);
        out = ddp(torch::randn({4, kWidth}));
      }
      out.to(torch::kFloat).square().mean().backward();
      // After backward the gradient lives on in the float32 shard only (.grad unset, or a
      // placeholder over one element: Note [Zeroed gradients] in gradient_sync.cpp).
      const at::Tensor& after = unit.b->weight.grad();
      EXPECT_TRUE(!after.defined() || after.storage().nbytes() <= 2)
          << "rank " << rank << ": the full gradient is given up once reduce-scattered";
      optimizer.step();
    }
    EXPECT_EQ(seen, (std::vector<std::string>{"BFloat16", "BFloat16"})) << "rank " << rank;
  });
}

TEST(ZeroParamDtypeOptions, RefusedOutsideStage3WithMasterWeights) {
  auto threads = ThreadWorld::create(1);
  threads->run([&](int rank) {
    const auto group = threadGroup(*threads, rank);
    auto attempt = [&](int stage, bool masters, at::ScalarType dtype) {
      Zero3Net net;
      DistributedDataParallel<Zero3Net> ddp(net, group);
      ZeroOptions zo;
      zo.stage = stage;
      zo.masterWeights = masters;
      zo.paramDtype = dtype;
      try {
        ShardedOptimizer optimizer(
            ddp, optimizerFactory<torch::optim::SGD>(torch::optim::SGDOptions(0.1)), zo);
      } catch (const InvalidArgument& e) {
        return std::string(e.what());
      }
      return std::string();
    };
    for (const auto& [stage, masters, dtype] :
         {std::tuple{2, true, at::kBFloat16}, std::tuple{3, false, at::kBFloat16},
          std::tuple{3, true, at::kDouble}}) {
      const std::string error = attempt(stage, masters, dtype);
      EXPECT_NE(error.find("paramDtype"), std::string::npos)
          << "stage " << stage << ", masters " << masters << ": " << error;
      EXPECT_NE(error.find("HINT"), std::string::npos) << error;
    }
    EXPECT_EQ(attempt(3, true, at::kHalf), "") << "float16 is accepted";
  });
}

}  // namespace
}  // namespace dtrain::testing
