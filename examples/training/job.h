#pragma once
// What the sample trainers do alike around their training loops: join the job with the backend
// their --device asks for, add rank 0's own metrics sinks, and record the checkpoint writes that
// finished in the background.
//
//   auto group = examples::joinJob(opt.device);                        // "auto", "cpu", "cuda"
//   if (group->rank() == 0) examples::addOwnSinks(metrics, {file, port, tensorboardDir});
//   examples::recordCheckpointWrites(checkpointer.get(), metrics);     // after every step

#include <memory>
#include <string>

#include <dtrain/dtrain.h>

namespace examples {

// Rank, world size and the store from launch's environment; NCCL on GPUs (cuda:LOCAL_RANK) and
// Gloo on the CPU, unless `device` ("cpu", "cuda") says which.
std::shared_ptr<dtrain::ProcessGroup> joinJob(const std::string& device);

// Rank 0's own sinks, besides launch's: a JSONL file, TensorBoard events, a Prometheus endpoint
// (port 0: a free one, printed; -1: none). Empty strings: none.
struct OwnSinks {
  std::string metricsFile;
  int metricsPort = -1;
  std::string tensorboardDir;
};
void addOwnSinks(dtrain::metrics::Metrics& metrics, const OwnSinks& sinks);

// A checkpoint's background write ends while training goes on: its duration and size are
// recorded (under the step it saved) once it has, on each node's writer rank. Null: nothing.
void recordCheckpointWrites(dtrain::Checkpointer* checkpointer, dtrain::metrics::Metrics& metrics);

}  // namespace examples
