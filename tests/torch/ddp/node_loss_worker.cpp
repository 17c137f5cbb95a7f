// A deterministic DDP trainer that survives a lost node, for the node-loss tests: run by
// `launch --on-node-loss continue` on a simulated cluster, or alone with --reference (one process
// on the whole global batch, the run every survivor must end equal to). SGD with momentum, a step
// LR schedule and a DistributedSampler in a TrainingState; every step's communicating part in
// tryStep(). It obeys DTRAIN_FAULT at each step's start (beginStep). At the end the survivors
// compare their parameters bit for bit and the new rank 0 writes them to --out.
//
//   node_loss_worker [--reference] [--steps N] [--global-batch B] [--step-ms MS] [--out FILE]
//                    [--zero 1|2|3 [--mirror-every K]] [--startup-ms MS] [phase flags, below]
//
// --startup-ms MS: a rank taken into a running round (DTRAIN_JOIN_EPOCH set) sleeps MS before
// its first step, as a slow start-up would (a large model, its data, a GPU's context).
//
// --zero S: Adam instead, sharded by a ShardedOptimizer of stage S over the DDP wrapper (units
// small enough that the model is several of them; stage 3: every layer a unit), its step inside
// tryStep's work (it has collectives), the sharded state mirrored every K steps
// (TrainingState::setMirrorInterval; the default 10 without --mirror-every). After a loss the
// survivors roll back to the newest complete generation, run its steps again and say "rolled back
// to step G" in their discard line. With --reference: plain Adam, the run to equal.
//
// The data: 48 fixed samples; every step consumes a global batch of B (12) of an epoch's order,
// split over the ranks (B / world each, so 6 and 4 ranks both divide it): the math of a step does
// not depend on the world size.
#include <signal.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <torch/torch.h>

#include "dtrain/dtrain.h"

namespace {

// --- Phase flags: where in a step a node is lost, and a Checkpointer to lose it in. ---
//   --collective-timeout-ms MS    the group's collective timeout (a hung peer's bound)
//   --bucket-bytes B              DDP's bucket caps (small: several allreduces per backward)
//   --kill-in-backward S:R        rank R SIGKILLs itself in step S's backward, from the gradient
//                                 hook of the first layer's weight: after the last layer's bucket
//                                 allreduce began, before the first layer's
//   --kill-in-optimizer S:R:WHEN  rank R SIGKILLs itself in step S after tryStep() returned true
//                                 (--zero: inside tryStep's work), WHEN = before | after the
//                                 optimizer's step
//   --ckpt DIR --save-every K [--async]
//                                 a Checkpointer over the TrainingState: at the start of every
//                                 step S with S % K == 0 (inside tryStep's work, as
//                                 docs/training.md says) it saves the state after step S - 1;
//                                 at the end it saves the last step, restores it at the final
//                                 world size and prints "rank R restored step S saved at world W"
//   --subgroup                    every step allreduces over a subgroup of the program's own
//                                 (group->split(localRank)), made again when the epoch changes
//   --kill-after-save S:R         rank R SIGKILLs itself 150 ms after the save begun in step S
//                                 returned (its write still in flight under a slow
//                                 DTRAIN_IO_FAULT)
struct At {
  int64_t step = -1;
  int rank = -1;
  std::string when;
  bool now(int64_t s, int r) const { return s == step && r == rank; }
};

At parseAt(const std::string& flag, const std::string& text) {
  At at;
  const size_t colon = text.find(':');
  DTRAIN_CHECK_ARG(colon != std::string::npos, "{} needs STEP:RANK, got \"{}\"", flag, text);
  at.step = std::stoll(text.substr(0, colon));
  const std::string rest = text.substr(colon + 1);
  const size_t second = rest.find(':');
  at.rank = std::stoi(rest.substr(0, second));
  if (second != std::string::npos) at.when = rest.substr(second + 1);
  return at;
}

struct Phases {
  int64_t collectiveTimeoutMs = 60000;
  int64_t bucketBytes = 0;  // 0: DDP's defaults
  At killInBackward;
  At killInOptimizer;
  std::string ckpt;
  int64_t saveEvery = 0;
  bool async = false;
  At killAfterSave;
};

// True when `f` is a phase flag (its value taken with `next`).
bool parsePhaseFlag(const std::string& f, const std::function<std::string()>& next, Phases& p) {
  if (f == "--collective-timeout-ms") p.collectiveTimeoutMs = std::stoll(next());
  else if (f == "--bucket-bytes") p.bucketBytes = std::stoll(next());
  else if (f == "--kill-in-backward") p.killInBackward = parseAt(f, next());
  else if (f == "--kill-in-optimizer") p.killInOptimizer = parseAt(f, next());
  else if (f == "--ckpt") p.ckpt = next();
  else if (f == "--save-every") p.saveEvery = std::stoll(next());
  else if (f == "--async") p.async = true;
  else if (f == "--kill-after-save") p.killAfterSave = parseAt(f, next());
  else return false;
  return true;
}

[[noreturn]] void killSelf(const std::string& where) {
  std::cout << "killing myself " << where << "\n" << std::flush;
  ::raise(SIGKILL);
  std::abort();
}
// --- end of the phase flags ---

struct Args {
  bool reference = false;
  int64_t steps = 8;
  int64_t globalBatch = 12;
  int64_t stepMs = 0;
  std::string out;
  int zero = 0;             // 0: DDP
  int64_t mirrorEvery = 0;  // 0: TrainingState's default
  int64_t startupMs = 0;    // a newcomer's start-up
  bool subgroup = false;    // a group per local rank across nodes, allreduced in every step
  Phases phases;
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
    else if (f == "--zero") a.zero = std::stoi(next());
    else if (f == "--mirror-every") a.mirrorEvery = std::stoll(next());
    else if (f == "--startup-ms") a.startupMs = std::stoll(next());
    else if (f == "--subgroup") a.subgroup = true;
    else if (parsePhaseFlag(f, next, a.phases)) continue;
    else DTRAIN_THROW(dtrain::InvalidArgument, "unknown flag {}", f);
  }
  DTRAIN_CHECK_ARG(a.zero >= 0 && a.zero <= 3, "--zero {}: 1, 2 or 3", a.zero);
  DTRAIN_CHECK_ARG(a.mirrorEvery == 0 || a.zero > 0, "--mirror-every needs --zero");
  return a;
}

