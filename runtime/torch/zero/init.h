#pragma once
// Building a ShardedOptimizer's shards (init.cpp): the parameter groups checked against the DDP
// module, the layout planned and agreed across ranks, the units allocated and bound, the real
// optimizers built over them, and the sharded backward installed in DDP.

#include <memory>
#include <vector>

#include <torch/optim/optimizer.h>

#include "dtrain/torch/detail/ddp_core.h"
#include "dtrain/torch/zero.h"

namespace dtrain::zero {

class ShardGroup;
class ShardedGradientSync;

struct BuiltShards {
  std::shared_ptr<ShardGroup> shards;
  std::shared_ptr<ShardedGradientSync> sync;
  // The optimizer's own groups: each user group's shards (what the real optimizers step), with
  // that group's options.
  std::vector<torch::optim::OptimizerParamGroup> groups;
};

// Collective. Throws InvalidArgument naming the parameter or option at fault, Error when the
// ranks disagree.
// `reforming`: built again after a re-form (ShardedOptimizer::reformUnits): stage 3's resharded
// units take empty blocks, their values loaded next, and gather nothing. On a rank that joins a
// running round (ProcessGroup::joinPending) it is not collective: the units are built alone, as
// when reforming, and built again with the members at its first step.
BuiltShards buildShards(DdpCore& ddp, std::vector<torch::optim::OptimizerParamGroup> groups,
                        const OptimizerFactory& factory, const ZeroOptions& options,
                        bool reforming = false);

}  // namespace dtrain::zero
