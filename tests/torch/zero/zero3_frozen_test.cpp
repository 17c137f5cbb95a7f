// ZeRO stage 3 with frozen parameters in marked modules (Note [Frozen units]): a LoRA-like model
// -- frozen base layers, small trained adapters -- trains as one process on the whole batch, the
// frozen base stays as it was and each rank keeps ~1/N of it between steps (also built unit by
// unit with fullyShard, which holds one unit in full at most), it is freed in backward before the
// backward ends, and checkpoints save, restore (at 2 and 3 ranks) and export it.
#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../checkpoint/checkpoint_support.h"
#include "counting_allocator.h"
#include "dtrain/torch/checkpoint.h"
#include "dtrain/torch/fully_shard.h"
#include "dtrain/torch/zero.h"
#include "test_support.h"
#include "zero_support.h"

namespace dtrain::testing::zero3_frozen_test {
namespace {

using Params = std::map<std::string, torch::Tensor>;

constexpr int64_t kBatch = 12;  // divides among 2 and 3 ranks
constexpr uint64_t kSeed = 11;

// y = base(x) + B(A(x)): base frozen, A and B (rank r, no bias) trained.
struct LoraLinearImpl : torch::nn::Module {
  LoraLinearImpl(int64_t in, int64_t out, int64_t r = 2) {
    base = register_module("base", torch::nn::Linear(in, out));
    a = register_module("a", torch::nn::Linear(torch::nn::LinearOptions(in, r).bias(false)));
    b = register_module("b", torch::nn::Linear(torch::nn::LinearOptions(r, out).bias(false)));
    for (auto& p : base->parameters()) p.set_requires_grad(false);
  }
  torch::Tensor forward(const torch::Tensor& x) { return base(x) + b(a(x)); }
  torch::nn::Linear base{nullptr}, a{nullptr}, b{nullptr};
};
TORCH_MODULE(LoraLinear);

// Two marked LoRA layers, a marked layer with frozen parameters only, a trained head and a frozen
// scale at the root (which stays whole). `where`: every unit sharded as it is built. `probe`,
// when set, sees the first layer's output's gradient: by then the backward of every later unit
// has run.
struct LoraNetImpl : torch::nn::Module {
  explicit LoraNetImpl(const ShardPlacement* where = nullptr) {
    auto mark = [&](auto module) {
      return where ? fullyShard(module, *where) : ShardedUnit(module);
    };
    first = register_module("first", mark(LoraLinear(7, 12)));
    second = register_module("second", mark(LoraLinear(12, 12)));
    torch::nn::Linear fixed(12, 12);
    for (auto& p : fixed->parameters()) p.set_requires_grad(false);
    frozen = register_module("frozen", mark(fixed));
    head = register_module("head", torch::nn::Linear(12, 5));
    scale = register_parameter("scale", torch::full({5}, 1.5), /*requires_grad=*/false);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = first(x);
    if (probe && h.requires_grad()) h.register_hook([this](torch::Tensor) { probe(); });
    return head(torch::tanh(frozen(torch::tanh(second(torch::tanh(h)))))) * scale;
  }
  ShardedUnit first{nullptr}, second{nullptr}, frozen{nullptr};
  torch::nn::Linear head{nullptr};
  torch::Tensor scale;
  std::function<void()> probe;
};
TORCH_MODULE(LoraNet);

std::pair<torch::Tensor, torch::Tensor> batchOf(int step) {
  return {randnSeeded({kBatch, 7}, 500 + step), randnSeeded({kBatch, 5}, 700 + step)};
}

Params namedCopy(torch::nn::Module& net) {
  Params out;
  for (const auto& p : net.named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

std::set<std::string> frozenNames(torch::nn::Module& net) {
  std::set<std::string> out;
  for (const auto& p : net.named_parameters()) {
    if (!p.value().requires_grad()) out.insert(p.key());
  }
  return out;
}

// Bytes of the storages of the frozen parameters of marked modules (each storage once).
size_t markedFrozenBytes(torch::nn::Module& net) {
  std::set<const void*> seen;
  size_t bytes = 0;
  for (const auto& m : net.modules(/*include_self=*/true)) {
    if (std::dynamic_pointer_cast<ShardedUnitImpl>(m) == nullptr) continue;
    for (const auto& p : m->parameters(/*recurse=*/true)) {
      if (p.requires_grad() || !seen.insert(p.storage().unsafeGetStorageImpl()).second) continue;
      bytes += p.storage().nbytes();
    }
  }
  return bytes;
}

// One process on the whole batch, with libtorch alone: what stage 3 must equal.
Params trainAlone(int steps, Params* initial = nullptr) {
  LoraNet net = buildSeeded(kSeed, [] { return LoraNet(); });
  if (initial) *initial = namedCopy(*net);
  std::vector<torch::Tensor> trained;
  for (const auto& p : net->parameters()) {
    if (p.requires_grad()) trained.push_back(p);
  }
  torch::optim::AdamW adam(trained, torch::optim::AdamWOptions(1e-2).weight_decay(0.05));
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = batchOf(s);
    adam.zero_grad();
    torch::mse_loss(net->forward(x), y).backward();
    adam.step();
  }
  return namedCopy(*net);
}

// What one stage-3 run ends with.
struct FrozenRun {
  std::vector<Params> params;     // by rank, gatherFullParameters() plus the root's frozen scale
  size_t frozenBytes = 0;         // rank 0, between steps: ZeroMemory::frozen
  size_t frozenStorageBytes = 1;  // rank 0, between steps: the marked frozen storages
  size_t frozenOwned = 0;         // rank 0: the frozen units' blocks, padded
  int64_t frozenElements = 0;     // ZeroStats::frozen
  bool freedBeforeBackwardEnded = false;  // rank 0, every step
};

FrozenRun trainStage3(int world, bool built, int steps) {
  FrozenRun result;
  result.params.resize(static_cast<size_t>(world));
  auto threads = ThreadWorld::create(world);
  threads->run([&](int rank) {
    auto group = threadGroup(*threads, rank);
    const ShardPlacement placement(*group);
    LoraNet net = buildSeeded(kSeed, [&] { return LoraNet(built ? &placement : nullptr); });
    DistributedDataParallel<LoraNet> ddp(net, group);
    ZeroOptions zo;
    zo.stage = 3;
    ShardedOptimizer adam(ddp, factoryFor("adamw"), zo);
    bool freedEarly = true;
    net->probe = [&] {
      // The first layer's output's gradient: the later units' backward is done, and with it
      // every node reading their frozen parameters.
      for (ShardedUnit* unit : {&net->second, &net->frozen}) {
        freedEarly = freedEarly && markedFrozenBytes(**unit) == 0;
      }
    };
    for (int s = 0; s < steps; ++s) {
      auto [x, y] = batchOf(s);
      adam.zero_grad();
      torch::mse_loss(ddp(shard(x, rank, world)), shard(y, rank, world)).backward();
      adam.step();
    }
    const ZeroStats stats = adam.stats();
    const size_t storages = markedFrozenBytes(*net);
    Params mine;
    for (auto& [name, t] : gatherFullParameters(adam)) mine[name] = t;
    mine["scale"] = net->scale.detach().clone();
    result.params[static_cast<size_t>(rank)] = std::move(mine);
    if (rank != 0) return;
    result.frozenBytes = stats.memory.frozen;
    result.frozenStorageBytes = storages;
    result.frozenElements = stats.frozen;
    result.freedBeforeBackwardEnded = freedEarly;
  });
  return result;
}

// Max |got - want| <= 1e-5 max(1, max |want|).
void expectClose(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
  const double scale = std::max(1.0, want.abs().max().item<double>());
  EXPECT_LE((got - want).abs().max().item<double>(), 1e-5 * scale) << what;
}

class ZeroStage3Frozen : public ::testing::TestWithParam<std::tuple<int, bool>> {};

// AdamW over 2 and 3 ranks, the units built whole or sharded as built: the adapters and the head
// equal one process's training on the whole batch, the frozen parameters equal their initial
// values on every rank, and the ranks agree bitwise. Between steps a rank's frozen parameters
// are its blocks only (the marked modules' frozen storages hold nothing), and they were freed in
// backward as soon as the units' backward had run.
TEST_P(ZeroStage3Frozen, LoraAdaptersTrainAsOneProcessAndTheBaseStaysAndIsSharded) {
  const auto [world, built] = GetParam();
  constexpr int kSteps = 6;
  Params initial;
  const Params alone = trainAlone(kSteps, &initial);
  const FrozenRun run = trainStage3(world, built, kSteps);
  LoraNet probe = buildSeeded(kSeed, [] { return LoraNet(); });
  const std::set<std::string> frozen = frozenNames(*probe);
  ASSERT_EQ(frozen.size(), 7u);  // 3 x (weight, bias) and the scale
  for (int r = 0; r < world; ++r) {
    const Params& got = run.params[static_cast<size_t>(r)];
    ASSERT_EQ(got.size(), alone.size()) << "rank " << r << ": every parameter, frozen ones too";
    for (const auto& [name, want] : alone) {
      ASSERT_TRUE(got.count(name)) << name;
      if (frozen.count(name)) {
        EXPECT_TRUE(torch::equal(got.at(name), initial.at(name))) << name << " moved";
      } else {
        EXPECT_FALSE(torch::equal(got.at(name), initial.at(name))) << name << " never trained";
        expectClose(got.at(name), want, fmt::format("rank {}: {}", r, name));
      }
      EXPECT_TRUE(torch::equal(got.at(name), run.params[0].at(name)))
          << "rank " << r << " " << name;
    }
  }
  // Frozen in marked modules: first.base 96, second.base 156, frozen 156 elements.
  EXPECT_EQ(run.frozenElements, 96 + 156 + 156);
  int64_t owned = 0;
  for (int64_t n : {96, 156, 156}) owned += (n + world - 1) / world;
  EXPECT_EQ(run.frozenBytes, static_cast<size_t>(owned) * 4);
  EXPECT_LE(run.frozenBytes, (96 + 156 + 156) * 4 / world + 3 * (world - 1) * 4);
  EXPECT_EQ(run.frozenStorageBytes, 0u) << "a frozen parameter of a marked module stayed whole";
  EXPECT_TRUE(run.freedBeforeBackwardEnded);
  RecordProperty("frozen_bytes_per_rank", std::to_string(run.frozenBytes));
  RecordProperty("frozen_bytes_total", std::to_string((96 + 156 + 156) * 4));
}

INSTANTIATE_TEST_SUITE_P(Ranks, ZeroStage3Frozen,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Bool()),
                         [](const auto& info) {
                           return fmt::format("{}ranks{}", std::get<0>(info.param),
                                              std::get<1>(info.param) ? "Built" : "");
                         });

// The counting allocator's peak while rank r of 4 builds eight LoRA layers of a 256 x 256 frozen
// base (the ranks' builds need no collective: they run one after another here): one layer in
// full plus the blocks kept -- of the frozen base too --, where the model built whole holds all.
TEST(ZeroStage3FrozenBuilt, BuildingHoldsOneLayerInFullAndAQuarterOfTheBase) {
  CountingCpuAllocator& counter = CountingCpuAllocator::install();
  constexpr int kRanks = 4;
  constexpr int64_t kWidth = 256;
  constexpr int64_t kRank = 4;
  constexpr int kLayers = 8;
  const int64_t baseNumel = kWidth * kWidth + kWidth;
  const int64_t adapterNumel = 2 * kWidth * kRank;
  const int64_t layerBytes = (baseNumel + adapterNumel) * 4;
  const int64_t blockBytes =
      ((baseNumel + kRanks - 1) / kRanks + (adapterNumel + kRanks - 1) / kRanks) * 4;
  auto build = [&](const std::optional<ShardPlacement>& where) {
    torch::nn::Sequential body;
    for (int i = 0; i < kLayers; ++i) {
      LoraLinear layer(kWidth, kWidth, kRank);
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
    EXPECT_EQ(markedFrozenBytes(*body), 0u) << "rank " << r;
    RecordProperty("peak_bytes_sharded_" + std::to_string(r), std::to_string(peak));
  }
  const int64_t before = counter.live();
  counter.resetPeak();
  torch::nn::Sequential whole = buildSeeded(kSeed, [&] { return build(std::nullopt); });
  EXPECT_GE(counter.peak() - before, kLayers * layerBytes);
}

// --- checkpoints ---

std::string stepFile(const std::string& dir, int node, int64_t step) {
  return fmt::format("{}/node{}/step-{:08d}", dir, node, step);
}

// One leg on `world` ranks, each its own node under `dir`: restores when asked, trains steps
// [from, to), saves the steps in `saves`; ends with rank 0's parameters (gathered, the scale too)
// right after the restore and at the end.
struct Leg {
  std::string dir;
  int world = 2;
  int from = 0, to = 0;
  std::vector<int64_t> saves;
  bool restore = false;
  Params loaded, end;
  bool ranksAgree = true;
};

void runLeg(Leg& leg) {
  auto threads = ThreadWorld::create(leg.world);
  auto store = std::make_shared<store::HashStore>();
  std::mutex mutex;
  std::vector<Params> ends(static_cast<size_t>(leg.world));
  threads->run([&](int rank) {
    auto group = threadGroup(*threads, rank);
    // Another start than the run that saved (frozen values too): the restore decides.
    LoraNet net = buildSeeded(kSeed + (leg.restore ? 50 : 0), [] { return LoraNet(); });
    DistributedDataParallel<LoraNet> ddp(net, group);
    ZeroOptions zo;
    zo.stage = 3;
    ShardedOptimizer adam(ddp, factoryFor("adamw"), zo);
    CheckpointOptions options = optionsFor(leg.dir);
    options.nodeId = rank;
    options.localRank = 0;
    options.store = store;
    options.allowWorldSizeChange = true;
    Checkpointer checkpointer(group, options);
    checkpointer.addModule("model", net);
    checkpointer.addOptimizer("adam", adam);
    auto gathered = [&] {
      Params out;
      for (auto& [name, t] : gatherFullParameters(adam)) out[name] = t;
      out["scale"] = net->scale.detach().clone();
      return out;
    };
    if (leg.restore) {
      checkpointer.restore();
      Params loaded = gathered();
      std::lock_guard<std::mutex> lock(mutex);
      if (rank == 0) leg.loaded = loaded;
    }
    for (int s = leg.from; s < leg.to; ++s) {
      auto [x, y] = batchOf(s);
      adam.zero_grad();
      torch::mse_loss(ddp(shard(x, rank, leg.world)), shard(y, rank, leg.world)).backward();
      adam.step();
      if (std::count(leg.saves.begin(), leg.saves.end(), s)) checkpointer.save(s);
    }
    Params end = gathered();
    std::lock_guard<std::mutex> lock(mutex);
    ends[static_cast<size_t>(rank)] = end;
  });
  leg.end = ends[0];
  for (const auto& other : ends) {
    for (const auto& [name, t] : leg.end) {
      leg.ranksAgree = leg.ranksAgree && torch::equal(other.at(name), t);
    }
  }
}

void expectSame(const Params& got, const Params& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.count(name)) << what << ": " << name;
    EXPECT_TRUE(torch::equal(got.at(name), t)) << what << ": " << name;
  }
}

// Saved at step 2 by 2 ranks: a frozen base is one owned entry per rank (never gathered); 2 ranks
// restore it bitwise and train on bitwise as the run never stopped; 3 ranks restore it as saved;
// an export of the step holds it.
TEST(ZeroStage3FrozenCheckpoint, SavedAtTwoRanksRestoresAtTwoAndThreeAndExports) {
  TempDir tmp;
  Leg whole;
  whole.dir = tmp.file("whole");
  whole.to = 5;
  runLeg(whole);
  Leg first;
  first.dir = tmp.file("ckpt");
  first.to = 3;
  first.saves = {2};
  runLeg(first);
  for (int node = 0; node < 2; ++node) {
    const std::string file = stepFile(first.dir, node, 2);
    EXPECT_EQ(verifyErrorOf(file), "");
    auto reader = checkpoint::CheckpointReader::open(file);
    for (const char* name : {"module/model/second.base.weight", "module/model/frozen.weight"}) {
      std::set<uint32_t> owners;
      for (const auto* e : reader.find(name)) owners.insert(e->owner);
      EXPECT_EQ(owners, (std::set<uint32_t>{0, 1})) << file << " " << name;
    }
  }
  Leg again;
  again.dir = first.dir;
  again.from = 3;
  again.to = 5;
  again.restore = true;
  runLeg(again);
  expectSame(again.loaded, first.end, "restored at 2 ranks");
  expectSame(again.end, whole.end, "trained on after the restore");
  EXPECT_TRUE(again.ranksAgree);

  Leg three;
  three.dir = first.dir;
  three.world = 3;
  three.from = 3;
  three.to = 3;
  three.restore = true;  // node 2 is new: it copies the step from a peer
  runLeg(three);
  expectSame(three.loaded, first.end, "restored at 3 ranks");
  EXPECT_TRUE(three.ranksAgree);

  exportStateDict({stepFile(first.dir, 0, 2), stepFile(first.dir, 1, 2)}, tmp.file("model.pt"));
  const std::string bytes = readFile(tmp.file("model.pt"));
  auto dict = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end())).toGenericDict();
  EXPECT_EQ(dict.size(), first.end.size());
  for (const auto& [name, t] : first.end) {
    ASSERT_TRUE(dict.contains(name)) << name;
    EXPECT_TRUE(torch::equal(dict.at(name).toTensor(), t)) << name;
  }
}

}  // namespace
}  // namespace dtrain::testing::zero3_frozen_test
