#pragma once
// state::Rollback: what TrainingState keeps so that, under ZeRO, the survivors of a lost node can
// all go back to the start of one earlier step (Note [Shard mirrors] in
// runtime/torch/zero/shard_mirror.cpp): copies of the replicated state -- module buffers, the
// other optimizers, the sharded optimizers' group options, schedulers, scalers, samplers and the
// CPU generator -- taken where the sharded state is mirrored. Private to the torch layer.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include "dtrain/torch/distributed_sampler.h"
#include "dtrain/torch/grad_scaler.h"

namespace dtrain {
class ProcessGroup;
}

namespace dtrain::state {

struct Registry;

// The replicated state at the start of step `generation`.
struct ReplicaCopy {
  int64_t generation = -1;
  std::vector<at::Tensor> buffers;      // every registered module's, in order
  std::vector<std::string> optimizers;  // the unsharded optimizers, serialized
  // Each sharded optimizer's group options (a scheduler's learning rate).
  std::vector<std::vector<std::unique_ptr<torch::optim::OptimizerOptions>>> shardedOptions;
  std::vector<unsigned> schedulers;
  std::vector<GradScalerState> scalers;
  std::vector<SamplerState> samplers;  // where the step begins
  at::Tensor cpuGenerator;
};

struct Rollback {
  ReplicaCopy current;  // the last committed generation's
  ReplicaCopy pending;  // the one being mirrored, until its commit
  ReplicaCopy live;     // at a failure that changed no sharded state: the failed step's start
  int64_t lastRefresh = -1;
  bool refreshNow = false;  // after a restore: the mirrors are of a world that is gone
  std::string unmirrored;   // why a sharded optimizer is not mirrored (then none is)
};

// Copies `registry`'s replicated state as it is at the start of step `generation` (the samplers'
// positions from beginStep()).
void copyReplicated(Registry& registry, int64_t generation, ReplicaCopy& into);
// Puts it back, the samplers re-sharded for `group`'s world; drops the modules' gradients.
void restoreReplicated(Registry& registry, ProcessGroup& group, const ReplicaCopy& from);

}  // namespace dtrain::state