constexpr int64_t kSamples = 48;

// The parameters in the model's order, flattened; a stage-3 optimizer's gathered (its units
// hold them only while in use).
torch::Tensor flat(torch::nn::Module& m, dtrain::ShardedOptimizer* sharded = nullptr) {
  std::map<std::string, torch::Tensor> full;
  if (sharded && sharded->options().stage == 3) {
    for (auto& [name, tensor] : dtrain::gatherFullParameters(*sharded)) full[name] = tensor;
  }
  std::vector<torch::Tensor> parts;
  for (const auto& p : m.named_parameters()) {
    auto it = full.find(p.key());
    parts.push_back((it != full.end() ? it->second : p.value()).detach().flatten());
  }
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
    init.timeout = std::chrono::milliseconds(args.phases.collectiveTimeoutMs);
    init.connectTimeout = std::chrono::seconds(30);
    group = dtrain::init(init);
  }
  const int64_t stepsPerEpoch = kSamples / args.globalBatch;
  torch::manual_seed(1234);
  auto x = torch::randn({kSamples, 8});
  auto y = torch::randn({kSamples, 4});
  torch::manual_seed(7);
  torch::nn::Sequential net(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 4));
  if (group && args.zero == 3) net = dtrain::shardEveryChild(net);  // names unchanged
  std::unique_ptr<dtrain::DistributedDataParallel<torch::nn::Sequential>> ddp;
  if (group) {
    dtrain::DdpOptions ddpOptions;
    if (args.phases.bucketBytes > 0) {
      ddpOptions.firstBucketBytes = static_cast<size_t>(args.phases.bucketBytes);
      ddpOptions.bucketBytes = static_cast<size_t>(args.phases.bucketBytes);
    }
    ddp = std::make_unique<dtrain::DistributedDataParallel<torch::nn::Sequential>>(net, group,
                                                                                   ddpOptions);
  }
  // DDP: SGD with momentum. ZeRO: Adam, sharded over the ranks (one process: plain Adam).
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  dtrain::ShardedOptimizer* sharded = nullptr;
  const auto adam = torch::optim::AdamOptions(0.01);
  if (args.zero == 0) {
    optimizer = std::make_unique<torch::optim::SGD>(net->parameters(),
                                                    torch::optim::SGDOptions(0.05).momentum(0.9));
  } else if (!ddp) {
    optimizer = std::make_unique<torch::optim::Adam>(net->parameters(), adam);
  } else {
    dtrain::ZeroOptions zeroOptions;
    zeroOptions.stage = args.zero;
    zeroOptions.firstUnitBytes = 200;
    zeroOptions.unitBytes = 300;
    auto made = std::make_unique<dtrain::ShardedOptimizer>(
        *ddp, dtrain::optimizerFactory<torch::optim::Adam>(adam), zeroOptions);
    sharded = made.get();
    optimizer = std::move(made);
  }
  torch::optim::StepLR schedule(*optimizer, /*step_size=*/3, /*gamma=*/0.7);
  dtrain::SamplerOptions samplerOptions;
  samplerOptions.seed = 5;
  dtrain::DistributedSampler sampler(kSamples, group ? group->size() : 1, group ? group->rank() : 0,
                                     samplerOptions);
  std::shared_ptr<dtrain::TrainingState> state;
  if (group) {
    state = std::make_shared<dtrain::TrainingState>(group);
    state->addModule("model", net);
    state->addOptimizer(args.zero > 0 ? "adam" : "sgd", *optimizer);
    state->addScheduler("lr", schedule);
    state->addSampler("data", sampler);
    if (args.mirrorEvery > 0) state->setMirrorInterval(args.mirrorEvery);
  }
  const Phases& phases = args.phases;
  std::unique_ptr<dtrain::Checkpointer> ckpt;
  if (state && !phases.ckpt.empty()) {
    dtrain::CheckpointOptions o(phases.ckpt);
    o.timeout = std::chrono::seconds(20);
    o.handlePreemption = false;
    ckpt = std::make_unique<dtrain::Checkpointer>(state, o);
  }
  int64_t currentStep = 0;
  if (group && phases.killInBackward.step >= 0) {
    // The first layer's weight gets its gradient last: the later layers' buckets are in flight.
    net->ptr(0)->named_parameters()["weight"].register_hook([&](const torch::Tensor& g) {
      if (phases.killInBackward.now(currentStep, group->rank())) killSelf("in backward");
      return g;
    });
  }
  int discarded = 0;
  auto stepOptimizer = [&] {
    const bool killHere = group && phases.killInOptimizer.now(currentStep, group->rank());
    const std::string name = sharded ? "the sharded Adam's step()" : "sgd.step()";
    if (killHere && phases.killInOptimizer.when == "before") killSelf("before " + name);
    optimizer->step();
    if (killHere && phases.killInOptimizer.when == "after") killSelf("after " + name);
  };
  if (group && group->joinPending() && args.startupMs > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(args.startupMs));
  }
  // --subgroup: the pattern of docs/training.md ("Surviving a lost node"): a subgroup of the
  // program's own -- the ranks of one local rank across the nodes -- made again inside the step
  // whenever the group re-formed; its allreduce must count every node of the epoch.
  std::shared_ptr<dtrain::ProcessGroup> across;
  int acrossEpoch = -1;
  auto useSubgroup = [&] {
    if (acrossEpoch != group->epoch()) {
      across = group->split(group->localRank());
      acrossEpoch = group->epoch();
    }
    at::Tensor one = torch::ones({1});
    across->allreduce(one);
    DTRAIN_CHECK(one.item<float>() == static_cast<float>(across->size()),
                 "rank {}: the subgroup's allreduce counts {} of its {} ranks", group->rank(),
                 one.item<float>(), across->size());
  };
  for (int64_t step = 0; step < args.steps;) {
    if (step % stepsPerEpoch == 0) sampler.setEpoch(step / stepsPerEpoch);
    const int world = group ? group->size() : 1;
    currentStep = step;
    bool ran = false;  // a join at the step boundary re-forms before the work (false, not run)
    auto work = [&] {
      ran = true;
      if (ckpt && phases.saveEvery > 0 && step > 0 && step % phases.saveEvery == 0) {
        if (phases.async) {
          ckpt->saveAsync(step - 1);
        } else {
          ckpt->save(step - 1);
        }
        if (phases.killAfterSave.now(step, group->rank())) {
          std::this_thread::sleep_for(std::chrono::milliseconds(150));
          killSelf("during the save of step " + std::to_string(step - 1));
        }
      }
      if (args.subgroup && group) useSubgroup();
      auto indices = sampler.next(static_cast<size_t>(args.globalBatch / world)).value();
      auto idx = torch::tensor(std::vector<int64_t>(indices.begin(), indices.end()), torch::kLong);
      if (sharded) {
        sharded->zero_grad();
      } else {
        optimizer->zero_grad();
      }
      auto in = x.index_select(0, idx);
      auto out = ddp ? (*ddp)(in) : net->forward(in);
      torch::mse_loss(out, y.index_select(0, idx)).backward();
      // ZeRO's step all-gathers the parameters: it is part of the transaction.
      if (sharded) stepOptimizer();
    };
    if (state) {
      state->beginStep(step);
      if (!state->tryStep(work)) {
        if (ran) ++discarded;
        std::cout << fmt::format("rank {} {} step {}: now rank {} of {} (epoch {}){}\n",
                                 group->rank(), ran ? "discarded" : "re-formed before", step,
                                 group->rank(), group->size(), group->epoch(),
                                 sharded
                                     ? fmt::format(", rolled back to step {}", state->currentStep())
                                     : "")
                  << std::flush;
        step = state->currentStep();
        continue;
      }
    } else {
      work();
    }
    if (!sharded) stepOptimizer();
    schedule.step();
    if (group && group->rank() == 0) {
      std::cout << fmt::format("step {} world {}{}\n", step, group->size(),
                               across ? fmt::format(" subgroup {}", across->size()) : "")
                << std::flush;
    }
    ++step;
    if (args.stepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(args.stepMs));
  }
  auto mine = flat(*net, sharded);
  if (!group) {
    if (!args.out.empty()) write(args.out, mine);
    return 0;
  }
  if (ckpt) {
    // The last step, saved at the final world size and read back by every rank.
    ckpt->save(args.steps - 1);
    auto restored = ckpt->restore();
    DTRAIN_CHECK(restored.has_value(), "rank {}: nothing to restore", group->rank());
    std::cout << fmt::format("rank {} restored step {} saved at world {}\n", group->rank(),
                             restored->step, restored->savedWorldSize)
              << std::flush;
    mine = flat(*net);
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
