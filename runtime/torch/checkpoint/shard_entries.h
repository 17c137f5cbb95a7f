#pragma once
// The Checkpointer's side of a ShardedOptimizer (dtrain/torch/zero.h): its shard records as
// owned shard entries of a node's file, the ring of nodes that keep each other's shards, and the
// re-assembly of a saved sharded state onto any world size (Note [Sharded checkpoint files]).
// Private to the torch layer.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "checkpoint/format.h"
#include "state.h"

namespace dtrain::checkpoint {

// Which ranks' writers keep rank r's shards (index r): its own node's writer and the writer of the
// node before it in ring order (nodes by id), so each node also keeps the next node's shards.
// `writerOf`: node id -> its writer's rank. A pure function of the placement.
std::vector<std::vector<int>> shardKeepers(const std::vector<int>& nodeOf,
                                           const std::map<int, int>& writerOf);

// This rank's records of every sharded optimizer, copied into one host blob, a byte tensor (the
// format of the blobs is private to shard_entries.cpp).
at::Tensor encodeShards(const std::vector<ShardedEntry>& sharded);
// The entry that names the ranks that saved a step's shards (Note [Sharded checkpoint files]).
inline constexpr const char* kShardSaversEntry = "shards/records";

// The entries of rank `owner`'s blob (a CPU uint8 tensor) in a job of `world` ranks: owned shard
// records whose data stays in the blob, the owned module entries of the freed parameters among
// them (`freed`: Note [Stage-3 checkpoints]), from their `master` records, and `owner`'s element
// of kShardSaversEntry -- also when the blob is empty (a rank whose blocks are all padding).
std::vector<Item> shardItems(uint32_t owner, uint32_t world, const at::Tensor& blob,
                             const ModuleShards& freed);
// What every rank shares of a sharded optimizer: optimizer/O/type ("sharded") and optimizer/O/lr.
std::vector<Item> shardedReplicatedItems(const std::vector<ShardedEntry>& sharded);

// The ranks whose shards a file holds (the owners of its owned entries, kShardSaversEntry's
// among them: a rank that saved no record is listed too, except in files written before it was).
std::vector<uint32_t> shardOwners(const CheckpointReader& reader);
// Rank `owner`'s records in `reader`, read (checksums checked) into a blob as encodeShards()
// makes them. `modules`: the module entry of every sharded parameter (moduleEntries()), whose
// owned range is the `master` field of a record saved without one (Note [One copy of a freed
// master]). Throws CheckpointError for damage.
at::Tensor readShardBlob(const CheckpointReader& reader, uint32_t owner,
                         const std::vector<ShardedEntry>& sharded, const ModuleShards& modules);

// Checks the replicated entries of the sharded optimizers (type, group count) and sets each
// group's learning rate. Throws CheckpointError naming what does not fit.
void checkShardedRestorable(const CheckpointReader& reader,
                            const std::vector<ShardedEntry>& sharded);
void restoreShardedReplicated(const CheckpointReader& reader,
                              const std::vector<ShardedEntry>& sharded);

// What this rank needs of a saved sharded state -- the ranges of its records in the layout of
// today's world size -- filled from the blobs of the ranks that saved it, whatever their number.
class ShardAssembly {
 public:
  explicit ShardAssembly(const std::vector<ShardedEntry>& sharded);
  // Copies the parts of `blob`'s records that overlap this rank's ranges.
  void add(const uint8_t* blob, size_t size);
  // The same from rank `owner`'s records in `reader`, without a blob: only the records that
  // overlap this rank's ranges are read (checksums checked), the overlap straight into place
  // (CheckpointReader::readPart). Throws CheckpointError on damage, leaving what counts as
  // covered unchanged.
  void read(const CheckpointReader& reader, uint32_t owner, const ModuleShards& modules);
  // "" when every field that was saved covers this rank's ranges exactly, else what is missing.
  std::string missing() const;
  // ShardedOptimizer::loadShardState() of each optimizer from what was added. Collective.
  void load();

 private:
  struct Need {
    int64_t begin = 0;
    int64_t end = 0;
    std::map<std::string, at::Tensor> fields;  // field -> [end - begin], the saved dtype
    std::map<std::string, int64_t> covered;    // field -> elements copied
    std::optional<int64_t> step;
  };
  struct Overlap {
    Need* need = nullptr;  // none: the record is not this rank's
    int64_t lo = 0, hi = 0;
  };
  // The need of (optimizer, param) that [begin, end) overlaps, and the elements in common.
  Overlap overlap(const std::string& optimizer, const std::string& param, int64_t begin,
                  int64_t end);
  // Where element `element` of field `name` goes (its tensor made at the first use).
  static uint8_t* place(Need& need, const std::string& param, const std::string& name, DType dtype,
                        int64_t element);
  std::vector<ShardedEntry> sharded_;
  std::map<std::pair<std::string, std::string>, Need> needs_;  // (optimizer, parameter)
};

}  // namespace dtrain::checkpoint
