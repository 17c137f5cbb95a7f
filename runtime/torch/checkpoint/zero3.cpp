// Checkpoints of ZeRO stage 3: which module parameters a registered ShardedOptimizer holds in
// shards, and which of them its units free between uses. See Note [Stage-3 checkpoints].
#include <fmt/format.h>
#include <torch/nn/module.h>

#include "../zero/shard_group.h"
#include "dtrain/base/error.h"
#include "dtrain/torch/zero.h"
#include "state.h"

// Note [Stage-3 checkpoints]
// A marked unit's parameters hold no memory between uses (Note [ZeRO-3 unit lifecycle]); what
// persists is each rank's owned block, whose values its shard records carry already (`master`:
// the block itself, or its float32 master copy, which the block is the rounding of). So a save
// never gathers them: the writers that keep a rank's records (Note [Sharded checkpoint files])
// also write, from the same records, each freed parameter's range as an owned entry of its
// module -- module/M/<key>, element offset and count of the record, owner the rank, the
// parameter's dtype (the master rounded when it is float32 and the parameter is not). The root's
// units and every buffer are saved as at stages 1 and 2, replicated. A restore reads no freed
// parameter from its entry: loadShardState() writes the owned blocks from the `master` records
// (re-sharded onto today's units and world size) and a unit's next use gathers them; at stages 1
// and 2 a sharded parameter the file holds only as shards comes back the same way, through the
// all-gather after the load. Records go by parameter name and range, so a stage-3 checkpoint
// restores at another world size, into other units, or into stages 1 and 2, and a stage-1/2 one
// into stage 3. A module whose freed parameters no stage-3 optimizer registered with the
// Checkpointer covers is refused by name (its parameters have no bytes to read or write). Export
// assembles a parameter from its owned entries (every rank's range: a step's files on every node
// hold them between them; with one or two nodes each file holds all).

namespace dtrain::checkpoint {

Registry registryOf(state::Registry& state) {
  Registry registry{state, {}};
  for (const auto& s : state.sharded) addShardedParams(registry, s.name, *s.optimizer);
  return registry;
}

void addShardedParams(Registry& registry, const std::string& name, ShardedOptimizer& optimizer) {
  zero::ShardGroup& shards = optimizer.shards();
  for (size_t k = 0; k < shards.unitCount(); ++k) {  // frozen units too: Note [Frozen units]
    zero::ShardUnit& unit = shards.unit(k);
    for (const zero::UnitParam& p : unit.params()) {
      ShardedParam& s = registry.shardedParams[p.param.unsafeGetTensorImpl()];
      s.optimizer = name;
      s.record = p.name;
      s.dtype = unit.givenType();  // ZeroOptions::paramDtype: the master's, not the rounding
      s.freed = unit.resharded();
    }
  }
}

const ShardedParam* shardedParamOf(const Registry& registry, const at::Tensor& t) {
  if (registry.shardedParams.empty() || !t.defined()) return nullptr;
  auto it = registry.shardedParams.find(t.unsafeGetTensorImpl());
  return it == registry.shardedParams.end() ? nullptr : &it->second;
}

namespace {

ModuleShards moduleEntriesOf(const Registry& registry, bool freedOnly) {
  ModuleShards out;
  for (const auto& [name, module] : registry.state.modules) {
    for (const auto& p : module->named_parameters(/*recurse=*/true)) {
      const ShardedParam* s = shardedParamOf(registry, p.value());
      if (!s || (freedOnly && !s->freed)) continue;
      out[{s->optimizer, s->record}] = {"module/" + name + "/" + p.key(), s->dtype};
    }
  }
  return out;
}

}  // namespace

ModuleShards moduleShards(const Registry& registry) { return moduleEntriesOf(registry, true); }

ModuleShards moduleEntries(const Registry& registry) { return moduleEntriesOf(registry, false); }

void checkHoldsMemory(const std::string& module, const std::string& key, const at::Tensor& t) {
  DTRAIN_CHECK_ARG(t.numel() == 0 || t.storage().data() != nullptr,
                   "Checkpointer: parameter \"{}\" of module \"{}\" holds no memory: a ZeRO "
                   "stage-3 unit frees it between uses, and no ShardedOptimizer over it is "
                   "registered, whose shard records hold its values. HINT: addOptimizer() the "
                   "stage-3 ShardedOptimizer with this Checkpointer",
                   key, module);
}

}  // namespace dtrain::checkpoint
