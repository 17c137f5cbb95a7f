// A deterministic trainer for the checkpoint tests, run by `launch` (or started by hand as the
// ranks of several simulated nodes): DDP over Gloo, SGD with momentum, a step LR schedule, a
// GradScaler and a DistributedSampler, all in the Checkpointer; one restore() at start. It obeys
// DTRAIN_FAULT (faults at each step's start; nan-grad inside DDP) and DTRAIN_IO_FAULT (in the
// checkpointer), exits 75 when preempted, and at the end writes rank 0's parameters to --out and
// prints whether every rank holds the same bits.
//
//   checkpoint_worker --dir D --steps N [--save-every K] [--async] [--global-batch B]
//                     [--step-ms MS] [--stop-after S] [--allow-resize] [--scaler-local]
//                     [--zero 1|2|3] [--checkpoint-timeout-ms MS] [--out FILE]
//
// --zero: the SGD is a ShardedOptimizer (ZeRO stage 1, 2 or 3: each layer a ShardedUnit) and the
// checkpoints are sharded.
//
// The data: 48 fixed samples; every step consumes a global batch of B (12) of an epoch's order,
// split over the ranks (B / world each), so the math of a step does not depend on the world size.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <torch/torch.h>

#include "dtrain/dtrain.h"
#include "fault.h"

namespace {

struct Args {
  std::string dir;
  int64_t steps = 12;
  int64_t saveEvery = 0;
  bool async = false;
  int64_t globalBatch = 12;
  int64_t stepMs = 0;
  int64_t stopAfter = -1;
  bool allowResize = false;
  bool scalerLocal = false;
  int zero = 0;
  int64_t checkpointTimeoutMs = 0;  // 0: the Checkpointer's default
  int64_t collectiveTimeoutMs = 30000;
  std::string out;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    auto next = [&]() -> std::string {
      DTRAIN_CHECK_ARG(i + 1 < argc, "{} needs a value", f);
      return argv[++i];
    };
    if (f == "--dir") a.dir = next();
    else if (f == "--steps") a.steps = std::stoll(next());
    else if (f == "--save-every") a.saveEvery = std::stoll(next());
    else if (f == "--async") a.async = true;
    else if (f == "--global-batch") a.globalBatch = std::stoll(next());
    else if (f == "--step-ms") a.stepMs = std::stoll(next());
    else if (f == "--stop-after") a.stopAfter = std::stoll(next());
    else if (f == "--allow-resize") a.allowResize = true;
    else if (f == "--scaler-local") a.scalerLocal = true;
    else if (f == "--zero") a.zero = std::stoi(next());
    else if (f == "--checkpoint-timeout-ms") a.checkpointTimeoutMs = std::stoll(next());
    else if (f == "--collective-timeout-ms") a.collectiveTimeoutMs = std::stoll(next());
    else if (f == "--out") a.out = next();
    else DTRAIN_THROW(dtrain::InvalidArgument, "unknown flag {}", f);
  }
  DTRAIN_CHECK_ARG(!a.dir.empty(), "--dir is required");
  return a;
}

constexpr int64_t kSamples = 48;

// The module's parameters, flattened in its order; stage 3 gathers them (its layers hold none).
torch::Tensor flatParams(torch::nn::Module& m, torch::optim::Optimizer& optimizer, int zero) {
  std::map<std::string, torch::Tensor> full;
  if (zero == 3) {
    for (auto& [name, t] :
         dtrain::gatherFullParameters(static_cast<dtrain::ShardedOptimizer&>(optimizer))) {
      full[name] = t;
    }
  }
  std::vector<torch::Tensor> parts;
  for (const auto& p : m.named_parameters()) {
    parts.push_back(zero == 3 ? full.at(p.key()).flatten() : p.value().detach().flatten());
  }
  return torch::cat(parts);
}

// SGD with momentum; with `zero` 1, 2 or 3, sharded (its checkpoints are then sharded too).
std::unique_ptr<torch::optim::Optimizer> makeSgd(
    dtrain::DistributedDataParallel<torch::nn::Sequential>& ddp, int zero) {
  const auto options = torch::optim::SGDOptions(0.05).momentum(0.9);
  if (zero == 0) return std::make_unique<torch::optim::SGD>(ddp.parameters(), options);
  dtrain::ZeroOptions zo;
  zo.stage = zero;
  zo.firstUnitBytes = 128;  // several units, each split over the ranks
  zo.unitBytes = 256;
  return std::make_unique<dtrain::ShardedOptimizer>(
      ddp, dtrain::optimizerFactory<torch::optim::SGD>(options), zo);
}

