#pragma once
// recompute_bench: what one measured process runs and reports (benchmarks/README.md). The driver
// (recompute_bench.cpp) starts one process per configuration and repetition: this program with
// --worker (recompute_worker.cpp) for dtrain, recompute_peer.py for PyTorch.

#include <cstdint>
#include <string>

namespace dtrain::bench {

// One process's job: a model trained for warmup + steps steps, plainly or with recompute.
struct RecomputeRun {
  std::string model = "resnet50";  // resnet50 | mlp
  bool recompute = false;
  int64_t batch = 16;
  int64_t size = 224;    // resnet50: image side
  int64_t blocks = 64;   // mlp: Linear -> LayerNorm -> tanh blocks
  int64_t width = 256;   // mlp: features
  int64_t segments = 8;  // mlp: recomputed segments (resnet50: the stem and each block)
  int warmup = 1;
  int steps = 3;
  int threads = 1;
  bool gpu = false;        // cuda:0 with float16 autocast and a GradScaler
  bool hostCache = false;  // dtrain::enableHostMemoryCache() first (dtrain/torch/host_memory.h)
};

// What it reports (medians over the timed steps; bytes of the last step).
struct RecomputeResult {
  double forwardSeconds = 0;   // forward and loss
  double backwardSeconds = 0;  // backward()
  double stepSeconds = 0;      // zero_grad, forward, backward, optimizer step
  int64_t keptBytes = 0;       // tensor bytes alive after forward, beyond those before it
  int64_t peakBytes = 0;       // the most alive at once over forward and backward, beyond those
  double firstLoss = 0;        // step 0's loss: the same with and without recompute
  double firstGradSum = 0;     // sum of step 0's gradients (float64)
  int64_t peakRssBytes = 0;    // the process's peak resident memory (getrusage)
};

// The worker: runs `run` in this process and writes the result as JSON to `out`.
void runRecomputeWorker(const RecomputeRun& run, const std::string& out);

// Peak device memory of cuda:0 since the last reset (0 without a CUDA libtorch).
void resetCudaPeak();
int64_t cudaPeakBytes();
int64_t cudaLiveBytes();

}  // namespace dtrain::bench
