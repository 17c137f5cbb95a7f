#pragma once
// Models and one training loop of the ZeRO stage-3 tests, shared by the tests with ranks as
// threads (zero3_test.cpp) and the real-process worker (tests/torch/zero/zero_worker.cpp): the
// same run under plain DDP with AdamW or under a stage-2/3 ShardedOptimizer, so the two can be
// compared step for step.

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <type_traits>

#include <torch/torch.h>

#include "dtrain/torch/autocast.h"
#include "dtrain/torch/fully_shard.h"
#include "zero_support.h"

namespace dtrain::testing {

// Four marked layers (their Tanh children marked too, with nothing to shard), and a head
// outside every marked module: the root's unit. Sizes 128, 272, 187 and 108 elements: padding
// at 2 ranks.
struct Zero3NetImpl : torch::nn::Module {
  explicit Zero3NetImpl(ShardedUnitOptions o = {}) {
    body = register_module(
        "body", shardEveryChild(torch::nn::Sequential(torch::nn::Linear(7, 16), torch::nn::Tanh(),
                                                      torch::nn::Linear(16, 16), torch::nn::Tanh(),
                                                      torch::nn::Linear(16, 11), torch::nn::Tanh(),
                                                      torch::nn::Linear(11, 9)),
                                o));
    head = register_module("head", torch::nn::Linear(9, 5));
  }
  torch::Tensor forward(const torch::Tensor& x) { return head(body->forward(x)); }
  torch::nn::Sequential body{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Zero3Net);

// A ShardedUnit of `module`: sharded as it is built (fullyShard) when `where` is given, else
// by the optimizer.
template <typename Holder>
ShardedUnit markUnit(const Holder& module, ShardedUnitOptions o, const ShardPlacement* where) {
  return where ? fullyShard(module, *where, o) : ShardedUnit(module, o);
}

// Nesting and reuse: a marked block with a parameter of its own around a marked layer (the block
// owns `scale`, the layer its weight and bias), and a marked layer called twice in one forward
// (its second boundary, met first in backward, gathers it; the first finds it gathered).
struct Zero3BlockImpl : torch::nn::Module {
  explicit Zero3BlockImpl(int64_t n, ShardedUnitOptions o = {},
                          const ShardPlacement* where = nullptr) {
    scale = register_parameter("scale", torch::full({n}, 0.5));
    inner = register_module("inner", markUnit(torch::nn::Linear(n, n), o, where));
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::tanh(inner(x) * scale) + x; }
  torch::Tensor scale;
  ShardedUnit inner{nullptr};
};
TORCH_MODULE(Zero3Block);

struct Zero3NestedNetImpl : torch::nn::Module {
  // `where`: every unit sharded as it is built (the block's inner layer before the block).
  explicit Zero3NestedNetImpl(ShardedUnitOptions o = {}, const ShardPlacement* where = nullptr) {
    in = register_module("in", markUnit(torch::nn::Linear(7, 12), o, where));
    block = register_module("block", markUnit(Zero3Block(12, o, where), o, where));
    twice = register_module("twice", markUnit(torch::nn::Linear(12, 12), o, where));
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
  explicit Zero3UnusedNetImpl(ShardedUnitOptions o = {}) {
    in = register_module("in", ShardedUnit(torch::nn::Linear(7, 12), o));
    partly = register_module("partly", ShardedUnit(Zero3PartlyUsed(12), o));
    never = register_module("never", ShardedUnit(torch::nn::Linear(12, 12), o));
    head = register_module("head", torch::nn::Linear(12, 5));
  }
  torch::Tensor forward(const torch::Tensor& x) { return head(partly(in(x))); }
  ShardedUnit in{nullptr}, partly{nullptr}, never{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Zero3UnusedNet);

// Tied parameters: a module using a weight it may share, with a bias of its own.
struct Zero3TiedUseImpl : torch::nn::Module {
  explicit Zero3TiedUseImpl(torch::Tensor w) {
    weight = register_parameter("weight", std::move(w));
    bias = register_parameter("bias", torch::full({weight.size(0)}, 0.1));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::tanh(torch::linear(x, weight, bias));
  }
  torch::Tensor weight, bias;
};
TORCH_MODULE(Zero3TiedUse);

// Two marked users of one weight, inside this module: the weight is this module's.
struct Zero3TiedPairImpl : torch::nn::Module {
  explicit Zero3TiedPairImpl(ShardedUnitOptions o = {}) {
    torch::Tensor w = torch::randn({12, 12}) * 0.3;
    c = register_module("c", ShardedUnit(Zero3TiedUse(w), o));
    d = register_module("d", ShardedUnit(Zero3TiedUse(w), o));
  }
  torch::Tensor forward(const torch::Tensor& x) { return d(c(x)); }
  ShardedUnit c{nullptr}, d{nullptr};
};
TORCH_MODULE(Zero3TiedPair);

// `a` and `b`, marked siblings, share a weight that no marked module holds both of: the root's.
// Inside the marked `pair`, `c` and `d` share another: pair's. Each user's bias is its own.
struct Zero3TiedNetImpl : torch::nn::Module {
  explicit Zero3TiedNetImpl(ShardedUnitOptions o = {}) {
    in = register_module("in", ShardedUnit(torch::nn::Linear(7, 12), o));
    torch::Tensor w = torch::randn({12, 12}) * 0.3;
    a = register_module("a", ShardedUnit(Zero3TiedUse(w), o));
    b = register_module("b", ShardedUnit(Zero3TiedUse(w), o));
    pair = register_module("pair", ShardedUnit(Zero3TiedPair(o), o));
    head = register_module("head", torch::nn::Linear(12, 5));
  }
  torch::Tensor forward(const torch::Tensor& x) { return head(pair(b(a(in(x))))); }
  ShardedUnit in{nullptr}, a{nullptr}, b{nullptr}, pair{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Zero3TiedNet);

// Bytes of the parameter storages of every marked module (each parameter once).
inline size_t markedBytes(torch::nn::Module& net) {
  size_t bytes = 0;
  for (const auto& m : net.modules(/*include_self=*/true)) {
    if (std::dynamic_pointer_cast<ShardedUnitImpl>(m) == nullptr) continue;
    for (const auto& p : m->parameters(/*recurse=*/false)) bytes += p.storage().nbytes();
  }
  return bytes;
}

struct Zero3Run {
  Zero3Run(int worldSize = 2, int zeroStage = 3, int stepCount = 30,
           at::ScalarType paramType = at::kFloat, bool unused = false)
      : world(worldSize),
        stage(zeroStage),
        steps(stepCount),
        dtype(paramType),
        findUnused(unused) {}
  int world = 2;
  int stage = 3;  // 0: DDP with torch::optim::AdamW; 2, 3: a ShardedOptimizer over the same
  int steps = 30;
  at::ScalarType dtype = at::kFloat;  // of the parameters (16-bit: float32 master shards)
  bool findUnused = false;
  // >= 0: an enabled GradScaler, and at this step the last rank's gradient of the model's first
  // parameter gets an inf (after the reduce-scatter only its owner sees it).
  int overflowStep = -1;
  int micro = 1;                 // micro-batches per step, all but the last under noSync()
  bool forwardPrefetch = false;  // ZeroOptions'
  bool backwardPrefetch = true;
  ShardedUnitOptions unit;                    // of every marked module
  std::optional<at::ScalarType> reduceDtype;  // ZeroOptions'
  // Every unit sharded as it is built (fullyShard; Zero3NestedNet only, float32).
  bool builtSharded = false;
  bool offload = false;  // ZeroOptions'
  // ZeroOptions'; set, every forward runs under autocast.
  std::optional<at::ScalarType> paramDtype;
  // ZeroOptions::Accumulation::Local (noSync() keeps full gradients) instead of the default.
  bool localAccumulation = false;
  bool abandoned = false;              // ZeroRun's
  std::string zeroGrad = "optimizer";  // ZeroRun's
};

// What a run measured on one rank.
struct Zero3Probes {
  // Step 0: bytes of the marked modules' parameter storages once the first forward has
  // returned, and once the first backward has (a noSync() one when there are micro-batches).
  size_t markedAfterForward = 1;
  size_t markedAfterBackward = 1;
  // After the last step: the same, and the bytes of the head's one storage (the root's unit:
  // weight and bias are views of it).
  size_t markedBytes = 1;
  size_t headBytes = 0;
  // After the last step, stage 3: stats().memory.parameters, and the owned blocks' bytes.
  size_t parameterBytes = 0;
  size_t ownedBytes = 0;
  // Stage 3, stats() after the last step: the last step's unit gathers and how many of them were
  // prefetched; the most full-parameter bytes of marked units held at once in the run; the
  // padded bytes of the two largest resharded units together.
  size_t unitGathers = 0;
  size_t prefetchedGathers = 0;
  size_t peakGathered = 0;
  size_t twoLargestUnits = 0;
  int64_t skipped = 0;  // the GradScaler's
  // stats() after the last step: master weights and what offload moved to the host.
  size_t masterBytes = 0;
  size_t offloadedBytes = 0;
};

// What one rank ends a run with.
struct Zero3RankResult : Zero3Probes {
  std::map<std::string, torch::Tensor> params;  // gathered in full
};

// One rank's part of a run of `Net` (one of the Zero3*Net above) in `group`.
template <typename Net>
Zero3RankResult trainZero3OnRank(const Zero3Run& how, const std::shared_ptr<ProcessGroup>& group) {
  const int world = how.world;
  const int rank = group->rank();
  const at::ScalarType dtype = how.dtype;
  Zero3RankResult result;
  ZeroRun run;
  run.world = world;
  const ShardPlacement placement(*group);
  Net net = buildSeeded(run.seed, [&] {
    if constexpr (std::is_constructible_v<typename Net::ContainedType, ShardedUnitOptions,
                                          const ShardPlacement*>) {
      if (how.builtSharded) return Net(how.unit, &placement);
    }
    return Net(how.unit);
  });
  net->to(dtype);
  DdpOptions ddpOptions;
  ddpOptions.findUnusedParameters = how.findUnused;
  DistributedDataParallel<Net> ddp(net, group, ddpOptions);
  OptimizerFactory factory = factoryFor("adamw");
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  ShardedOptimizer* sharded = nullptr;
  if (how.stage == 0) {
    optimizer = factory.make({torch::optim::OptimizerParamGroup(ddp.parameters())});
  } else {
    ZeroOptions zo;
    zo.stage = how.stage;
    zo.forwardPrefetch = how.forwardPrefetch;
    zo.backwardPrefetch = how.backwardPrefetch;
    zo.reduceDtype = how.reduceDtype;
    zo.offload = how.offload;
    zo.paramDtype = how.paramDtype;
    if (how.localAccumulation) zo.accumulation = ZeroOptions::Accumulation::Local;
    auto owned = std::make_unique<ShardedOptimizer>(ddp, factory, zo);
    sharded = owned.get();
    optimizer = std::move(owned);
  }
  GradScalerOptions so;
  so.enabled = how.overflowStep >= 0;
  GradScaler scaler(group, so);
  run.zeroGrad = how.zeroGrad;
  for (int s = 0; s < how.steps; ++s) {
    if (how.abandoned) {
      auto guard = ddp.noSync();
      auto [x, y] = wholeBatch(run, s, 1000, 7, 5);  // data no step trains on
      torch::mse_loss(ddp(shard(x, rank, world).to(dtype)).to(torch::kFloat), shard(y, rank, world))
          .backward();
    }
    zeroGradients(run, *net, *optimizer, sharded);
    for (int m = 0; m < how.micro; ++m) {
      std::optional<NoSyncGuard> local;
      if (m + 1 < how.micro) local.emplace(ddp.core());  // what ddp.noSync() returns
      auto [x, y] = wholeBatch(run, s, m, 7, 5);
      torch::Tensor out;
      {
        AutocastGuard autocast(torch::kCPU, how.paramDtype.has_value());
        out = ddp(shard(x, rank, world).to(dtype)).to(torch::kFloat);
      }
      auto loss = torch::mse_loss(out, shard(y, rank, world)) / how.micro;
      if (s == 0 && m == 0) result.markedAfterForward = markedBytes(*net);
      const bool poison = s == how.overflowStep && rank == world - 1 && m + 1 == how.micro;
      torch::Tensor first = net->parameters().front();
      const unsigned hook = poison ? first.register_hook([](torch::Tensor g) {
        g = g.clone();
        g.view(-1)[0] = std::numeric_limits<double>::infinity();
        return g;
      })
                                   : 0;
      scaler.scale(loss).backward();
      if (poison) first.remove_hook(hook);
      if (s == 0 && m == 0) result.markedAfterBackward = markedBytes(*net);
    }
    scaler.step(*optimizer);
    scaler.update();
  }
  result.skipped = scaler.skippedSteps();
  result.markedBytes = markedBytes(*net);
  result.headBytes = net->head->weight.storage().nbytes();
  if (sharded && how.stage == 3) {
    result.parameterBytes = sharded->stats().memory.parameters;
    result.ownedBytes = static_cast<size_t>(sharded->layout().shardNumel()) *
                        c10::elementSize(dtype);
    const ZeroStats stats = sharded->stats();
    result.unitGathers = stats.unitGathers;
    result.prefetchedGathers = stats.prefetchedGathers;
    result.peakGathered = stats.memory.peakGathered;
    result.masterBytes = stats.memory.masterWeights;
    result.offloadedBytes = stats.memory.offloaded;
    // The root's unit (the head, one dtype) is the last one: Note [ZeRO-3 unit lifecycle].
    const auto& units = sharded->layout().units;
    std::vector<size_t> sizes;
    for (size_t k = 0; k + 1 < units.size(); ++k) {
      sizes.push_back(static_cast<size_t>(units[k].paddedNumel(world)) * units[k].elementSize);
    }
    std::sort(sizes.rbegin(), sizes.rend());
    for (size_t i = 0; i < sizes.size() && i < 2; ++i) result.twoLargestUnits += sizes[i];
  }
  if (sharded) {
    for (auto& [name, t] : gatherFullParameters(*sharded)) result.params[name] = t;
  } else {
    std::set<const void*> seen;  // a tied parameter under its first name, as DDP and ZeRO keep it
    for (const auto& p : net->named_parameters()) {
      if (seen.insert(p.value().unsafeGetTensorImpl()).second) {
        result.params[p.key()] = p.value().detach().clone();
      }
    }
  }
  return result;
}

// Every rank's result of a run, ranks as threads; the probes are rank 0's.
struct Zero3Result : Zero3Probes {
  std::vector<std::map<std::string, torch::Tensor>> params;  // by rank
};

template <typename Net>
Zero3Result trainZero3(const Zero3Run& how) {
  Zero3Result result;
  result.params.resize(static_cast<size_t>(how.world));
  auto threads = ThreadWorld::create(how.world);
  threads->run([&](int rank) {
    Zero3RankResult mine = trainZero3OnRank<Net>(how, threadGroup(*threads, rank));
    result.params[static_cast<size_t>(rank)] = std::move(mine.params);
    if (rank == 0) static_cast<Zero3Probes&>(result) = mine;
  });
  return result;
}

}  // namespace dtrain::testing
