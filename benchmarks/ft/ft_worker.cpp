// ft_bench --worker: the job ft_bench runs under `launch` on the simulated cluster. DDP over the
// default backend (shared memory within a node, Gloo across), an MLP (--features inputs, --depth
// hidden layers of --width, 8 outputs; by default 32 -> 64 -> 8) and a DistributedSampler in a
// TrainingState. The optimizer is SGD with momentum, or with --zero 1|2 a ShardedOptimizer
// stepping Adam, its sharded state mirrored every --mirror-every steps under `--on-node-loss
// continue` (with --mirror-blocks B: at the first step of every other block of B steps). Each
// step's work is a fixed compute time (--compute-ms, a sleep standing in for a larger model's
// forward and backward) then the real forward and backward with the gradient sync -- under ZeRO
// the optimizer's step too, whose collectives must run there -- inside tryStep(). With
// --save-every K a Checkpointer of the same state saves every K steps and the job resumes from
// it at start (today's restart path).
//
// Every line the driver reads carries t=<CLOCK_REALTIME seconds>: one clock for every namespace
// of the machine, so the driver's kill and every worker's lines are on the same time line.
//   ft start t= params=                           rank 0, after init (start-up done)
//   ft zero rank 0 world W owned= state_bytes=    rank 0 under ZeRO, after init and at the end:
//       parameters= gradients= optimizer_state=   its elements owned and sharded state (master or
//       buckets= mirror_bytes= rss_peak=          parameter block + Adam's fields, float32); the
//                                                 bytes it holds, from the storages (ZeroMemory)
//   ft restored step S t=                         rank 0, after a restore
//   ft step S world W t= work_ms=                 rank 0, step S committed; work_ms: its
//                                                 tryStep() less the compute sleep
//   ft out step S rank R t=                       any rank: its step's work threw (out of the
//                                                 collective a lost node left hanging)
//   ft discarded step S rank R now R2/W epoch E resume S2 t=  tryStep() returned false
//                                                 (re-formed); S2 the step run next
//   ft re-formed before step S rank R now R2/W epoch E resume S2 t=  the same, its work not
//                                                 begun (a join at the step boundary)
//   ft done rank R steps N collectives C world W epoch E
//       C: the communicator's sequenceNumber() over the steps (collectives issued), when the
//       job never re-formed (a re-formed communicator counts from 0)
#include <sys/resource.h>
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
  int zero = 0;              // 0: DDP and SGD; 1, 2: ZeRO's stage, Adam
  int64_t mirrorEvery = 0;   // 0: TrainingState's default
  int64_t mirrorBlocks = 0;  // > 0: blocks of this many steps, mirrored in turn
  int64_t features = 32;
  int64_t width = 64;
  int64_t depth = 0;  // hidden width x width layers
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
    else if (f == "--zero") a.zero = std::stoi(next());
    else if (f == "--mirror-every") a.mirrorEvery = std::stoll(next());
    else if (f == "--mirror-blocks") a.mirrorBlocks = std::stoll(next());
    else if (f == "--features") a.features = std::stoll(next());
    else if (f == "--width") a.width = std::stoll(next());
    else if (f == "--depth") a.depth = std::stoll(next());
    else DTRAIN_THROW(InvalidArgument, "ft_bench --worker: unknown flag {}", f);
  }
  DTRAIN_CHECK_ARG(a.saveEvery == 0 || !a.checkpointDir.empty(),
                   "--save-every needs --checkpoint-dir");
  DTRAIN_CHECK_ARG(a.zero >= 0 && a.zero <= 2, "--zero {}: 1 or 2 (0: DDP)", a.zero);
  return a;
}

constexpr int64_t kSamples = 48;
constexpr int64_t kGlobalBatch = 12;  // 6 and 4 ranks both divide it
constexpr int64_t kOutputs = 8;
constexpr int64_t kNeverMirror = int64_t{1} << 40;

void say(const std::string& line) { std::cout << line << std::flush; }

torch::nn::Sequential makeNet(const WorkerArgs& a) {
  torch::nn::Sequential net(torch::nn::Linear(a.features, a.width), torch::nn::Tanh());
  for (int64_t l = 0; l < a.depth; ++l) {
    net->push_back(torch::nn::Linear(a.width, a.width));
    net->push_back(torch::nn::Tanh());
  }
  net->push_back(torch::nn::Linear(a.width, kOutputs));
  return net;
}

