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
  // DDP options, the same on both sides: DdpOptions::gradientAsBucketView / PyTorch's
  // gradient_as_bucket_view, and "fp16" / "bf16" compression / PyTorch's fp16_compress_hook and
  // bf16_compress_hook.
  // -1: each side's default (dtrain: on; PyTorch: off), 0: both off, 1: both on.
  int gradAsBucketView = -1;
  std::string compression = "none";
  std::string out;            // rank 0 writes its result here (JSON)
  // Turn-taking with the driver (see Note [Turns]): "<dir>/<side>", rank 0 reads "<...>.go" and
  // writes "<...>.done". Empty: run freely.
  std::string turns;
  // dtrain's job without shared memory (DTRAIN_SHM=0): Gloo over loopback, as before issue 13.
  bool noShm = false;
};

// Note [Turns]
// The development machine is shared and its load swings within seconds, more than the
// differences measured here. So both jobs, dtrain's and PyTorch's, run at once and take turns step
// by step: before each step (warm-up ones included) rank 0 of a job waits for a byte on its "go"
// FIFO, the job's ranks meet in a barrier, run and time the step, meet again, and rank 0 answers
// on "done". The driver hands the turns out alternately, so every dtrain step has a PyTorch step
// next to it in time, and a job that waits for its turn sleeps in a barrier (no CPU).
// Turns per job: warmup + 2 * steps (each measured step is a synchronised one followed by a
// communication-free one).

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
