// A trainer for the elastic launch tests (launcher_multinode_tests), using dtrain's public API
// only: DDP over Gloo on 48 fixed samples, a DistributedSampler and a Checkpointer that saves
// when the job is preempted -- as `launch` does to grow an elastic job -- and restores at start,
// at whatever world size the job has now. Each step it appends the dataset indices it trained on
// to <trace-dir>/attempt<A>-rank<R>.txt, one line "<epoch> <step> <world>: i i i ...", so that a
// test can prove that the resume neither skipped nor repeated a sample.
//
//   elastic_worker --dir CHECKPOINTS --trace-dir DIR --steps N [--step-ms MS]
//
// Every step consumes a global batch of 12 of the epoch's order, split over the ranks (a world
// size of 1, 2, 3, 4 or 6), so 4 steps make an epoch at any world size.
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <torch/torch.h>

#include "dtrain/dtrain.h"

namespace {

constexpr int64_t kSamples = 48;
constexpr int64_t kGlobalBatch = 12;

struct Args {
  std::string dir;
  std::string traceDir;
  int64_t steps = 16;
  int64_t stepMs = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto next = [&]() -> std::string {
      DTRAIN_CHECK_ARG(i + 1 < argc, "{} needs a value", f);
      return argv[++i];
    };
    if (f == "--dir") a.dir = next();
    else if (f == "--trace-dir") a.traceDir = next();
    else if (f == "--steps") a.steps = std::stoll(next());
    else if (f == "--step-ms") a.stepMs = std::stoll(next());
    else DTRAIN_THROW(dtrain::InvalidArgument, "unknown flag {}", f);
  }
  DTRAIN_CHECK_ARG(!a.dir.empty() && !a.traceDir.empty(), "--dir and --trace-dir are required");
  return a;
}

int run(const Args& args) {
  torch::set_num_threads(1);
  dtrain::InitOptions init;
  init.timeout = std::chrono::seconds(60);
  init.connectTimeout = std::chrono::seconds(60);
  auto group = dtrain::init(init);
  const int rank = group->rank();
  const int world = group->size();
  DTRAIN_CHECK_ARG(kGlobalBatch % world == 0, "world size {} does not divide {}", world,
                   kGlobalBatch);
  const int64_t perRank = kGlobalBatch / world;
  const int64_t stepsPerEpoch = kSamples / kGlobalBatch;
  const char* attempt = std::getenv("DTRAIN_RESTART_COUNT");

  torch::manual_seed(1234);
  auto x = torch::randn({kSamples, 8});
  auto y = torch::randn({kSamples, 4});
  torch::nn::Sequential net(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 4));
  dtrain::DistributedDataParallel<torch::nn::Sequential> ddp(net, group);
  torch::optim::SGD sgd(ddp.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  dtrain::SamplerOptions samplerOptions;
  samplerOptions.seed = 11;
  dtrain::DistributedSampler sampler(kSamples, world, rank, samplerOptions);

  dtrain::CheckpointOptions options(args.dir);
  options.allowWorldSizeChange = true;
  dtrain::Checkpointer checkpointer(group, options);
  checkpointer.addModule("model", net);
  checkpointer.addOptimizer("sgd", sgd);
  checkpointer.addSampler("data", sampler);

  int64_t start = 0;
  if (auto restored = checkpointer.restore()) {
    start = restored->step + 1;
    std::cout << fmt::format("rank {} restored step {} saved at world size {}, now {}\n", rank,
                             restored->step, restored->savedWorldSize, world)
              << std::flush;
  }
  std::ofstream trace(
      fmt::format("{}/attempt{}-rank{}.txt", args.traceDir, attempt ? attempt : "0", rank),
      std::ios::app);
  for (int64_t step = start; step < args.steps; ++step) {
    const int64_t epoch = step / stepsPerEpoch;
    // A new epoch starts here; one resumed in its middle goes on from the checkpoint's cursor.
    if (step % stepsPerEpoch == 0) sampler.setEpoch(epoch);
    auto indices = sampler.next(static_cast<size_t>(perRank)).value();
    auto idx = torch::tensor(std::vector<int64_t>(indices.begin(), indices.end()), torch::kLong);
    sgd.zero_grad();
    auto loss = torch::mse_loss(ddp(x.index_select(0, idx)), y.index_select(0, idx));
    loss.backward();
    sgd.step();
    std::string line = fmt::format("{} {} {}:", epoch, step, world);
    for (size_t i : indices) line += fmt::format(" {}", i);
    trace << line << "\n" << std::flush;
    std::cout << fmt::format("rank {} step {} world {}\n", rank, step, world) << std::flush;
    if (checkpointer.preempted(step, epoch)) {
      std::cout << fmt::format("rank {} preempted at step {}\n", rank, step) << std::flush;
      group->shutdown();
      return dtrain::kExitPreempted;
    }
    if (args.stepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(args.stepMs));
  }
  checkpointer.wait();
  std::cout << fmt::format("rank {} done\n", rank) << std::flush;
  group->shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << "elastic_worker: " << e.what() << "\n";
    return 1;
  }
}
