#pragma once
// Not API (detail/): an internal that dtrain/torch/fully_shard.h needs.
// It may change in any release; programs include <dtrain/dtrain.h>.
// The layout of ZeRO stage 3's units (dtrain/torch/fully_shard.h): as Note [Shard layout], but
// the units are the modules the user marked, not runs of parameters bounded by size. A pure
// function, beside planShards() (shard_layout.cpp), tested on tables.

#include <cstddef>
#include <vector>

#include "dtrain/torch/detail/shard_layout.h"

namespace dtrain {

// `groups[g]` lists the parameters of marked module g (indices into `params`, in any order);
// each group becomes one unit per key (a unit is one flat buffer of one dtype), in the order the
// groups are given and, within a group, of the keys' first parameters. Parameters keep parameter
// order inside their unit, padded as planShards' units are. Every parameter must be in exactly
// one group.
ShardLayout layoutUnits(const std::vector<ShardInput>& params,
                        const std::vector<std::vector<size_t>>& groups, int ranks);

}  // namespace dtrain
