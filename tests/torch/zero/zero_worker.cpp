// A training program for ZeRO's real-process tests: started by `launch`, one process per rank,
// over shared memory or Gloo (DTRAIN_SHM=0). Each scenario trains the same model with plain DDP
// and ZeRO in turn and checks, on every rank, that the stages end close to DDP's parameters and
// bitwise equal across ranks. Prints "rank R PASS <name>" or "rank R FAIL <name>: <why>", exits
// 1 when any failed.
//
//   zero_worker --scenarios adamw,sgd-groups,stage3,skip-unit [--skipped K]
//
// adamw: 50 AdamW steps of 2 micro-batches (noSync()); sgd-groups: 20 SGD-momentum steps, two
// parameter groups; both stages 1 and 2 within 1e-6, and stage 2 with deferAllgatherWait bitwise
// stage 2's. Both with an enabled GradScaler: under
// DTRAIN_FAULT=nan-grad@rank=R,step=S (the test sets it) one element of one rank's gradient is
// poisoned before the collective, which after a reduce-scatter reaches one rank's shard only;
// every rank must skip that step (--skipped 1), DDP's and both stages alike.
// stage3: ZeRO stage 3 on marked units (nested, one called twice), 20 AdamW steps of 3
// micro-batches (noSync()) with an overflow on the last rank at step 5, within 1e-5 of DDP's;
// again with every unit sharded as it is built (fullyShard), bitwise as the model built whole.
// skip-unit: stage 3 on four marked layers of which two have the same size; at step 3 the last
// rank skips one of those layers' forward. Every rank must fail, naming both ranks' units, long
// before the collective timeout (30 s): "rank R FAIL skip-unit after <ms> ms: <error>".
// fit: four marked Linear(W, W) layers (--fit-width W, default 3584: 51.4M parameters, 205 MB in
// float32) trained 3 AdamW steps at --fit-stage 0 (DDP with torch::optim::AdamW) or 3 (ZeRO-3);
// prints "rank R fit stage S: peak RSS <MB> MB[, model state <MB> MB]" (the test runs it in a
// memory cgroup whose limit ZeRO-3 fits under and DDP does not).
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>

#include <fmt/format.h>
#include <torch/torch.h>

#include "dtrain/base/error.h"
#include "dtrain/torch/init.h"
#include "zero3_support.h"
#include "zero_support.h"

