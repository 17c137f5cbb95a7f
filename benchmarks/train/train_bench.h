#pragma once
// train_bench's two halves: the driver (train_bench.cpp) writes the data, starts dtrain's and
// PyTorch's jobs, hands out turns and prints the table; a worker (train_bench_worker.cpp) runs
// train_resnet's training step — loader thread, DDP, SGD — one step per turn.

#include <string>
#include <vector>

namespace dtrain::bench {

// What both sides train, step by step.
struct TrainConfig {
  std::string model = "resnet18";  // resnet18 (CIFAR stem, 32x32) | resnet50 (224x224)
  int batch = 32;                  // per rank
  int warmup = 3;
  int steps = 10;
  std::string data;            // resnet18: the CIFAR-10 binary directory
  std::string device = "cpu";  // cpu (Gloo, world size 2) | cuda (NCCL, world size 1)
  bool amp = false;            // autocast (float16 on CUDA, bfloat16 on the CPU) + GradScaler
  std::string out;             // rank 0 writes its result here (JSON)
  std::string turns;           // see Note [Turns] in benchmarks/common/bench_process.h
};

// One job's measurement: milliseconds per step, each from asking for the batch to the end of
// the optimizer step.
struct TrainResult {
  std::string impl;  // "dtrain" | "pytorch"
  std::string model;
  int64_t parameters = 0;
  std::vector<double> stepMs;
};

// Runs dtrain's side in this process (RANK, WORLD_SIZE and the store from the environment);
// returns the exit code.
int runTrainWorker(const TrainConfig& config);

std::string toJson(const TrainResult& result);
TrainResult trainResultFromJson(const std::string& text);

}  // namespace dtrain::bench
