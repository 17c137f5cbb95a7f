#pragma once
// Helpers of the ZeRO tests (ranks as threads): one training loop that runs under plain DDP with
// a libtorch optimizer or under a ShardedOptimizer, so the two can be compared step for step.

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "../ddp/ddp_models.h"
#include "../ddp/ddp_support.h"
#include "dtrain/torch/grad_scaler.h"
#include "dtrain/torch/zero.h"

namespace dtrain::testing {

// What a run trains and how. `stage` 0: DDP with the libtorch optimizer itself.
struct ZeroRun {
  int world = 2;
  int stage = 0;
  int steps = 10;
  int micro = 1;                    // micro-batches per step, all but the last under noSync()
  int perRank = 4;                  // samples per rank and micro-batch
  std::string optimizer = "adamw";  // adamw | sgd-groups | adam
  bool scaler = false;              // an enabled GradScaler
  // This step's last micro-batch on `overflowRank` writes +inf into one element of one gradient
  // (fc1.weight[0][0]): after the reduce-scatter only the rank owning that element sees it.
  int overflowStep = -1;
  int overflowRank = 1;
  double clip = 0;         // > 0: clip the gradients' norm to this (after unscale)
  size_t unitBytes = 256;  // small units: several per model, most with padding
  at::ScalarType dtype = at::kFloat;
  uint64_t seed = 3;
  bool deferAllgatherWait = false;  // ZeroOptions'
  // ZeroOptions::Accumulation::Local (noSync() keeps full gradients) instead of the default.
  bool localAccumulation = false;
  // Each step first runs a micro-batch under noSync() that its zero_grad() then drops (an
  // accumulation abandoned, an epoch's leftover micro-batches).
  bool abandoned = false;
  // Who drops the gradients at the start of each step: "optimizer" (the ShardedOptimizer's, or
  // the libtorch optimizer's under DDP), "module" (the module's, zeroing in place:
  // zero_grad(false)) or "module-none" (the module's, set_to_none).
  std::string zeroGrad = "optimizer";
};

// Drops the gradients as `run.zeroGrad` says.
inline void zeroGradients(const ZeroRun& run, torch::nn::Module& net,
                          torch::optim::Optimizer& optimizer, ShardedOptimizer* sharded) {
  if (run.zeroGrad == "module") {
    net.zero_grad(/*set_to_none=*/false);
  } else if (run.zeroGrad == "module-none") {
    net.zero_grad(/*set_to_none=*/true);
  } else if (sharded) {
    sharded->zero_grad();  // its own (the API tests call libtorch's)
  } else {
    optimizer.zero_grad();
  }
}

// What a run ends with, per rank: the module's parameters (by name), their norms before clipping.
struct ZeroResult {
  std::vector<std::map<std::string, torch::Tensor>> params;  // by rank
  std::vector<double> clipNorms;                             // rank 0's
  int64_t skipped = 0;                                       // rank 0's scaler
};

inline OptimizerFactory factoryFor(const std::string& name) {
  if (name == "sgd-groups") {
    return optimizerFactory<torch::optim::SGD>(
        torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-3));
  }
  if (name == "adam") return optimizerFactory<torch::optim::Adam>(torch::optim::AdamOptions(1e-2));
  return optimizerFactory<torch::optim::AdamW>(torch::optim::AdamWOptions(1e-2).weight_decay(0.05));
}

// sgd-groups: weights at the defaults, biases in a group of their own with another learning rate
// and no momentum.
inline std::vector<torch::optim::OptimizerParamGroup> groupsFor(const std::string& name,
                                                                torch::nn::Module& net) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (name != "sgd-groups") return groups;
  std::vector<torch::Tensor> weights, biases;
  for (const auto& p : net.named_parameters()) {
    (p.key().find("bias") != std::string::npos ? biases : weights).push_back(p.value());
  }
  groups.emplace_back(weights);
  groups.emplace_back(biases, std::make_unique<torch::optim::SGDOptions>(
                                  torch::optim::SGDOptions(0.1).momentum(0).weight_decay(0)));
  return groups;
}

// Ranks as threads share libtorch's default generator, so concurrent draws interleave: data
// comes from generators of its own, and models are built under one lock after seeding.
inline torch::Tensor randnSeeded(at::IntArrayRef sizes, uint64_t seed) {
  return torch::randn(sizes, at::detail::createCPUGenerator(seed));
}
template <typename Make>
auto buildSeeded(uint64_t seed, Make make) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  torch::manual_seed(seed);
  return make();
}

// The whole batch of step s, micro-batch m: the same on every rank, each takes its rows.
inline std::pair<torch::Tensor, torch::Tensor> wholeBatch(const ZeroRun& run, int s, int m,
                                                          int64_t in, int64_t out) {
  const uint64_t seed = 1000 + 31 * s + m;
  return {randnSeeded({run.world * run.perRank, in}, seed),
          randnSeeded({run.world * run.perRank, out}, seed + 7919)};
}

// What one rank ends a run with.
struct RankResult {
  std::map<std::string, torch::Tensor> params;
  std::vector<double> clipNorms;
  int64_t skipped = 0;
};

