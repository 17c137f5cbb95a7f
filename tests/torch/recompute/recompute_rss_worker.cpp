// What the OOM killer sees of activation recompute on the CPU: a program as
// dtrain/torch/recompute.h shows one (dtrain::init() under launch, then recomputeSequential over
// a 24-layer MLP of Linear(512, 512) + Tanh at batch 8192), one forward and backward, measured as
// the resident memory the step adds (VmHWM after it, its peak reset before, minus VmRSS before)
// beside the peak of the tensor bytes it adds
// (the host memory cache's counters, which dtrain::init()
// installs on the CPU). Prints "<mode> rss_added=<bytes> tensor_peak=<bytes> cache=<0|1>".
// Usage: recompute_rss_worker plain|recompute
#include <fstream>
#include <iostream>
#include <string>

#include <torch/torch.h>

#include "dtrain/torch/host_memory.h"
#include "dtrain/torch/init.h"
#include "dtrain/torch/recompute.h"

namespace {

// A "Vm...:  <n> kB" line of /proc/self/status, in bytes.
size_t statusBytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) == 0) return std::stoull(line.substr(key.size() + 1)) * 1024;
  }
  return 0;
}

int run(const std::string& mode) {
  auto group = dtrain::init();
  torch::manual_seed(0);
  torch::nn::Sequential stack;
  for (int i = 0; i < 24; ++i) {
    stack->push_back(torch::nn::Linear(512, 512));
    stack->push_back(torch::nn::Tanh());
  }
  torch::Tensor x = torch::randn({8192, 512});
  std::ofstream("/proc/self/clear_refs") << "5";  // VmHWM := VmRSS
  dtrain::resetHostMemoryCachePeaks();
  const size_t rssBefore = statusBytes("VmRSS");
  const size_t tensorsBefore = dtrain::hostMemoryCacheStats().allocatedBytes;
  torch::Tensor out = mode == "recompute" ? dtrain::recomputeSequential(stack, 6, x)
                                          : stack->forward(x);
  out.pow(2).mean().backward();
  out = torch::Tensor();
  const size_t peak = statusBytes("VmHWM");
  const dtrain::HostMemoryCacheStats stats = dtrain::hostMemoryCacheStats();
  std::cout << mode << " rss_added=" << (peak > rssBefore ? peak - rssBefore : 0)
            << " tensor_peak=" << stats.peakAllocatedBytes - tensorsBefore
            << " cache=" << dtrain::hostMemoryCacheEnabled() << std::endl;
  group->shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "plain" && mode != "recompute") {
    std::cerr << "usage: recompute_rss_worker plain|recompute\n";
    return 2;
  }
  try {
    return run(mode);
  } catch (const std::exception& e) {
    std::cerr << "recompute_rss_worker: " << e.what() << "\n";
    return 1;
  }
}
