// recompute_bench --worker: one configuration in this process (dtrain's side). ResNet-50 is
// examples::ResNet (ImageNet stem, 1000 classes) with ResNetOptions::recompute, the model
// train_resnet --recompute trains: the stem and each residual block recomputed, the head not.
// The deep MLP is a Sequential of Linear -> LayerNorm -> tanh blocks in `segments` recomputed
// segments (recomputeSequential). Tensor bytes are counted by CountingCpuAllocator (on the GPU,
// by the CUDA caching allocator's statistics).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "common/stats.h"
#include "counting_allocator.h"
#include "dtrain/base/error.h"
#include "dtrain/torch/autocast.h"
#include "dtrain/torch/grad_scaler.h"
#include "dtrain/torch/host_memory.h"
#include "dtrain/torch/recompute.h"
#include "models/resnet.h"
#include "recompute_bench.h"

namespace dtrain::bench {
namespace {

using Clock = std::chrono::steady_clock;

torch::nn::Sequential deepMlp(int64_t blocks, int64_t width) {
  torch::nn::Sequential net;
  for (int64_t b = 0; b < blocks; ++b) {
    net->push_back(torch::nn::Linear(width, width));
    net->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
    net->push_back(torch::nn::Functional(torch::tanh));
  }
  return net;
}

// The model under test as a forward function and its parameters.
struct Model {
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::vector<torch::Tensor> parameters;
  torch::Tensor input, target;
  bool classes = false;  // cross-entropy over target classes, else mean square
};

Model build(const RecomputeRun& run, const torch::Device& device) {
  torch::manual_seed(1);
  Model m;
  if (run.model == "resnet50") {
    examples::ResNetOptions options;
    options.arch = "resnet50";
    options.recompute = run.recompute;
    examples::ResNet net = examples::makeResNet(options);
    net->to(device);
    m.forward = [net](const torch::Tensor& x) mutable { return net(x); };
    m.parameters = net->parameters();
    m.input = torch::randn({run.batch, 3, run.size, run.size}, device);
    m.target = torch::randint(0, options.numClasses, {run.batch},
                              torch::TensorOptions().dtype(torch::kLong).device(device));
    m.classes = true;
    return m;
  }
  DTRAIN_CHECK_ARG(run.model == "mlp", "unknown model '{}' (resnet50 | mlp)", run.model);
  auto net = deepMlp(run.blocks, run.width);
  net->to(device);
  const int64_t segments = run.segments;
  m.forward = [net, segments, recompute = run.recompute](const torch::Tensor& x) mutable {
    return recompute ? recomputeSequential(net, segments, x) : net->forward(x);
  };
  m.parameters = net->parameters();
  m.input = torch::randn({run.batch, run.width}, device);
  return m;
}

struct Memory {
  testing::CountingCpuAllocator* cpu = nullptr;
  bool gpu = false;
  int64_t live() const { return gpu ? cudaLiveBytes() : cpu->live(); }
  int64_t peak() const { return gpu ? cudaPeakBytes() : cpu->peak(); }
  void resetPeak() const { gpu ? resetCudaPeak() : cpu->resetPeak(); }
};

}  // namespace

void runRecomputeWorker(const RecomputeRun& run, const std::string& out) {
  torch::set_num_threads(run.threads);
  // The cache first: the counting allocator then counts tensor bytes in front of it.
  if (run.hostCache) DTRAIN_CHECK(enableHostMemoryCache(), "the host memory cache did not install");
  Memory memory;
  memory.gpu = run.gpu;
  if (!run.gpu) memory.cpu = &testing::CountingCpuAllocator::install();
  const torch::Device device = run.gpu ? torch::Device(torch::kCUDA, 0)
                                       : torch::Device(torch::kCPU);
  Model m = build(run, device);
  torch::optim::SGD sgd(m.parameters, torch::optim::SGDOptions(0.01).momentum(0.9));
  GradScalerOptions scalerOptions;
  scalerOptions.enabled = run.gpu;
  GradScaler scaler(nullptr, scalerOptions);
  auto sync = [&] {
    if (run.gpu) torch::cuda::synchronize();
  };

  RecomputeResult result;
  std::vector<double> forward, backward, step;
  for (int s = 0; s < run.warmup + run.steps; ++s) {
    sync();
    const auto t0 = Clock::now();
    // The gradients go (libtorch 2.x's default, as the peer's zero_grad(set_to_none=True)):
    // both peaks count the gradients backward makes.
    sgd.zero_grad(/*set_to_none=*/true);
    const int64_t base = memory.live();
    memory.resetPeak();
    torch::Tensor loss;
    {
      AutocastGuard autocast(device, run.gpu);
      torch::Tensor out = m.forward(m.input);
      loss = m.classes ? torch::nn::functional::cross_entropy(out, m.target) : out.pow(2).mean();
    }
    sync();
    const auto t1 = Clock::now();
    result.keptBytes = memory.live() - base;
    scaler.scale(loss).backward();
    sync();
    const auto t2 = Clock::now();
    result.peakBytes = memory.peak() - base;
    if (s == 0) {
      result.firstLoss = loss.item<double>();
      for (const auto& p : m.parameters) result.firstGradSum += p.grad().sum().item<double>();
    }
    loss = torch::Tensor();
    scaler.step(sgd);
    scaler.update();
    sync();
    const auto t3 = Clock::now();
    if (s < run.warmup) continue;
    forward.push_back(std::chrono::duration<double>(t1 - t0).count());
    backward.push_back(std::chrono::duration<double>(t2 - t1).count());
    step.push_back(std::chrono::duration<double>(t3 - t0).count());
  }
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  nlohmann::json j = {{"forward_s", median(forward)},
                      {"backward_s", median(backward)},
                      {"step_s", median(step)},
                      {"kept_bytes", result.keptBytes},
                      {"peak_bytes", result.peakBytes},
                      {"first_loss", result.firstLoss},
                      {"first_grad_sum", result.firstGradSum},
                      {"peak_rss_bytes", static_cast<int64_t>(usage.ru_maxrss) * 1024}};
  std::ofstream(out) << j.dump() << "\n";
}

}  // namespace dtrain::bench
