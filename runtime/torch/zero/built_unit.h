#pragma once
// BuiltUnit: what fullyShard() (dtrain/torch/fully_shard.h) keeps of a unit on this rank until a
// stage-3 ShardedOptimizer binds it.
//
// Note [Units sharded when built]
// libtorch's C++ modules allocate their parameters in their constructors (there is no building on
// the meta device as in Python), so a model larger than one rank cannot be built whole and
// sharded after.
// fullyShard() shards each unit the moment it is built instead: every rank builds the unit in
// full from the same seed (the values a one-process model of that seed has), keeps its own block
// of it and frees the rest before the next unit is built. So a rank holds at most one unit in
// full (plus what the module's constructor makes on the side), and the blocks of those before.
//   Layout: each dtype's trained parameters of the unit form one part, and each dtype's frozen
//   ones another (the optimizer's frozen units, Note [Frozen units] in shard_group.h), laid out
//   as layoutUnits() lays out one marked module's parameters alone (parameter order, padded to a
//   multiple of the ranks); this rank keeps block `rank` of it, on the placement's device. So a
//   frozen base under trained adapters is never held whole either. A frozen parameter the
//   optimizer assigns to the root (tied to a use outside every marked module) is gathered once
//   there and stays whole, as the root's frozen parameters do. The parameters become
//   views of a storage without memory (as a unit freed between uses), so names, shapes and
//   dtypes are there for DistributedDataParallel and the optimizer to check and lay out.
//   Checksum: XXH3 of each parameter's full values as built, combined per unit. Binding
//   all-gathers them across ranks first: a rank that built other values (another seed, another
//   order) fails every rank, naming the unit, instead of training a model no rank built.
//   Binding: where the optimizer lays a unit out as the part is laid out (the same parameters in
//   the same order: one optimizer group, no tie leaving the unit -- the usual case), the unit
//   takes the part's block as its owned block: nothing is gathered or copied. Otherwise (groups
//   split a unit by key; a parameter tied across units belongs to their ancestor) the optimizer
//   makes each part's parameters full again just before its first unit that holds any of them
//   is bound -- one all-gather of the part, in the layout's order on every rank -- binds as it
//   binds a model built whole, and drops the part when every parameter of it is bound: one unit
//   in full, twice at most, while binding.
// DistributedDataParallel skips these parameters in its broadcast of rank 0's values and in its
// own reducer (the optimizer replaces that before any backward); an unbound unit refuses to run.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "dtrain/comm/communicator.h"
#include "dtrain/torch/detail/shard_layout.h"
#include "dtrain/torch/fully_shard.h"

namespace dtrain::zero {

struct BuiltPart {
  std::vector<std::string> names;  // within the unit, for messages
  std::vector<at::Tensor> params;  // views of a storage without memory until gathered
  UnitLayout layout;               // of these parameters alone, at BuiltUnit::where.ranks
  at::Tensor owned;                // block where.rank of their flat buffer (layout.shardNumel)
};

struct BuiltUnit {
  explicit BuiltUnit(const ShardPlacement& placement) : where(placement) {}
  ShardPlacement where;  // what fullyShard was given: the layout's ranks, the blocks' device
  // One per dtype, trained and frozen apart, in the order of their first parameters.
  std::vector<BuiltPart> parts;
  uint64_t checksum = 0;  // of every part's values as built

  // Makes part `part`'s parameters full again: every rank's block all-gathered into one buffer
  // the parameters become views of (returned: it lives while they do). Collective.
  at::Tensor gather(size_t part, comm::Communicator& comm, const comm::CallOptions& call);
};

// Shards `unit`'s parameters, trained and frozen, except those of units inside it built sharded
// already (they keep their own record), and frees their memory. Null when it has none.
std::shared_ptr<BuiltUnit> shardWhenBuilt(torch::nn::Module& unit, const ShardPlacement& where);

// The parameters of every unit of `root` sharded when built, by their tensors.
std::vector<const void*> builtParameters(torch::nn::Module& root);

}  // namespace dtrain::zero
