// The worker of ddp_step_bench: times one model's training step under dtrain's DDP, alternating
// synchronised steps with communication-free ones (noSync) so that both see the same conditions,
// in turns with the PyTorch job (Note [Turns] in benchmarks/common/bench_process.h).
#include <chrono>
#include <fstream>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "bench_models.h"
#include "common/bench_process.h"
#include "ddp_step_bench.h"
#include "dtrain/base/error.h"
#include "dtrain/torch/ddp.h"
#include "dtrain/torch/init.h"

namespace dtrain::bench {

namespace {

double msSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

template <typename Net>
StepResult measure(Net net, const torch::Tensor& x, const torch::Tensor& y, bool classify,
                   const StepConfig& config, const std::shared_ptr<ProcessGroup>& group) {
  DdpOptions options;
  if (config.gradAsBucketView >= 0) options.gradientAsBucketView = config.gradAsBucketView == 1;
  options.compression = config.compression == "fp16"   ? GradientCompression::Fp16
                        : config.compression == "bf16" ? GradientCompression::Bf16
                                                       : GradientCompression::None;
  DistributedDataParallel<Net> ddp(net, group, options);
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
  TurnTaker turns(config.turns, group->rank() == 0);  // Note [Turns]
  // One step in its turn; returns its milliseconds.
  auto turn = [&](bool sync) {
    turns.begin();
    group->barrier();
    auto start = std::chrono::steady_clock::now();
    if (sync) {
      step();
    } else {
      auto guard = ddp.noSync();
      step();
    }
    double ms = msSince(start);
    group->barrier();
    turns.end();
    return ms;
  };
  for (int i = 0; i < config.warmup; ++i) turn(true);
  for (int i = 0; i < config.steps; ++i) {
    result.stepMs.push_back(turn(true));
    result.waitMs.push_back(
        std::chrono::duration<double, std::milli>(ddp.lastIteration().waited).count());
    result.noSyncMs.push_back(turn(false));
  }
  return result;
}

}  // namespace

int runWorker(const StepConfig& config) {
  torch::set_num_threads(1);
  auto group = init();                // from the environment ddp_step_bench gives its workers
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
  result.backend = group->backend();
  if (group->rank() == 0 && !config.out.empty()) {
    std::ofstream(config.out) << toJson(result) << "\n";
  }
  group->barrier();
  return 0;
}

std::string toJson(const StepResult& r) {
  nlohmann::json j = {
      {"impl", r.impl},      {"model", r.model},        {"parameters", r.parameters},
      {"step_ms", r.stepMs}, {"nosync_ms", r.noSyncMs}, {"wait_ms", r.waitMs},
      {"backend", r.backend}};
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
  if (j.contains("backend")) r.backend = j.at("backend").get<std::string>();
  return r;
}

}  // namespace dtrain::bench
