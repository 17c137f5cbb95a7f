// Units sharded as they are built (dtrain::fullyShard, Note [Units sharded when built]), ranks as
// threads: the model equals a one-process model of the same seed, trains bitwise as the same
// model built whole and sharded by the optimizer, never holds more than one unit in full while it
// is built (a counting allocator), and fails every rank alike when the ranks built other values.
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "counting_allocator.h"
#include "dtrain/torch/fully_shard.h"
#include "zero3_support.h"
#include "zero_expect.h"

namespace dtrain::testing::zero3_build_test {
namespace {

enum class Build {
  Plain,    // no ShardedUnit: the one-process model
  Marked,   // every body layer a ShardedUnit, built whole, sharded by the optimizer
  Sharded,  // every body layer sharded as it is built (fullyShard)
};

// A Linear layer and tanh: one unit.
struct TanhLayerImpl : torch::nn::Module {
  TanhLayerImpl(int64_t in, int64_t out) { fc = register_module("fc", torch::nn::Linear(in, out)); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::tanh(fc(x)); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(TanhLayer);

// A root input layer, six body layers of odd sizes (padding at 2, 3 and 4 ranks), a root head.
// Every layer is converted to `dtype` as it is built, before it is sharded.
struct BuiltNetImpl : torch::nn::Module {
  static constexpr int64_t kDims[] = {16, 24, 13, 16, 20, 16, 16};

  BuiltNetImpl(Build how, const std::optional<ShardPlacement>& where, at::ScalarType dtype) {
    in = register_module("in", torch::nn::Linear(7, 16));
    in->to(dtype);
    body = register_module("body", torch::nn::Sequential());
    for (size_t i = 0; i + 1 < std::size(kDims); ++i) {
      TanhLayer layer(kDims[i], kDims[i + 1]);
      layer->to(dtype);
      switch (how) {
        case Build::Plain: body->push_back(layer); break;
        case Build::Marked: body->push_back(ShardedUnit(layer)); break;
        case Build::Sharded: body->push_back(fullyShard(layer, *where)); break;
      }
    }
    head = register_module("head", torch::nn::Linear(16, 5));
    head->to(dtype);
  }
  torch::Tensor forward(const torch::Tensor& x) { return head(body->forward(torch::tanh(in(x)))); }

  torch::nn::Linear in{nullptr};
  torch::nn::Sequential body{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(BuiltNet);

constexpr uint64_t kSeed = 11;

std::map<std::string, torch::Tensor> onePass(BuiltNet& net) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : net->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

std::map<std::string, torch::Tensor> toMap(std::vector<std::pair<std::string, at::Tensor>> v) {
  std::map<std::string, torch::Tensor> out;
  for (auto& [name, t] : v) out[name] = std::move(t);
  return out;
}

struct BuiltRun {
  int world = 2;
  Build how = Build::Sharded;
  at::ScalarType dtype = at::kFloat;
  int steps = 12;
  int micro = 2;                // micro-batches per step, all but the last under noSync()
  bool groups = false;          // weights and biases in optimizer groups of their own
  std::vector<uint64_t> seeds;  // per rank; empty: kSeed everywhere
};

BuiltRun builtRun(int world, Build how, at::ScalarType dtype = at::kFloat) {
  BuiltRun run;
  run.world = world;
  run.how = how;
  run.dtype = dtype;
  return run;
}

struct BuiltResult {
  std::vector<std::map<std::string, torch::Tensor>> initial;  // gathered before any step, by rank
  std::vector<std::map<std::string, torch::Tensor>> trained;  // after the steps, by rank
  std::vector<size_t> bodyBytesBuilt;  // the body's parameter storages once built, by rank
  int64_t bindCollectives = 0;  // rank 0's collectives from DDP's construction to the optimizer's
};

BuiltResult trainBuilt(const BuiltRun& how) {
  BuiltResult result;
  result.initial.resize(static_cast<size_t>(how.world));
  result.trained.resize(static_cast<size_t>(how.world));
  result.bodyBytesBuilt.resize(static_cast<size_t>(how.world));
  auto threads = ThreadWorld::create(how.world);
  threads->run([&](int rank) {
    const auto group = threadGroup(*threads, rank);
    const uint64_t seed = how.seeds.empty() ? kSeed : how.seeds[static_cast<size_t>(rank)];
    BuiltNet net = buildSeeded(
        seed, [&] { return BuiltNet(how.how, ShardPlacement(*group), how.dtype); });
    for (const auto& p : net->body->parameters()) {
      result.bodyBytesBuilt[static_cast<size_t>(rank)] += p.storage().nbytes();
    }
    net->to(
        how.dtype);  // what the whole model's conversion does to units sharded when built: nothing
    const int64_t issuedBefore = threads->issued(rank);
    DistributedDataParallel<BuiltNet> ddp(net, group);
    ZeroOptions zo;
    zo.stage = 3;
    std::vector<torch::optim::OptimizerParamGroup> groups;
    if (how.groups) {
      std::vector<torch::Tensor> weights, biases;
      for (const auto& p : ddp.module()->named_parameters()) {
        (p.key().find("bias") != std::string::npos ? biases : weights).push_back(p.value());
      }
      groups.emplace_back(weights);
      groups.emplace_back(biases, std::make_unique<torch::optim::AdamWOptions>(
                                      torch::optim::AdamWOptions(2e-2).weight_decay(0)));
    }
    ShardedOptimizer optimizer = how.groups ? ShardedOptimizer(ddp, groups, factoryFor("adamw"), zo)
                                            : ShardedOptimizer(ddp, factoryFor("adamw"), zo);
    if (rank == 0) result.bindCollectives = threads->issued(rank) - issuedBefore;
    result.initial[static_cast<size_t>(rank)] = toMap(gatherFullParameters(optimizer));
    ZeroRun run;
    run.world = how.world;
    for (int s = 0; s < how.steps; ++s) {
      optimizer.zero_grad();
      for (int m = 0; m < how.micro; ++m) {
        std::optional<NoSyncGuard> local;
        if (m + 1 < how.micro) local.emplace(ddp.core());
        auto [x, y] = wholeBatch(run, s, m, 7, 5);
        auto out = ddp(shard(x, rank, how.world).to(how.dtype)).to(torch::kFloat);
        (torch::mse_loss(out, shard(y, rank, how.world)) / how.micro).backward();
      }
      optimizer.step();
    }
    result.trained[static_cast<size_t>(rank)] = toMap(gatherFullParameters(optimizer));
  });
  return result;
}

void expectBitwise(const std::map<std::string, torch::Tensor>& got,
                   const std::map<std::string, torch::Tensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.count(name)) << what << ": " << name;
    EXPECT_TRUE(torch::equal(got.at(name), t)) << what << ": " << name;
  }
}

class ZeroBuiltUnitsRanks : public ::testing::TestWithParam<int> {};

// Built unit by unit at 2, 3 and 4 ranks: the gathered parameters are the one-process model's of
// the seed, bitwise, on every rank; 12 AdamW steps of two micro-batches (one under noSync())
// end bitwise where the same model built whole and sharded by the optimizer ends.
TEST_P(ZeroBuiltUnitsRanks, EqualTheOneProcessModelAndTrainAsTheModelBuiltWhole) {
  const int world = GetParam();
  BuiltNet plain = buildSeeded(kSeed,
                               [] { return BuiltNet(Build::Plain, std::nullopt, at::kFloat); });
  const auto reference = onePass(plain);
  const BuiltResult sharded = trainBuilt(builtRun(world, Build::Sharded));
  const BuiltResult whole = trainBuilt(builtRun(world, Build::Marked));
  for (int r = 0; r < world; ++r) {
    const std::string rank = "rank " + std::to_string(r);
    EXPECT_EQ(sharded.bodyBytesBuilt[r], 0u) << rank << ": the body holds no memory once built";
    expectBitwise(sharded.initial[r], reference, rank + ", as built");
    expectBitwise(sharded.trained[r], whole.trained[r], rank + ", trained");
  }
  EXPECT_GT(whole.bodyBytesBuilt[0], 0u);
  // One optimizer group: every unit takes its block as built, nothing is gathered to bind it.
  EXPECT_EQ(sharded.bindCollectives, whole.bindCollectives);
}

INSTANTIATE_TEST_SUITE_P(Ranks, ZeroBuiltUnitsRanks, ::testing::Values(2, 3, 4));

// bfloat16 layers (converted as built, float32 master shards): as above.
TEST(ZeroBuiltUnits, Bfloat16LayersEqualTheOneProcessModelAndTrainAsBuiltWhole) {
  BuiltNet plain = buildSeeded(kSeed,
                               [] { return BuiltNet(Build::Plain, std::nullopt, at::kBFloat16); });
  const auto reference = onePass(plain);
  const BuiltResult sharded = trainBuilt(builtRun(3, Build::Sharded, at::kBFloat16));
  const BuiltResult whole = trainBuilt(builtRun(3, Build::Marked, at::kBFloat16));
  for (int r = 0; r < 3; ++r) {
    expectBitwise(sharded.initial[r], reference, "as built");
    expectBitwise(sharded.trained[r], whole.trained[r], "trained");
  }
}

// Optimizer groups that split every unit (weights and biases apart) lay the units out otherwise
// than fullyShard did: each part is gathered once and handed over, and training is the same.
TEST(ZeroBuiltUnits, OptimizerGroupsThatSplitTheUnitsTrainAsBuiltWhole) {
  BuiltRun how = builtRun(3, Build::Sharded);
  how.groups = true;
  const BuiltResult sharded = trainBuilt(how);
  how.how = Build::Marked;
  const BuiltResult whole = trainBuilt(how);
  for (int r = 0; r < 3; ++r) expectBitwise(sharded.trained[r], whole.trained[r], "trained");
  EXPECT_EQ(sharded.bindCollectives, whole.bindCollectives + 6) << "each layer gathered once";
}

// The counting allocator's peak while rank r of 4 builds a model of eight 256 x 256 layers (the
// ranks' builds need no collective: they run here one after another): one layer in full plus
// the blocks kept, where the model built whole holds all eight.
TEST(ZeroBuiltUnits, BuildingHoldsOneUnitInFullAndKeepsAQuarterOfEach) {
  CountingCpuAllocator& counter = CountingCpuAllocator::install();
  constexpr int kRanks = 4;
  constexpr int64_t kWidth = 256;
  constexpr int kLayers = 8;
  const int64_t layerBytes = (kWidth * kWidth + kWidth) * 4;
  const int64_t blockBytes = (kWidth * kWidth + kWidth + kRanks - 1) / kRanks * 4;
  auto build = [&](const std::optional<ShardPlacement>& where) {
    torch::nn::Sequential body;
    for (int i = 0; i < kLayers; ++i) {
      torch::nn::Linear layer(kWidth, kWidth);
      if (where) {
        body->push_back(fullyShard(layer, *where));
      } else {
        body->push_back(ShardedUnit(layer));
      }
    }
    return body;
  };
  for (int r = 0; r < kRanks; ++r) {
    const int64_t before = counter.live();
    counter.resetPeak();
    torch::nn::Sequential body = buildSeeded(kSeed,
                                             [&] { return build(ShardPlacement(r, kRanks)); });
    const int64_t kept = counter.live() - before;
    const int64_t peak = counter.peak() - before;
    EXPECT_EQ(kept, kLayers * blockBytes) << "rank " << r << ": its block of each layer";
    EXPECT_LE(peak, kLayers * blockBytes + layerBytes) << "rank " << r;
    RecordProperty("peak_bytes_sharded_" + std::to_string(r), std::to_string(peak));
  }
  const int64_t before = counter.live();
  counter.resetPeak();
  torch::nn::Sequential whole = buildSeeded(kSeed, [&] { return build(std::nullopt); });
  EXPECT_GE(counter.peak() - before, kLayers * layerBytes);
}

// Every parameter in a unit sharded when built, none left to the root: DistributedDataParallel's
// own reducer has nothing to hold until the optimizer replaces it, and training is bitwise that
// of the same units built whole.
TEST(ZeroBuiltUnits, AModelOfUnitsOnlyTrainsAsBuiltWhole) {
  constexpr int kWorld = 2;
  std::vector<std::vector<std::map<std::string, torch::Tensor>>> trained(2);
  for (int sharded = 0; sharded < 2; ++sharded) {
    trained[sharded].resize(kWorld);
    auto threads = ThreadWorld::create(kWorld);
    threads->run([&](int rank) {
      const auto group = threadGroup(*threads, rank);
      torch::nn::Sequential net = buildSeeded(kSeed, [&] {
        torch::nn::Sequential s;
        for (int64_t i = 0; i < 3; ++i) {
          TanhLayer layer(i == 0 ? 7 : 9, i == 2 ? 5 : 9);
          s->push_back(sharded ? fullyShard(layer, *group) : ShardedUnit(layer));
        }
        return s;
      });
      DistributedDataParallel<torch::nn::Sequential> ddp(net, group);
      ZeroOptions zo;
      zo.stage = 3;
      ShardedOptimizer optimizer(ddp, factoryFor("adamw"), zo);
      ZeroRun run;
      run.world = kWorld;
      for (int s = 0; s < 4; ++s) {
        optimizer.zero_grad();
        auto [x, y] = wholeBatch(run, s, 0, 7, 5);
        torch::mse_loss(ddp(shard(x, rank, kWorld)), shard(y, rank, kWorld)).backward();
        optimizer.step();
      }
      trained[sharded][rank] = toMap(gatherFullParameters(optimizer));
    });
  }
  for (int r = 0; r < kWorld; ++r) expectBitwise(trained[1][r], trained[0][r], "trained");
}

// One rank built other values (another seed): every rank fails at the optimizer, naming the
// first unit and which ranks built what, instead of training a model no rank built.
TEST(ZeroBuiltUnits, RanksThatBuiltOtherValuesFailAlikeNamingTheUnit) {
  constexpr int kWorld = 3;
  std::vector<std::string> errors(kWorld);
  auto threads = ThreadWorld::create(kWorld);
  threads->run([&](int rank) {
    const auto group = threadGroup(*threads, rank);
    BuiltNet net = buildSeeded(rank == 2 ? kSeed + 1 : kSeed, [&] {
      return BuiltNet(Build::Sharded, ShardPlacement(*group), at::kFloat);
    });
    DistributedDataParallel<BuiltNet> ddp(net, group);
    ZeroOptions zo;
    zo.stage = 3;
    try {
      ShardedOptimizer optimizer(ddp, factoryFor("adamw"), zo);
    } catch (const Error& e) {
      errors[static_cast<size_t>(rank)] = e.what();
    }
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_NE(errors[r].find("unit body.0 was built with different values on ranks 0, 1 than "
                             "on rank 2"),
              std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find("torch::manual_seed"), std::string::npos) << errors[r];
  }
}

// Before a stage-3 optimizer holds it, a unit sharded when built cannot run, move or change its
// dtype (one message each, naming fullyShard), and stages 1 and 2 refuse the model.
TEST(ZeroBuiltUnits, AnUnboundUnitRefusesToRunOrConvertAndStageTwoRefusesIt) {
  auto threads = ThreadWorld::create(2);
  threads->run([&](int rank) {
    const auto group = threadGroup(*threads, rank);
    BuiltNet net = buildSeeded(
        kSeed, [&] { return BuiltNet(Build::Sharded, ShardPlacement(*group), at::kFloat); });
    auto expectRefused = [](const std::function<void()>& f, const std::string& what) {
      try {
        f();
        ADD_FAILURE() << what << " was not refused";
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("fullyShard"), std::string::npos) << e.what();
      }
    };
    expectRefused([&] { net->forward(torch::ones({2, 7})); }, "forward");
    expectRefused([&] { net->body->ptr(0)->to(at::kBFloat16); }, "to(bfloat16)");
    net->to(torch::kCPU);  // where it is: nothing to do
    DistributedDataParallel<BuiltNet> ddp(net, group);
    ZeroOptions zo;
    zo.stage = 2;
    expectRefused([&] { ShardedOptimizer refused(ddp, factoryFor("adamw"), zo); }, "stage 2");
  });
}

}  // namespace
}  // namespace dtrain::testing::zero3_build_test
