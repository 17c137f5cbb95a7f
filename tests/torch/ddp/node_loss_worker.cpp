// A deterministic DDP trainer that survives a lost node, for the node-loss tests: run by
// `launch --on-node-loss continue` on a simulated cluster, or alone with --reference (one process
// on the whole global batch, the run every survivor must end equal to). SGD with momentum, a step
// LR schedule and a DistributedSampler in a TrainingState; every step's communicating part in
// tryStep(). It obeys DTRAIN_FAULT at each step's start (beginStep). At the end the survivors
// compare their parameters bit for bit and the new rank 0 writes them to --out.
//
//   node_loss_worker [--reference] [--steps N] [--global-batch B] [--step-ms MS] [--out FILE]
//
// The data: 48 fixed samples; every step consumes a global batch of B (12) of an epoch's order,
// split over the ranks (B / world each, so 6 and 4 ranks both divide it): the math of a step does
// not depend on the world size.
#include <chrono>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <torch/torch.h>

#include "dtrain/dtrain.h"

namespace {

struct Args {
  bool reference = false;
  int64_t steps = 8;
  int64_t globalBatch = 12;
  int64_t stepMs = 0;
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
    if (f == "--reference") a.reference = true;
    else if (f == "--steps") a.steps = std::stoll(next());
    else if (f == "--global-batch") a.globalBatch = std::stoll(next());
    else if (f == "--step-ms") a.stepMs = std::stoll(next());
    else if (f == "--out") a.out = next();
    else DTRAIN_THROW(dtrain::InvalidArgument, "unknown flag {}", f);
  }
  return a;
}

constexpr int64_t kSamples = 48;

torch::Tensor flat(torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : m.parameters()) parts.push_back(p.detach().flatten());
  return torch::cat(parts);
}

void write(const std::string& path, const torch::Tensor& t) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
}

int run(const Args& args) {
  torch::set_num_threads(1);
  std::shared_ptr<dtrain::ProcessGroup> group;
  if (!args.reference) {
    dtrain::InitOptions init;
    init.timeout = std::chrono::seconds(60);
    init.connectTimeout = std::chrono::seconds(30);
    group = dtrain::init(init);
  }
  const int64_t stepsPerEpoch = kSamples / args.globalBatch;
  torch::manual_seed(1234);
  auto x = torch::randn({kSamples, 8});
  auto y = torch::randn({kSamples, 4});
  torch::manual_seed(7);
  torch::nn::Sequential net(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 4));
  std::unique_ptr<dtrain::DistributedDataParallel<torch::nn::Sequential>> ddp;
  if (group)
    ddp = std::make_unique<dtrain::DistributedDataParallel<torch::nn::Sequential>>(net, group);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::StepLR schedule(sgd, /*step_size=*/3, /*gamma=*/0.7);
  dtrain::SamplerOptions samplerOptions;
  samplerOptions.seed = 5;
  dtrain::DistributedSampler sampler(kSamples, group ? group->size() : 1, group ? group->rank() : 0,
                                     samplerOptions);
  std::shared_ptr<dtrain::TrainingState> state;
  if (group) {
    state = std::make_shared<dtrain::TrainingState>(group);
    state->addModule("model", net);
    state->addOptimizer("sgd", sgd);
    state->addScheduler("lr", schedule);
    state->addSampler("data", sampler);
  }
  int discarded = 0;
  for (int64_t step = 0; step < args.steps;) {
    if (step % stepsPerEpoch == 0) sampler.setEpoch(step / stepsPerEpoch);
    const int world = group ? group->size() : 1;
    auto work = [&] {
      auto indices = sampler.next(static_cast<size_t>(args.globalBatch / world)).value();
      auto idx = torch::tensor(std::vector<int64_t>(indices.begin(), indices.end()), torch::kLong);
      sgd.zero_grad();
      auto in = x.index_select(0, idx);
      auto out = ddp ? (*ddp)(in) : net->forward(in);
      torch::mse_loss(out, y.index_select(0, idx)).backward();
    };
    if (state) {
      state->beginStep(step);
      if (!state->tryStep(work)) {
        ++discarded;
        std::cout << fmt::format("rank {} discarded step {}: now rank {} of {} (epoch {})\n",
                                 group->rank(), step, group->rank(), group->size(), group->epoch())
                  << std::flush;
        step = state->currentStep();
        continue;
      }
    } else {
      work();
    }
    sgd.step();
    schedule.step();
    if (group && group->rank() == 0) {
      std::cout << fmt::format("step {} world {}\n", step, group->size()) << std::flush;
    }
    ++step;
    if (args.stepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(args.stepMs));
  }
  auto mine = flat(*net);
  if (!group) {
    if (!args.out.empty()) write(args.out, mine);
    return 0;
  }
  auto all = group->allgather(mine);
  bool same = true;
  for (const auto& t : all) same = same && torch::equal(t, all[0]);
  std::cout << fmt::format("rank {} final {} world {} epoch {} discarded {}\n", group->rank(),
                           same ? "identical across ranks" : "DIFFERS across ranks", group->size(),
                           group->epoch(), discarded)
            << std::flush;
  if (group->rank() == 0 && !args.out.empty()) write(args.out, mine);
  group->shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << "node_loss_worker: " << e.what() << "\n";
    return 1;
  }
}
