// The worker of ddp_step_bench: times one model's training step under dtrain's DDP, alternating
// synchronised steps with communication-free ones (noSync) so that both see the same conditions.
#include <chrono>
#include <fstream>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "bench_models.h"
#include "ddp_step_bench.h"
#include "dtrain/ddp.h"
#include "dtrain/error.h"
#include "dtrain/init.h"

namespace dtrain::bench {

namespace {

double msSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

template <typename Net>
StepResult measure(Net net, const torch::Tensor& x, const torch::Tensor& y, bool classify,
                   const StepConfig& config, const std::shared_ptr<ProcessGroup>& group) {
  DistributedDataParallel<Net> ddp(net, group);
  torch::optim::SGD sgd(ddp.parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  auto step = [&] {
    sgd.zero_grad();
    auto out = ddp(x);
    auto loss = classify ? torch::nn::functional::cross_entropy(out, y) : torch::mse_loss(out, y);
    loss.backward();
    sgd.step();
  };
  StepResult result;
  result.impl = "dtrain";
  result.model = config.model;
  for (const auto& p : ddp.parameters()) result.parameters += p.numel();
  for (int i = 0; i < config.warmup; ++i) step();
  for (int i = 0; i < config.steps; ++i) {
    auto start = std::chrono::steady_clock::now();
    step();
    result.stepMs.push_back(msSince(start));
    result.waitMs.push_back(
        std::chrono::duration<double, std::milli>(ddp.lastIteration().waited).count());
    start = std::chrono::steady_clock::now();
    {
      auto guard = ddp.noSync();
      step();
    }
    result.noSyncMs.push_back(msSince(start));
  }
  return result;
}

}  // namespace

int runWorker(const StepConfig& config) {
  torch::set_num_threads(1);
  auto group = init();  // from the environment ddp_step_bench gives its workers
  torch::manual_seed(group->rank());  // each rank its own data; DDP broadcasts rank 0's model
  StepResult result;
  if (config.model == "mlp") {
    int64_t width = config.smoke ? 64 : 4096, io = config.smoke ? 32 : 1024;
    result = measure(BenchMlp(width, io), torch::randn({config.batch, io}),
                     torch::randn({config.batch, io}), false, config, group);
  } else if (config.model == "resnet18") {
    result = measure(ResNet18(10, config.smoke ? 8 : 64), torch::randn({config.batch, 3, 32, 32}),
                     torch::randint(0, 10, {config.batch}, torch::kLong), true, config, group);
  } else {
    DTRAIN_THROW(InvalidArgument, "unknown model \"{}\" (mlp | resnet18)", config.model);
  }
  if (group->rank() == 0 && !config.out.empty()) {
    std::ofstream(config.out) << toJson(result) << "\n";
  }
  group->barrier();
  return 0;
}

std::string toJson(const StepResult& r) {
  nlohmann::json j = {{"impl", r.impl},       {"model", r.model},       {"parameters", r.parameters},
                      {"step_ms", r.stepMs},  {"nosync_ms", r.noSyncMs}, {"wait_ms", r.waitMs}};
  return j.dump();
}

StepResult fromJson(const std::string& text) {
  auto j = nlohmann::json::parse(text);
  StepResult r;
  r.impl = j.at("impl").get<std::string>();
  r.model = j.at("model").get<std::string>();
  r.parameters = j.at("parameters").get<int64_t>();
  r.stepMs = j.at("step_ms").get<std::vector<double>>();
  r.noSyncMs = j.at("nosync_ms").get<std::vector<double>>();
  if (j.contains("wait_ms")) r.waitMs = j.at("wait_ms").get<std::vector<double>>();
  return r;
}

}  // namespace dtrain::bench