// One rank's part of a run: trains Mlp(7, 13, 5) (356 parameters: not a multiple of 3, in units
// of odd sizes) in `group`. Ranks as threads (trainMlp) and real processes (zero_worker) share it.
inline RankResult trainOnRank(const ZeroRun& run, const std::shared_ptr<ProcessGroup>& group,
                              const std::function<void(ShardedOptimizer&)>& atEnd = {}) {
  const int rank = group->rank();
  Mlp net = buildSeeded(run.seed, [] { return Mlp(7, 13, 5); });
  net->to(run.dtype);
  DdpOptions ddpOptions;
  ddpOptions.firstBucketBytes = 256;
  ddpOptions.bucketBytes = 1024;
  DistributedDataParallel<Mlp> ddp(net, group, ddpOptions);
  OptimizerFactory factory = factoryFor(run.optimizer);
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  ShardedOptimizer* sharded = nullptr;
  if (run.stage == 0) {
    auto groups = groupsFor(run.optimizer, *net);
    if (groups.empty()) groups.emplace_back(ddp.parameters());
    optimizer = factory.make(std::move(groups));
  } else {
    ZeroOptions zo;
    zo.stage = run.stage;
    zo.firstUnitBytes = run.unitBytes / 2;
    zo.unitBytes = run.unitBytes;
    zo.deferAllgatherWait = run.deferAllgatherWait;
    if (run.localAccumulation) zo.accumulation = ZeroOptions::Accumulation::Local;
    auto owned = std::make_unique<ShardedOptimizer>(ddp, groupsFor(run.optimizer, *net), factory,
                                                    zo);
    sharded = owned.get();
    optimizer = std::move(owned);
  }
  GradScalerOptions so;
  so.enabled = run.scaler;
  GradScaler scaler(group, so);
  RankResult result;
  for (int s = 0; s < run.steps; ++s) {
    if (run.abandoned) {
      auto guard = ddp.noSync();
      auto [x, y] = wholeBatch(run, s, 1000, 7, 5);  // data no step trains on
      torch::mse_loss(ddp(shard(x, rank, run.world).to(run.dtype)).to(torch::kFloat),
                      shard(y, rank, run.world))
          .backward();
    }
    zeroGradients(run, *net, *optimizer, sharded);
    for (int m = 0; m < run.micro; ++m) {
      auto [x, y] = wholeBatch(run, s, m, 7, 5);
      auto forwardBackward = [&] {
        auto out = ddp(shard(x, rank, run.world).to(run.dtype));
        auto loss = torch::mse_loss(out.to(torch::kFloat), shard(y, rank, run.world)) / run.micro;
        const bool poison = s == run.overflowStep && rank == run.overflowRank && m + 1 == run.micro;
        const unsigned hook = poison ? net->fc1->weight.register_hook([](torch::Tensor g) {
          g = g.clone();
          g[0][0] = std::numeric_limits<double>::infinity();
          return g;
        })
                                     : 0;
        scaler.scale(loss).backward();
        if (poison) net->fc1->weight.remove_hook(hook);
      };
      if (m + 1 < run.micro) {
        auto guard = ddp.noSync();
        forwardBackward();
      } else {
        forwardBackward();
      }
    }
    if (run.clip > 0) {
      scaler.unscale(*optimizer);
      result.clipNorms.push_back(
          sharded ? clipGradNorm(*sharded, run.clip)
                  : torch::nn::utils::clip_grad_norm_(ddp.parameters(), run.clip));
    }
    scaler.step(*optimizer);
    scaler.update();
  }
  // Read without the wrapper: deferred all-gathers must be waited for first.
  if (sharded) sharded->waitForParameters();
  if (sharded && atEnd) atEnd(*sharded);
  for (const auto& p : net->named_parameters()) result.params[p.key()] = p.value().detach().clone();
  result.skipped = scaler.skippedSteps();
  return result;
}

// trainOnRank on `run.world` ranks as threads.
inline ZeroResult trainMlp(const ZeroRun& run,
                           const std::function<void(int, ShardedOptimizer&)>& atEnd = {}) {
  ZeroResult result;
  result.params.resize(static_cast<size_t>(run.world));
  auto world = ThreadWorld::create(run.world);
  world->run([&](int rank) {
    RankResult mine = trainOnRank(run, threadGroup(*world, rank), [&](ShardedOptimizer& opt) {
      if (atEnd) atEnd(rank, opt);
    });
    result.params[static_cast<size_t>(rank)] = std::move(mine.params);
    if (rank == 0) {
      result.clipNorms = mine.clipNorms;
      result.skipped = mine.skipped;
    }
  });
  return result;
}

// A whole sharded state assembled from every rank's records: each (parameter, field) as one flat
// tensor, NaN where no record covered it.
struct ShardSnapshot {
  std::map<std::pair<std::string, std::string>, torch::Tensor> fields;
  std::map<std::string, int64_t> steps;
};

inline void addRecords(ShardSnapshot& snap, const std::vector<ShardRecord>& records) {
  for (const auto& r : records) {
    int64_t numel = 1;
    for (int64_t d : r.shape) numel *= d;
    auto put = [&](const std::string& field, const torch::Tensor& part) {
      auto& full = snap.fields[{r.param, field}];
      if (!full.defined()) full = torch::full({numel}, std::nan(""), part.options());
      full.narrow(0, r.begin, r.end - r.begin).copy_(part);
    };
    put("master", r.master);
    for (const auto& [field, t] : r.state) put(field, t);
    if (r.step) snap.steps[r.param] = *r.step;
  }
}

}  // namespace dtrain::testing