int run(const Args& args) {
  torch::set_num_threads(1);
  dtrain::InitOptions init;
  init.timeout = std::chrono::milliseconds(args.collectiveTimeoutMs);
  init.connectTimeout = std::chrono::seconds(30);
  auto group = dtrain::init(init);
  const int rank = group->rank(), world = group->size();
  DTRAIN_CHECK_ARG(args.globalBatch % world == 0, "global batch {} is not a multiple of {}",
                   args.globalBatch, world);
  const int64_t perRank = args.globalBatch / world;
  const int64_t stepsPerEpoch = kSamples / args.globalBatch;

  torch::manual_seed(1234);
  auto x = torch::randn({kSamples, 8});
  auto y = torch::randn({kSamples, 4});
  torch::manual_seed(7 + rank);  // DDP broadcasts rank 0's
  torch::nn::Sequential net(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 4));
  if (args.zero == 3) net = dtrain::shardEveryChild(net);  // the same parameter names
  dtrain::DistributedDataParallel<torch::nn::Sequential> ddp(net, group);
  auto optimizer = makeSgd(ddp, args.zero);
  torch::optim::Optimizer& sgd = *optimizer;
  torch::optim::StepLR schedule(sgd, /*step_size=*/5, /*gamma=*/0.7);
  dtrain::GradScalerOptions scalerOptions;
  scalerOptions.growthInterval = 4;
  dtrain::GradScaler scaler(args.scalerLocal ? nullptr : group, scalerOptions);
  dtrain::SamplerOptions samplerOptions;
  samplerOptions.seed = 5;
  dtrain::DistributedSampler sampler(kSamples, world, rank, samplerOptions);

  dtrain::CheckpointOptions options(args.dir);
  options.keepLast = 2;
  options.allowWorldSizeChange = args.allowResize;
  if (args.checkpointTimeoutMs > 0)
    options.timeout = std::chrono::milliseconds(args.checkpointTimeoutMs);
  dtrain::Checkpointer checkpointer(group, options);
  checkpointer.addModule("model", net);
  checkpointer.addOptimizer("sgd", sgd);
  checkpointer.addScheduler("lr", schedule);
  checkpointer.addScaler("scaler", scaler);
  checkpointer.addSampler("data", sampler);

  int64_t start = 0;
  if (auto restored = checkpointer.restore()) {
    start = restored->step + 1;
    std::cout << fmt::format("rank {} restored step {} from world size {}{}\n", rank,
                             restored->step, restored->savedWorldSize,
                             restored->copiedFromPeer ? " (copied from another node)" : "")
              << std::flush;
  }
  for (int64_t step = start; step < args.steps; ++step) {
    dtrain::fault::injectAt(rank, step);
    const int64_t epoch = step / stepsPerEpoch;
    if (step % stepsPerEpoch == 0) sampler.setEpoch(epoch);
    auto indices = sampler.next(static_cast<size_t>(perRank)).value();
    auto idx = torch::tensor(std::vector<int64_t>(indices.begin(), indices.end()), torch::kLong);
    sgd.zero_grad();
    auto loss = torch::mse_loss(ddp(x.index_select(0, idx)), y.index_select(0, idx));
    scaler.scale(loss).backward();
    if (!scaler.step(sgd))
      std::cout << fmt::format("rank {} skipped step {}\n", rank, step) << std::flush;
    scaler.update();
    schedule.step();
    if (rank == 0)
      std::cout << fmt::format("step {} loss {:.6f}\n", step, loss.item<float>()) << std::flush;
    if (args.saveEvery > 0 && (step + 1) % args.saveEvery == 0) {
      if (args.async) {
        checkpointer.saveAsync(step, epoch);
      } else {
        checkpointer.save(step, epoch);
      }
    }
    if (checkpointer.preempted(step, epoch)) {
      std::cout << fmt::format("rank {} preempted at step {}\n", rank, step) << std::flush;
      group->shutdown();
      return dtrain::kExitPreempted;
    }
    if (step == args.stopAfter) {
      checkpointer.wait();
      std::cout << fmt::format("rank {} stopped after step {}\n", rank, step) << std::flush;
      group->shutdown();
      return 0;
    }
    if (args.stepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(args.stepMs));
  }
  checkpointer.wait();
  auto mine = flatParams(*net, sgd, args.zero);
  auto all = group->allgather(mine);
  bool same = true;
  for (const auto& t : all) same = same && torch::equal(t, all[0]);
  std::cout << fmt::format("rank {} final {} (scale {})\n", rank,
                           same ? "identical across ranks" : "DIFFERS across ranks",
                           scaler.getScale())
            << std::flush;
  if (rank == 0 && !args.out.empty()) {
    std::ofstream out(args.out, std::ios::binary);
    out.write(static_cast<const char*>(mine.data_ptr()),
              static_cast<std::streamsize>(mine.nbytes()));
  }
  group->shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << "checkpoint_worker: " << e.what() << "\n";
    return 1;
  }
}
