#pragma once
// state::Registry: what a dtrain::TrainingState holds -- the objects the program registered, by
// kind and in registration order, and its metadata -- as the runtime's consumers of the state
// (the Checkpointer) walk it. Private to the torch layer.

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/torch/distributed_sampler.h"
#include "dtrain/torch/training_state.h"

namespace dtrain {
class ProcessGroup;
class ShardedOptimizer;
}  // namespace dtrain

namespace dtrain::state {

// A sampler and, when the program gave one, what its training has consumed (addSampler).
struct SamplerEntry {
  std::string name;
  DistributedSampler* sampler = nullptr;
  std::function<size_t()> consumed;
  // The position to keep: after what was consumed, else after what was handed out.
  SamplerState state() const;
};

// A ShardedOptimizer registered with addOptimizer(): kept as its shard records.
struct ShardedEntry {
  std::string name;
  ShardedOptimizer* optimizer = nullptr;
};

struct Registry {
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> modules;
  std::vector<std::pair<std::string, torch::optim::Optimizer*>> optimizers;  // not sharded
  std::vector<ShardedEntry> sharded;
  std::vector<std::pair<std::string, torch::optim::LRScheduler*>> schedulers;
  std::vector<std::pair<std::string, GradScaler*>> scalers;
  std::vector<SamplerEntry> samplers;
  std::map<std::string, MetadataValue> metadata;
  // Each sampler's position where the current step began (TrainingState::beginStep): where a
  // step discarded after a lost node starts again (step_transaction.cpp).
  std::vector<SamplerState> stepStart;

  // The sharded optimizers, in registration order (what a restore from the mirrors takes).
  std::vector<ShardedOptimizer*> shardedOptimizers() const {
    std::vector<ShardedOptimizer*> out;
    for (const auto& e : sharded) out.push_back(e.optimizer);
    return out;
  }
};

// Unsets every registered module's parameters' gradients.
void dropGradients(Registry& registry);

// After `group` re-formed in a step that failed (TrainingState::tryStep): drops the registered
// modules' gradients, hands the state of a member that applied one step more over to the others,
// re-shards the samplers for the new world, and returns the step every member runs next.
// Collective over the new members. `*partial`: in, this rank's state may be part of another's (a
// settling cut short while it received: it is handed a whole state, never chosen to hand one);
// out, set when this rank starts receiving one (Note [Settling after a re-form]).
int64_t settleAfterReform(Registry& registry, ProcessGroup& group, int64_t step, bool* partial);

// Under ZeRO, after the sharded state was restored on every member of a group that took ranks
// into the running round (TrainingState::tryStep): `root`, a member, hands the replicated rest --
// module buffers, the other optimizers, the sharded optimizers' group options, schedulers,
// scalers, the samplers' positions where the step begins -- to every member, the samplers
// re-sharded for the world -- and drops the modules' gradients. Not the CPU generator: each rank
// keeps its own stream. Collective.
void handOverReplicated(Registry& registry, ProcessGroup& group, int root);

}  // namespace dtrain::state
