// A training program for the activation-recompute test across real processes (one per rank,
// Gloo), started by `launch`: a model with Dropout and BatchNorm under DistributedDataParallel,
// trained once plainly and once through RecomputeSequential from the same seeds, with and without
// findUnusedParameters. Every step's gradients and the final parameters, running statistics and
// random generator must be bitwise equal. Each rank prints "rank R PASS <scenario>" or
// "rank R FAIL <scenario>: <why>" and exits 1 when any failed. (Ranks as threads cannot test
// Dropout: they share one random generator.)
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include "dtrain/torch/ddp.h"
#include "dtrain/torch/init.h"
#include "recompute_models.h"

namespace dtrain::testing {
namespace {

struct Trained {
  std::vector<std::vector<torch::Tensor>> grads;  // per step, per parameter
  torch::nn::Sequential net;
  torch::Tensor nextRandom;
};

Trained train(const std::shared_ptr<ProcessGroup>& group, bool withRecompute, bool findUnused) {
  Trained t{{}, dropBnNet(1, 4, 16, 5, /*dropout=*/0.3), {}};
  DdpOptions options;
  options.findUnusedParameters = findUnused;
  DistributedDataParallel<EitherNet> ddp(EitherNet(t.net, withRecompute), group, options);
  torch::optim::SGD sgd(ddp.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::manual_seed(100 + static_cast<uint64_t>(group->rank()));  // data and masks per rank
  for (int step = 0; step < 3; ++step) {
    auto x = torch::randn({8, 16});
    auto y = torch::randint(0, 5, {8});
    sgd.zero_grad();
    torch::nn::functional::cross_entropy(ddp(x), y).backward();
    t.grads.emplace_back();
    for (const auto& p : t.net->parameters()) t.grads.back().push_back(p.grad().clone());
    sgd.step();
  }
  t.nextRandom = torch::rand({4});
  return t;
}

// Why the two runs differ, or "".
std::string compare(const Trained& actual, const Trained& expected) {
  for (size_t s = 0; s < expected.grads.size(); ++s) {
    for (size_t i = 0; i < expected.grads[s].size(); ++i) {
      if (!bitwiseEqual(actual.grads[s][i], expected.grads[s][i])) {
        return fmt::format("step {}: gradient of parameter {} differs", s, i);
      }
    }
  }
  if (auto name = firstDifference(*actual.net, *expected.net); !name.empty()) {
    return name + " differs after training";
  }
  if (!bitwiseEqual(actual.nextRandom, expected.nextRandom)) return "the random generator differs";
  return "";
}

int run() {
  InitOptions init;
  init.timeout = std::chrono::seconds(30);
  init.connectTimeout = std::chrono::seconds(30);
  auto group = dtrain::init(init);
  int failed = 0;
  for (bool findUnused : {false, true}) {
    const std::string scenario = findUnused ? "recompute-ddp-unused" : "recompute-ddp";
    std::string why;
    try {
      why = compare(train(group, true, findUnused), train(group, false, findUnused));
    } catch (const std::exception& e) {
      why = e.what();
    }
    std::cout << "rank " << group->rank() << (why.empty() ? " PASS " : " FAIL ") << scenario
              << (why.empty() ? "" : ": " + why) << std::endl;
    failed += !why.empty();
  }
  group->shutdown();
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace dtrain::testing

int main() {
  try {
    return dtrain::testing::run();
  } catch (const std::exception& e) {
    std::cerr << "recompute_worker: " << e.what() << "\n";
    return 2;
  }
}
