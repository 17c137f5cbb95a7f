// ft_bench --worker: the job ft_bench runs under `launch` on the simulated cluster. DDP over the
// default backend (shared memory within a node, Gloo across), a small MLP, SGD with momentum and a
// DistributedSampler in a TrainingState; each step's work is a fixed compute time (--compute-ms,
// a sleep standing in for forward and backward) then the real forward and backward with DDP's
// gradient sync, inside tryStep(). With --save-every K a Checkpointer of the same state saves
// every K steps and the job resumes from it at start (today's restart path).
//
// Every line the driver reads carries t=<CLOCK_REALTIME seconds>: one clock for every namespace
// of the machine, so the driver's kill and every worker's lines are on the same time line.
//   ft start t=                                   rank 0, after init (start-up done)
//   ft restored step S t=                         rank 0, after a restore
//   ft step S world W t= work_ms=                 rank 0, step S committed; work_ms: its
//                                                 tryStep() less the compute sleep
//   ft out step S rank R t=                       any rank: its step's work threw (out of the
//                                                 collective a lost node left hanging)
//   ft discarded step S rank R now R2/W epoch E t=  tryStep() returned false (re-formed)
//   ft done rank R steps N collectives C world W epoch E
//       C: the communicator's sequenceNumber() over the steps (collectives issued), when the
//       job never re-formed (a re-formed communicator counts from 0)
#include <time.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <torch/torch.h>

#include "dtrain/dtrain.h"
#include "ft_bench.h"

namespace dtrain::bench {

namespace {

struct WorkerArgs {
  int64_t steps = 40;
  int64_t computeMs = 150;
  int64_t saveEvery = 0;
  std::string checkpointDir;
};

WorkerArgs parseWorker(int argc, char** argv) {
  WorkerArgs a;
  for (int i = 0; i < argc; ++i) {
    const std::string f = argv[i];
    auto next = [&]() -> std::string {
      DTRAIN_CHECK_ARG(i + 1 < argc, "{} needs a value", f);
      return argv[++i];
    };
    if (f == "--steps") a.steps = std::stoll(next());
    else if (f == "--compute-ms") a.computeMs = std::stoll(next());
    else if (f == "--save-every") a.saveEvery = std::stoll(next());
    else if (f == "--checkpoint-dir") a.checkpointDir = next();
    else DTRAIN_THROW(InvalidArgument, "ft_bench --worker: unknown flag {}", f);
  }
  DTRAIN_CHECK_ARG(a.saveEvery == 0 || !a.checkpointDir.empty(),
                   "--save-every needs --checkpoint-dir");
  return a;
}

constexpr int64_t kSamples = 48;
constexpr int64_t kGlobalBatch = 12;  // 6 and 4 ranks both divide it

void say(const std::string& line) { std::cout << line << std::flush; }

}  // namespace

double wallNow() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

int ftWorker(int argc, char** argv) {
  const WorkerArgs args = parseWorker(argc, argv);
  torch::set_num_threads(1);
  InitOptions init;
  init.timeout = std::chrono::seconds(60);
  init.connectTimeout = std::chrono::seconds(30);
  std::shared_ptr<ProcessGroup> group = dtrain::init(init);
  if (group->rank() == 0) say(fmt::format("ft start t={:.6f}\n", wallNow()));

  torch::manual_seed(1234);
  auto x = torch::randn({kSamples, 32});
  auto y = torch::randn({kSamples, 8});
  torch::manual_seed(7);
  torch::nn::Sequential net(torch::nn::Linear(32, 64), torch::nn::Tanh(), torch::nn::Linear(64, 8));
  DistributedDataParallel<torch::nn::Sequential> ddp(net, group);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  SamplerOptions samplerOptions;
  samplerOptions.seed = 5;
  DistributedSampler sampler(kSamples, group->size(), group->rank(), samplerOptions);
  auto state = std::make_shared<TrainingState>(group);
  state->addModule("model", net);
  state->addOptimizer("sgd", sgd);
  state->addSampler("data", sampler);

  std::unique_ptr<Checkpointer> checkpointer;
  int64_t start = 0;
  if (args.saveEvery > 0) {
    CheckpointOptions options(args.checkpointDir);
    options.allowWorldSizeChange = true;  // the restart goes on without the lost node
    // SIGTERM (the restart's teardown) ends the process at once: a survivor blocked beside a dead
    // peer could not checkpoint anyway.
    options.handlePreemption = false;
    checkpointer = std::make_unique<Checkpointer>(state, options);
    if (auto restored = checkpointer->restore()) {
      start = restored->step + 1;
      if (group->rank() == 0)
        say(fmt::format("ft restored step {} t={:.6f}\n", restored->step, wallNow()));
    }
  }

  const int64_t stepsPerEpoch = kSamples / kGlobalBatch;
  const uint64_t seqBefore = group->communicator().sequenceNumber();
  int64_t committed = 0;
  for (int64_t step = start; step < args.steps;) {
    if (step % stepsPerEpoch == 0) sampler.setEpoch(step / stepsPerEpoch);
    const int rank = group->rank();
    const int world = group->size();
    state->beginStep(step);
    const auto began = std::chrono::steady_clock::now();
    const bool done = state->tryStep([&] {
      try {
        std::this_thread::sleep_for(std::chrono::milliseconds(args.computeMs));
        auto indices = sampler.next(static_cast<size_t>(kGlobalBatch / world)).value();
        auto idx = torch::tensor(std::vector<int64_t>(indices.begin(), indices.end()),
                                 torch::kLong);
        sgd.zero_grad();
        torch::mse_loss(ddp(x.index_select(0, idx)), y.index_select(0, idx)).backward();
      } catch (...) {
        say(fmt::format("ft out step {} rank {} t={:.6f}\n", step, rank, wallNow()));
        throw;
      }
    });
    if (!done) {
      say(fmt::format("ft discarded step {} rank {} now {}/{} epoch {} t={:.6f}\n", step, rank,
                      group->rank(), group->size(), group->epoch(), wallNow()));
      step = state->currentStep();
      continue;
    }
    sgd.step();
    const double workMs = std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - began)
                              .count() -
                          static_cast<double>(args.computeMs);
    if (group->rank() == 0) {
      say(fmt::format("ft step {} world {} t={:.6f} work_ms={:.3f}\n", step, group->size(),
                      wallNow(), workMs));
    }
    ++committed;
    if (checkpointer && (step + 1) % args.saveEvery == 0) checkpointer->save(step);
    ++step;
  }
  say(fmt::format("ft done rank {} steps {} collectives {} world {} epoch {}\n", group->rank(),
                  committed, group->communicator().sequenceNumber() - seqBefore, group->size(),
                  group->epoch()));
  group->shutdown();
  return 0;
}

}  // namespace dtrain::bench