// Rank 0's ZeRO line (see the list above).
void sayZero(ShardedOptimizer& optimizer, int world) {
  const ZeroStats s = optimizer.stats();
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  // The block of master weights (or of the parameters stepped in place) and Adam's two moments.
  const int64_t stateBytes = s.owned * 3 * 4;
  say(fmt::format("ft zero rank 0 world {} owned={} state_bytes={} parameters={} gradients={} "
                  "optimizer_state={} buckets={} mirror_bytes={} rss_peak={}\n",
                  world, s.owned, stateBytes, s.memory.parameters, s.memory.gradients,
                  s.memory.optimizerState, s.memory.buckets, optimizer.mirrorBytes(),
                  static_cast<int64_t>(usage.ru_maxrss) * 1024));
}

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

  torch::manual_seed(1234);
  auto x = torch::randn({kSamples, args.features});
  auto y = torch::randn({kSamples, kOutputs});
  torch::manual_seed(7);
  torch::nn::Sequential net = makeNet(args);
  int64_t parameters = 0;
  for (const auto& p : net->parameters()) parameters += p.numel();
  DistributedDataParallel<torch::nn::Sequential> ddp(net, group);
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  ShardedOptimizer* sharded = nullptr;
  if (args.zero > 0) {
    ZeroOptions options;
    options.stage = args.zero;
    auto owned = std::make_unique<ShardedOptimizer>(
        ddp, optimizerFactory<torch::optim::Adam>(torch::optim::AdamOptions(1e-4)), options);
    sharded = owned.get();
    optimizer = std::move(owned);
  } else {
    optimizer = std::make_unique<torch::optim::SGD>(net->parameters(),
                                                    torch::optim::SGDOptions(0.05).momentum(0.9));
  }
  SamplerOptions samplerOptions;
  samplerOptions.seed = 5;
  DistributedSampler sampler(kSamples, group->size(), group->rank(), samplerOptions);
  auto state = std::make_shared<TrainingState>(group);
  state->addModule("model", net);
  state->addOptimizer("optimizer", *optimizer);
  state->addSampler("data", sampler);
  if (args.mirrorEvery > 0) state->setMirrorInterval(args.mirrorEvery);
  if (group->rank() == 0) {
    say(fmt::format("ft start t={:.6f} params={}\n", wallNow(), parameters));
    if (sharded) sayZero(*sharded, group->size());
  }

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
    if (args.mirrorBlocks > 0) {
      // Block b, steps [bB, (b+1)B): odd blocks mirrored at their first step, even ones not
      // (every job mirrors at step 0): ft_zero.cpp's pairs of the mirrors' cost.
      const bool on = (step / args.mirrorBlocks) % 2 == 1;
      state->setMirrorInterval(on ? args.mirrorBlocks : kNeverMirror);
    }
    state->beginStep(step);
    const auto began = std::chrono::steady_clock::now();
    bool ran = false;
    const bool done = state->tryStep([&] {
      ran = true;
      try {
        std::this_thread::sleep_for(std::chrono::milliseconds(args.computeMs));
        auto indices = sampler.next(static_cast<size_t>(kGlobalBatch / world)).value();
        auto idx = torch::tensor(std::vector<int64_t>(indices.begin(), indices.end()),
                                 torch::kLong);
        if (sharded) sharded->zero_grad();  // it hides the base's: noSync()'s gradients too
        else optimizer->zero_grad();
        torch::mse_loss(ddp(x.index_select(0, idx)), y.index_select(0, idx)).backward();
        // ZeRO's step all-gathers the parameters: a collective, so part of the step's work.
        if (sharded) sharded->step();
      } catch (...) {
        say(fmt::format("ft out step {} rank {} t={:.6f}\n", step, rank, wallNow()));
        throw;
      }
    });
    if (!done) {
      say(fmt::format("ft {} step {} rank {} now {}/{} epoch {} resume {} t={:.6f}\n",
                      ran ? "discarded" : "re-formed before", step, rank, group->rank(),
                      group->size(), group->epoch(), state->currentStep(), wallNow()));
      step = state->currentStep();
      continue;
    }
    if (!sharded) optimizer->step();
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
  if (sharded && group->rank() == 0) sayZero(*sharded, group->size());
  say(fmt::format("ft done rank {} steps {} collectives {} world {} epoch {}\n", group->rank(),
                  committed, group->communicator().sequenceNumber() - seqBefore, group->size(),
                  group->epoch()));
  group->shutdown();
  return 0;
}

}  // namespace dtrain::bench
