#pragma once
// ddp_step_bench's two halves: the driver (ddp_step_bench.cpp) starts the worker processes of
// each measurement and prints the table; a worker (ddp_step_worker.cpp) times training steps of
// one model under DistributedDataParallel, with and without communication.

#include <string>
#include <vector>

namespace dtrain::bench {

struct StepConfig {
  std::string model = "mlp";  // mlp | resnet18
  int batch = 64;             // per rank
  int warmup = 3;
  int steps = 10;             // timed synchronised steps, and as many communication-free ones
  bool smoke = false;         // tiny models: checks the plumbing only
  std::string out;            // rank 0 writes its result here (JSON)
};

// One worker's measurement: milliseconds per step.
struct StepResult {
  std::string impl;  // "dtrain" | "pytorch"
  std::string model;
  int64_t parameters = 0;
  std::vector<double> stepMs;    // forward + backward (+ allreduce) + optimizer step
  std::vector<double> noSyncMs;  // the same step without communication
  std::vector<double> waitMs;    // dtrain only: the end of backward blocked on allreduces
};

// Runs the worker side in this process (RANK, WORLD_SIZE and the store from the environment);
// returns the exit code.
int runWorker(const StepConfig& config);

std::string toJson(const StepResult& result);
StepResult fromJson(const std::string& text);

}  // namespace dtrain::bench
