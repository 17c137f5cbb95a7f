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
  int steps = 10;      // timed synchronised steps, and as many communication-free ones
  bool smoke = false;  // tiny models: checks the plumbing only
  // DDP options, the same on both sides: DdpOptions::gradientAsBucketView / PyTorch's
  // gradient_as_bucket_view, and "fp16" / "bf16" compression / PyTorch's fp16_compress_hook and
  // bf16_compress_hook.
  // -1: each side's default (dtrain: on; PyTorch: off), 0: both off, 1: both on.
  int gradAsBucketView = -1;
  std::string compression = "none";
  std::string out;  // rank 0 writes its result here (JSON)
  // Turn-taking with the driver (Note [Turns] in benchmarks/common/bench_process.h):
  // "<dir>/<side>", rank 0 reads "<...>.go" and writes "<...>.done". Empty: run freely.
  std::string turns;
  // dtrain's job without shared memory (DTRAIN_SHM=0): Gloo over loopback, as before issue 13.
  bool noShm = false;
};

// Turns per job (Note [Turns] in benchmarks/common/bench_process.h): warmup + 2 * steps, each
// measured step being a synchronised one followed by a communication-free one.

// One worker's measurement: milliseconds per step.
struct StepResult {
  std::string impl;  // "dtrain" | "pytorch"
  std::string model;
  int64_t parameters = 0;
  std::vector<double> stepMs;    // forward + backward (+ allreduce) + optimizer step
  std::vector<double> noSyncMs;  // the same step without communication
  std::vector<double> waitMs;    // dtrain only: the end of backward blocked on allreduces
  std::string backend;           // dtrain only: the process group's backend ("shm", "gloo")
};

// Runs the worker side in this process (RANK, WORLD_SIZE and the store from the environment);
// returns the exit code.
int runWorker(const StepConfig& config);

std::string toJson(const StepResult& result);
StepResult fromJson(const std::string& text);

}  // namespace dtrain::bench