namespace dtrain::testing {
namespace {

struct Args {
  std::vector<std::string> scenarios;
  int64_t skipped = 0;
  int fitStage = 3;
  int64_t fitWidth = 3584;
};

void check(bool ok, const std::string& what) { DTRAIN_CHECK(ok, "{}", what); }

// Every rank's tensor equals rank 0's, bit for bit.
void checkIdenticalAcrossRanks(ProcessGroup& group, const std::string& name,
                               const torch::Tensor& t) {
  auto all = group.allgather(t.contiguous());
  for (size_t r = 1; r < all.size(); ++r) {
    check(torch::equal(all[r], all[0]),
          fmt::format("{} differs between rank 0 and rank {}", name, r));
  }
}

void compareStages(const std::shared_ptr<ProcessGroup>& group, ZeroRun run, const Args& args) {
  run.world = group->size();
  const RankResult ddp = trainOnRank(run, group);
  check(ddp.skipped == args.skipped,
        fmt::format("DDP skipped {} steps, expected {}", ddp.skipped, args.skipped));
  RankResult stage2;
  for (int stage : {1, 2}) {
    run.stage = stage;
    RankResult zero = trainOnRank(run, group);
    check(zero.skipped == args.skipped,
          fmt::format("stage {} skipped {} steps, expected {}", stage, zero.skipped, args.skipped));
    for (const auto& [name, t] : ddp.params) {
      const double err = relativeError(zero.params.at(name), t);
      check(err <= 1e-6,
            fmt::format("stage {}: {} differs from DDP's by {:.3g} (max 1e-6)", stage, name, err));
      checkIdenticalAcrossRanks(*group, fmt::format("stage {} {}", stage, name),
                                zero.params.at(name));
    }
    if (stage == 2) stage2 = std::move(zero);
  }
  // Note [Deferred all-gathers]: step() leaves its all-gathers to the next forward; the same
  // collectives in the same order, so bitwise stage 2's training.
  run.deferAllgatherWait = true;
  const RankResult deferred = trainOnRank(run, group);
  check(deferred.skipped == args.skipped,
        fmt::format("deferred stage 2 skipped {} steps, expected {}", deferred.skipped,
                    args.skipped));
  for (const auto& [name, t] : stage2.params) {
    check(torch::equal(deferred.params.at(name), t),
          fmt::format("stage 2 with deferred all-gathers: {} differs from stage 2's", name));
  }
}

void scenarioAdamW(const std::shared_ptr<ProcessGroup>& group, const Args& args) {
  ZeroRun run;
  run.steps = 50;
  run.micro = 2;
  run.scaler = true;
  compareStages(group, run, args);
}

void scenarioSgdGroups(const std::shared_ptr<ProcessGroup>& group, const Args& args) {
  ZeroRun run;
  run.steps = 20;
  run.optimizer = "sgd-groups";
  run.scaler = true;  // so that the poisoned step is skipped here too
  compareStages(group, run, args);
}

void scenarioStage3(const std::shared_ptr<ProcessGroup>& group) {
  Zero3Run how{group->size(), 0, 20};
  how.micro = 3;
  how.overflowStep = 5;
  const Zero3RankResult ddp = trainZero3OnRank<Zero3NestedNet>(how, group);
  how.stage = 3;
  const Zero3RankResult zero = trainZero3OnRank<Zero3NestedNet>(how, group);
  check(
      ddp.skipped == 1 && zero.skipped == 1,
      fmt::format("skipped steps: DDP {}, stage 3 {}, expected 1 each", ddp.skipped, zero.skipped));
  check(zero.markedAfterBackward == 0 && zero.markedBytes == 0,
        "a marked module kept its parameters after a backward or a step");
  for (const auto& [name, t] : ddp.params) {
    const double err = relativeError(zero.params.at(name), t);
    check(err <= 1e-5,
          fmt::format("stage 3: {} differs from DDP's by {:.3g} (max 1e-5)", name, err));
    checkIdenticalAcrossRanks(*group, "stage 3 " + name, zero.params.at(name));
  }
  how.builtSharded = true;  // every unit sharded as it is built: the same training, bitwise
  const Zero3RankResult built = trainZero3OnRank<Zero3NestedNet>(how, group);
  for (const auto& [name, t] : zero.params) {
    check(torch::equal(built.params.at(name), t),
          fmt::format("stage 3 built unit by unit: {} differs from the model built whole", name));
  }
}

// Five marked layers: in (7 -> 16), l1, l2, l3 (16 -> 16 each: units of the same size) and out
// (16 -> 5). `skip`: the index of a layer whose forward this rank leaves out.
struct SkipNetImpl : torch::nn::Module {
  SkipNetImpl() {
    layers.push_back(register_module("in", ShardedUnit(torch::nn::Linear(7, 16))));
    for (const char* name : {"l1", "l2", "l3"}) {
      layers.push_back(register_module(name, ShardedUnit(torch::nn::Linear(16, 16))));
    }
    layers.push_back(register_module("out", ShardedUnit(torch::nn::Linear(16, 5))));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < layers.size(); ++i) {
      if (static_cast<int>(i) != skip) x = torch::tanh(layers[i]->forward(x));
    }
    return x;
  }
  std::vector<ShardedUnit> layers;
  int skip = -1;
};
TORCH_MODULE(SkipNet);

void scenarioSkipUnit(const std::shared_ptr<ProcessGroup>& group) {
  const int rank = group->rank();
  const int world = group->size();
  SkipNet net = buildSeeded(3, [] { return SkipNet(); });
  DistributedDataParallel<SkipNet> ddp(net, group);
  ZeroOptions zo;
  zo.stage = 3;
  ShardedOptimizer optimizer(ddp, factoryFor("adamw"), zo);
  ZeroRun run;
  run.world = world;
  for (int s = 0; s < 6; ++s) {
    net->skip = s == 3 && rank == world - 1 ? 2 : -1;  // l2's forward, left out on one rank
    const auto start = std::chrono::steady_clock::now();
    try {
      optimizer.zero_grad();
      auto [x, y] = wholeBatch(run, s, 0, 7, 5);
      torch::mse_loss(ddp(shard(x, rank, world)), shard(y, rank, world)).backward();
      optimizer.step();
    } catch (const std::exception& e) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - start);
      DTRAIN_THROW(Error, "after {} ms at step {}: {}", ms.count(), s, e.what());
    }
  }
  DTRAIN_THROW(Error, "every rank trained 6 steps although one skipped a unit's forward");
}

