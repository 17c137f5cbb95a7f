#pragma once
// What goes into a checkpoint and how it comes back: the objects a Checkpointer was given turned
// into named entries (Note [Checkpoint entries]), and entries read back into those objects'
// existing tensors. Private to the torch layer.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "../optimizer_state.h"
#include "../state/registry.h"
#include "checkpoint/format.h"
#include "dtrain/torch/checkpoint.h"
#include "dtrain/torch/distributed_sampler.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class OptimizerParamState;
}

namespace dtrain {
class ShardedOptimizer;
}

namespace dtrain::checkpoint {

// One entry to write: tensors and numbers keep their tensor (any device or layout); strings and
// bytes own their bytes.
struct Item {
  EntrySpec spec;
  at::Tensor tensor;
  std::vector<uint8_t> bytes;
  size_t size() const;
};

// What a TrainingState registered (state/registry.h).
using state::SamplerEntry;
using state::ShardedEntry;

// A parameter that a registered ShardedOptimizer holds in shards: the optimizer's name, the
// parameter's name in its shard records, its dtype, and whether its unit frees it between uses
// (ZeRO stage 3's marked units: Note [Stage-3 checkpoints], checkpoint/zero3.cpp).
struct ShardedParam {
  std::string optimizer;
  std::string record;
  at::ScalarType dtype = at::kFloat;
  bool freed = false;
};

// What a save or restore walks: the registered state and, for ZeRO stage 3, every parameter of
// its sharded optimizers by its TensorImpl (registryOf()).
struct Registry {
  state::Registry& state;
  std::map<const void*, ShardedParam> shardedParams;
};

// --- ZeRO stage 3 (checkpoint/zero3.cpp, Note [Stage-3 checkpoints]) ---

// `state` with the parameters its sharded optimizers hold in shards, as they are now.
Registry registryOf(state::Registry& state);
// Records the parameters `optimizer`, registered as `name`, holds in shards.
void addShardedParams(Registry& registry, const std::string& name, ShardedOptimizer& optimizer);
// `t`'s entry in registry.shardedParams, or nullptr.
const ShardedParam* shardedParamOf(const Registry& registry, const at::Tensor& t);
// Where the shards of a freed parameter go: its module entry and dtype.
struct ModuleShard {
  std::string entry;  // module/M/<key>
  at::ScalarType dtype = at::kFloat;
};
// (optimizer, record name) -> the module entry of each freed parameter of a registered module.
using ModuleShards = std::map<std::pair<std::string, std::string>, ModuleShard>;
ModuleShards moduleShards(const Registry& registry);
// The same for every parameter a registered ShardedOptimizer holds, freed or not: where a
// restore finds a master saved only as its module entry (Note [One copy of a freed master]).
ModuleShards moduleEntries(const Registry& registry);
// Throws InvalidArgument when parameter `key` of module `module` holds no memory: a ZeRO-3 unit
// freed it, and no stage-3 ShardedOptimizer over it is registered to save or restore it.
void checkHoldsMemory(const std::string& module, const std::string& key, const at::Tensor& t);

// The state every rank shares, from this rank's objects.
std::vector<Item> replicatedItems(const Registry& registry,
                                  const std::map<std::string, MetadataValue>& metadata);

// This rank's own state (random generators, samplers' positions), as one blob for the gather.
std::vector<uint8_t> encodeRankState(const state::Registry& registered);
// Rank `rank`'s blob as entries owned by it. Throws CheckpointError for a malformed blob.
std::vector<Item> rankItems(uint32_t rank, const std::vector<uint8_t>& blob);

// Checks that `reader` holds everything registered, with matching types and shapes, before
// anything is overwritten; throws CheckpointError naming the first difference.
void checkRestorable(const CheckpointReader& reader, const Registry& registry);
// Reads the replicated entries into the registered objects (existing tensors, no new ones
// except optimizer state the optimizer has not created yet) and the metadata. The reads are
// spread over threads that work on `device` (forEachSpread).
void restoreReplicated(const CheckpointReader& reader, Registry& registry,
                       std::map<std::string, MetadataValue>& metadata, bool sameWorldSize,
                       const c10::Device& device);
// Reads rank `rank`'s own entries (absent after a world-size change for new ranks).
void restoreRankState(const CheckpointReader& reader, state::Registry& registered, uint32_t rank,
                      bool sameWorldSize);

// --- shared by the writing (state.cpp) and reading (state_read.cpp) sides ---

// Optimizer state by type: ../optimizer_state.h.
using optim_state::fieldsOf;
using optim_state::newParamState;
using optim_state::optimizerType;
using optim_state::StateFields;
// "optimizer/<name>/": where an optimizer's entries go.
std::string optimizerPrefix(const std::string& name);
// A module's parameters, then its buffers, by their recursive names.
std::vector<std::pair<std::string, at::Tensor>> moduleTensors(const torch::nn::Module& module);

// Format <-> torch dtypes; the first throws CheckpointError for a dtype the format lacks.
DType toFormatDType(at::ScalarType type, const std::string& what);
at::ScalarType toScalarType(DType dtype);

// Reads `entries` (one tensor, possibly sharded) into `target` (same dtype and shape), straight
// into its memory when it is a contiguous CPU tensor.
void readTensor(const CheckpointReader& reader, const std::vector<const Entry*>& entries,
                at::Tensor& target);

// Runs job(0..n-1) spread over up to at::get_num_threads() threads, at most 4 (the caller's among
// them), balanced by weight(i): a restore's reads and an asynchronous save's snapshot are
// memory-bound copies that a big machine does faster on several cores. Each helper thread first
// runs `enterThread` (when given): copies into CUDA tensors from a fresh thread would otherwise
// run with device 0 current and create a context there in every rank. Rethrows the first error
// after all have finished.
void forEachSpread(size_t n, const std::function<uint64_t(size_t)>& weight,
                   const std::function<void(size_t)>& job,
                   const std::function<void()>& enterThread = nullptr);

// What forEachSpread's helper threads run first so that they work on `device` as the caller
// does: for a CUDA device, makes it current; nothing for the CPU.
std::function<void()> useDeviceInThread(const c10::Device& device);

}  // namespace dtrain::checkpoint
