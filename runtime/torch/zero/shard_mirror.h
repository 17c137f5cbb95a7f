#pragma once
// ShardMirror: one ShardedOptimizer's copies of sharded state that outlive a lost node -- this
// rank's own blocks as of the last refresh, and the blocks of another node's rank -- and what
// restores them at a smaller world (Note [Shard mirrors] in shard_mirror.cpp). Private to the
// torch layer.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dtrain/torch/detail/shard_layout.h"
#include "dtrain/torch/process_group.h"

namespace dtrain::zero {

class ShardGroup;
class ShardUnit;

// One rank's blocks of every unit, packed: `header` is [generation, units, then per unit its
// optimizer's step count (-1: none yet) and the mask of its state fields present (bit i: the
// i-th of optim_state::fieldsOf)], `payload` per unit its master block, then each present field,
// each of the unit's block length at the world it was made in.
struct PackedBlocks {
  std::vector<int64_t> header;
  at::Tensor payload;
  int64_t generation() const { return header.empty() ? -1 : header[0]; }
};

class ShardMirror {
 public:
  // What one rank offers after a loss, flattened for an allgather (offer() / parse).
  struct Offer {
    int oldRank = -1;
    int oldWorld = 0;
    std::vector<int64_t> own;                   // generations of its own blocks it can give
    std::vector<std::pair<int, int64_t>> held;  // (old rank, generation) of complete mirrors
  };
  static constexpr int kMaxHeld = 8;
  static constexpr int64_t kOfferLength = 4 + 2 + 2 * 2 * kMaxHeld;

  // Refresh: this rank's blocks to its holder, the blocks of the ranks it holds from them, then
  // one allreduce that commits the generation. Collective over `shards`' group.
  void refresh(ShardGroup& shards, int64_t generation);
  size_t bytes() const;

  at::Tensor offer() const;  // int64 [kOfferLength]
  static Offer parse(const at::Tensor& offer);

  // Before the units are built again: the live blocks become the own copy when they are the
  // generation about to be restored (a refresh of it began and did not commit here).
  void prepareRestore(ShardGroup& shards, int64_t generation);
  // After a failure that left the live blocks as they were at the start of step `generation`
  // (the optimizer had not stepped): they are offered as that generation too. Only every rank's
  // own blocks are kept so, so it is restored only when no rank's were lost: a join.
  void keepLive(ShardGroup& shards, int64_t generation);
  // The blocks of old rank `owner` at `generation` this rank holds (its own or a mirror), or
  // nullptr.
  const PackedBlocks* blocksOf(int owner, int64_t generation) const;
  // The units (trained, then frozen) of the world the copies were made in.
  const std::vector<UnitLayout>& oldUnits() const { return oldUnits_; }
  int oldRank() const { return oldRank_; }
  // After a restore: the copies are of a world that is gone. `spare`, when defined, is memory the
  // next refresh packs this rank's own copy into if it has the size (Note [Memory of a restore]).
  void reset(at::Tensor spare = {});

 private:
  void buildPairs(ProcessGroup& group);

  int epoch_ = -1;                                    // the group's epoch the pairs were made for
  std::vector<int> holderOf_;                         // old rank -> the rank keeping its mirror
  std::vector<std::shared_ptr<ProcessGroup>> pairs_;  // per rank: {rank, holder}, null: not in
  bool subgroups_ = true;
  int oldRank_ = -1;
  std::vector<UnitLayout> oldUnits_;
  PackedBlocks own_;         // this rank's blocks at own_.generation()
  PackedBlocks live_;        // keepLive()'s: the live blocks at the start of a failed step
  int64_t refreshing_ = -1;  // a refresh of this generation began and did not commit
  struct Held {
    int owner = -1;
    PackedBlocks current;  // complete
    PackedBlocks pending;  // being received; complete when pendingDone
    bool pendingDone = false;
  };
  std::vector<Held> held_;
};

// Packs `shards`' blocks of this rank into `into` (its payload reused when it has the size).
void packBlocks(ShardGroup& shards, int64_t generation, PackedBlocks& into);
// Waits for `works` over pair subgroups `pairs`; when `group`'s communicator fails first (the
// membership watcher aborts it, not the subgroups), aborts the pairs, keeps them alive until the
// process ends (destroying one that waits in a receive from a lost rank would wait for the
// collective timeout) and rethrows.
void waitWatching(ProcessGroup& group, std::vector<std::shared_ptr<comm::Work>>& works,
                  const std::vector<std::shared_ptr<ProcessGroup>>& pairs, const char* during);
// Its units' layouts: the trained units', then the frozen ones' (Note [Frozen units]).
std::vector<UnitLayout> unitsOf(ShardGroup& shards);
// The block of unit `u` a mirror keeps as its "master": what its optimizer steps (master
// weights, or the parameters' values stepped in place); a frozen unit's owned parameters.
at::Tensor masterBlock(ShardUnit& u);

}  // namespace dtrain::zero