// VmHWM of /proc/self/status: this process's peak resident set, in MB.
int64_t peakRssMb() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) / 1024;
  }
  return -1;
}

void scenarioFit(const std::shared_ptr<ProcessGroup>& group, const Args& args) {
  const int64_t w = args.fitWidth;
  torch::nn::Sequential layers;
  for (int i = 0; i < 4; ++i) {
    layers->push_back(torch::nn::Linear(w, w));
    layers->push_back(torch::nn::Tanh());
  }
  torch::nn::Sequential net = args.fitStage == 3 ? shardEveryChild(layers) : layers;
  DistributedDataParallel<torch::nn::Sequential> ddp(net, group);
  const OptimizerFactory factory = factoryFor("adamw");
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  ShardedOptimizer* sharded = nullptr;
  if (args.fitStage == 0) {
    optimizer = factory.make({torch::optim::OptimizerParamGroup(ddp.parameters())});
  } else {
    ZeroOptions zo;
    zo.stage = args.fitStage;
    auto owned = std::make_unique<ShardedOptimizer>(ddp, factory, zo);
    sharded = owned.get();
    optimizer = std::move(owned);
  }
  for (int s = 0; s < 3; ++s) {
    optimizer->zero_grad();
    ddp(torch::randn({4, w})).pow(2).mean().backward();
    optimizer->step();
  }
  std::string state;
  if (sharded) {
    // Model state per rank, from the storages: 16 bytes per parameter / N for float32 Adam
    // (parameters, gradients, two moments), padding and all, within 2 %.
    const ZeroStats stats = sharded->stats();
    const double want = 16.0 * static_cast<double>(stats.parameters) / group->size();
    const double got = static_cast<double>(stats.memory.modelState());
    check(std::abs(got - want) <= 0.02 * want,
          fmt::format("model state {} bytes, 16 x {} parameters / {} ranks = {:.0f}", got,
                      stats.parameters, group->size(), want));
    state = fmt::format(", model state {} MB ({:.4f} of 16 psi / N)",
                        stats.memory.modelState() >> 20, got / want);
  }
  std::cout << fmt::format("rank {} fit stage {}: peak RSS {} MB{}\n", group->rank(), args.fitStage,
                           peakRssMb(), state)
            << std::flush;
}

Args parseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    DTRAIN_CHECK_ARG(i + 1 < argc, "{} needs a value", arg);
    std::string value = argv[++i];
    if (arg == "--scenarios") {
      std::stringstream in(value);
      for (std::string s; std::getline(in, s, ',');) a.scenarios.push_back(s);
    } else if (arg == "--skipped") {
      a.skipped = std::stoll(value);
    } else if (arg == "--fit-stage") {
      a.fitStage = std::stoi(value);
    } else if (arg == "--fit-width") {
      a.fitWidth = std::stoll(value);
    } else {
      DTRAIN_THROW(InvalidArgument, "unknown argument {}", arg);
    }
  }
  return a;
}

int run(int argc, char** argv) {
  const Args args = parseArgs(argc, argv);
  torch::set_num_threads(1);
  InitOptions options;
  options.timeout = std::chrono::seconds(30);
  options.connectTimeout = std::chrono::seconds(30);
  auto group = init(options);
  std::cout << fmt::format("rank {} backend {}\n", group->rank(), group->backend()) << std::flush;
  int failures = 0;
  for (const auto& name : args.scenarios) {
    try {
      if (name == "adamw") {
        scenarioAdamW(group, args);
      } else if (name == "sgd-groups") {
        scenarioSgdGroups(group, args);
      } else if (name == "stage3") {
        scenarioStage3(group);
      } else if (name == "skip-unit") {
        scenarioSkipUnit(group);
      } else if (name == "fit") {
        scenarioFit(group, args);
      } else {
        DTRAIN_THROW(InvalidArgument, "unknown scenario {}", name);
      }
      std::cout << fmt::format("rank {} PASS {}\n", group->rank(), name) << std::flush;
    } catch (const std::exception& e) {
      ++failures;
      std::cout << fmt::format("rank {} FAIL {}: {}\n", group->rank(), name, e.what())
                << std::flush;
    }
    group->barrier();
  }
  group->shutdown();
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace dtrain::testing

int main(int argc, char** argv) {
  try {
    return dtrain::testing::run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "zero_worker: " << e.what() << "\n";
    return 1;
  }
}
