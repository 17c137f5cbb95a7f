#pragma once
// ShardExchange: a Checkpointer's sharded optimizer state on its way between the ranks and the
// writers that keep it (Note [Sharded checkpoint files], shard_entries.cpp): at a save each
// rank's records go to their keepers over a subgroup per rank; at a restore the ranks list which
// writers hold whose shards and gather what their own node's file lacks. Private to the torch
// layer.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "placement.h"
#include "state.h"

namespace dtrain::checkpoint {

// Waits for the all-gathers the sharded optimizers' last step left running (Note [Deferred
// all-gathers]): the parameters are then the last step's on every rank.
void settleShardedParameters(const state::Registry& registered);

class ShardExchange {
 public:
  // `dir`: this node's directory.
  ShardExchange(Placement& placement, state::Registry& registered, std::string dir);

  // Collective: every rank's records go to the writers that keep them (shardKeepers()), over a
  // subgroup per rank built at the first save. Returns what this rank keeps (writers only).
  std::vector<std::pair<int, at::Tensor>> exchangeShards();

  // Restore: which writers hold whose shards, per step, from every node's manifests; drops the
  // steps whose shards are not all somewhere from `mine` (writers).
  struct ShardHolders {
    std::map<int64_t, std::map<uint32_t, std::vector<int>>> holders;  // step -> owner -> writers
    std::map<int64_t, uint32_t> savedWorld;                           // step -> its world size
    // Step -> why it is incomplete: the ranks whose shards no node holds, the nodes searched.
    // The same on every rank.
    std::map<int64_t, std::string> incomplete;
  };
  ShardHolders listShardHolders(std::vector<int64_t>& mine);
  // After the replicated state of `step` was read: gathers and loads the sharded state. False
  // (`why` says what) when some rank's shards are intact nowhere: the step is dropped everywhere.
  bool loadShards(int64_t step, const ShardHolders& holders, std::string& why);
  // Forgets what was built for the old world (the keepers and their subgroups) after the group
  // re-formed: the next save builds them again.
  void reset();

 private:
  void buildKeeperGroups();

  Placement& placement_;
  state::Registry& registered_;
  const std::string dir_;
  std::vector<std::vector<int>> keepers_;                    // per rank: the writers keeping it
  std::vector<std::shared_ptr<ProcessGroup>> keeperGroups_;  // per rank: null when not a member
  bool keeperGroupsBuilt_ = false;
  bool subgroups_ = true;  // false: the backend has none; broadcast over the whole group
};

}  // namespace dtrain::checkpoint
