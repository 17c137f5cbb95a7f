// A training program for ZeRO's real-process tests: started by `launch`, one process per rank,
// over shared memory or Gloo (DTRAIN_SHM=0). Each scenario trains the same model with plain DDP,
// ZeRO stage 1 and ZeRO stage 2 in turn and checks, on every rank, that the stages end within
// 1e-6 (relative) of DDP's parameters and bitwise equal across ranks. Prints "rank R PASS <name>"
// or "rank R FAIL <name>: <why>", exits 1 when any failed.
//
//   zero_worker --scenarios adamw,sgd-groups [--skipped K]
//
// adamw: 50 AdamW steps of 2 micro-batches (noSync()); sgd-groups: 20 SGD-momentum steps, two
// parameter groups. Both with an enabled GradScaler: under DTRAIN_FAULT=nan-grad@rank=R,step=S
// (the test sets it) one element of one rank's gradient is poisoned before the collective, which
// after a reduce-scatter reaches one rank's shard only; every rank must skip that step
// (--skipped 1), DDP's and both stages alike.
#include <iostream>
#include <sstream>

#include <fmt/format.h>
#include <torch/torch.h>

#include "../torch/zero/zero_test_support.h"
#include "dtrain/base/error.h"
#include "dtrain/torch/init.h"

namespace dtrain::testing {
namespace {

struct Args {
  std::vector<std::string> scenarios;
  int64_t skipped = 0;
};

void check(bool ok, const std::string& what) { DTRAIN_CHECK(ok, "{}", what); }

// Every rank's tensor equals rank 0's, bit for bit.
void checkIdenticalAcrossRanks(ProcessGroup& group, const std::string& name, const torch::Tensor& t) {
  auto all = group.allgather(t.contiguous());
  for (size_t r = 1; r < all.size(); ++r) {
    check(torch::equal(all[r], all[0]), fmt::format("{} differs between rank 0 and rank {}", name, r));
  }
}

void compareStages(const std::shared_ptr<ProcessGroup>& group, ZeroRun run, const Args& args) {
  run.world = group->size();
  const RankResult ddp = trainOnRank(run, group);
  check(ddp.skipped == args.skipped,
        fmt::format("DDP skipped {} steps, expected {}", ddp.skipped, args.skipped));
  for (int stage : {1, 2}) {
    run.stage = stage;
    const RankResult zero = trainOnRank(run, group);
    check(zero.skipped == args.skipped, fmt::format("stage {} skipped {} steps, expected {}",
                                                    stage, zero.skipped, args.skipped));
    for (const auto& [name, t] : ddp.params) {
      const double err = relativeError(zero.params.at(name), t);
      check(err <= 1e-6, fmt::format("stage {}: {} differs from DDP's by {:.3g} (max 1e-6)",
                                     stage, name, err));
      checkIdenticalAcrossRanks(*group, fmt::format("stage {} {}", stage, name),
                                zero.params.at(name));
    }
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
      } else {
        DTRAIN_THROW(InvalidArgument, "unknown scenario {}", name);
      }
      std::cout << fmt::format("rank {} PASS {}\n", group->rank(), name) << std::flush;
    } catch (const std::exception& e) {
      ++failures;
      std::cout << fmt::format("rank {} FAIL {}: {}\n", group->rank(), name, e.what()) << std::flush;
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
