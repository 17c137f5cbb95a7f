// The API: dtrain::ShardedOptimizer (dtrain/torch/zero.h) over the units and their state machine.
#include <chrono>
#include <unordered_set>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include "../optimizer_state.h"
#include "../torch_compat.h"
#include "dtrain/base/error.h"
#include "dtrain/torch/zero.h"
#include "gradient_sync.h"
#include "init.h"
#include "shard_group.h"

namespace dtrain {

namespace {

std::unique_ptr<torch::optim::OptimizerOptions> defaultsOf(const OptimizerFactory& factory) {
  DTRAIN_CHECK_ARG(
      factory.defaults != nullptr,
      "ShardedOptimizer: the optimizer factory has no defaults. HINT: build it with "
      "dtrain::optimizerFactory<torch::optim::AdamW>(torch::optim::AdamWOptions(...))");
  return factory.defaults->clone();
}

using Clock = std::chrono::steady_clock;

}  // namespace

ShardedOptimizer::ShardedOptimizer(DdpCore& ddp,
                                   std::vector<torch::optim::OptimizerParamGroup> groups,
                                   OptimizerFactory factory, ZeroOptions options)
    : torch::optim::Optimizer(std::vector<torch::optim::OptimizerParamGroup>{},
                              defaultsOf(factory)),
      options_(options),
      factory_(factory) {
  zero::BuiltShards built = zero::buildShards(ddp, std::move(groups), factory, options_);
  shards_ = std::move(built.shards);
  sync_ = std::move(built.sync);
  for (const auto& group : built.groups) add_param_group(group);
  // The build's buffers (DDP's buckets replaced, those the units were bound through) go after
  // the first step unless it reuses them: Note [Communication buffers of a step].
  shards_->trimPools();
}

ShardedOptimizer::~ShardedOptimizer() = default;

const ShardLayout& ShardedOptimizer::layout() const { return shards_->layout(); }

torch::Tensor ShardedOptimizer::step(LossClosure closure) {
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable(true);
    loss = closure();
  }
  at::NoGradGuard noGrad;
  zero::ShardGroup& shards = *shards_;
  shards.settleGathers();  // the last step's, deferred and not waited for since (no forward)
  shards.resetDeferredWait();
  shards.checkSteppable();
  // Each unit's optimizer steps with its group's options as they are now (a scheduler or the
  // program may have changed them since the last step).
  for (size_t k = 0; k < shards.size(); ++k) {
    shards.unit(k).optimizer().param_groups()[0].set_options(
        param_groups_[shards.groupOf(k)].options().clone());
  }
  lastStep_ = {};
  const zero::ShardGroup::GatherCounts gathers = shards.takeGatherCounts();
  lastStep_.unitGathers = gathers.gathers;
  lastStep_.prefetchedGathers = gathers.prefetched;
  lastStep_.unitGatherWait = gathers.waited;
  // Last unit first: the all-gather left to wait for after the last step is then the first
  // unit's, small by design (Note [Shard layout]), and the parameters come back in forward order.
  stepping_ = true;  // until it returns: a failure from here on may leave units stepped
  for (size_t k = shards.size(); k-- > 0;) {
    const auto start = Clock::now();
    shards.stepUnit(k);
    lastStep_.optimizerStep += Clock::now() - start;
    if (shards.unit(k).resharded()) continue;  // stage 3: gathered at its next use
    shards.launchGather(k);                    // runs while the next unit steps
    if (!options_.overlapAllgather) lastStep_.allgatherWait += shards.finishGather(k);
  }
  // Note [Deferred all-gathers]: or the next forward waits.
  if (!options_.deferAllgatherWait) shards.settleGathers();
  shards.trimPools();  // Note [Communication buffers of a step]
  stepping_ = false;
  return loss;
}

void ShardedOptimizer::reformUnits() {
  DTRAIN_CHECK_ARG(reformable(), "ShardedOptimizer::reformUnits: only an optimizer built through a "
                                 "DistributedDataParallel wrapper re-forms in memory");
  // The groups as the user gave them -- the module's parameters, each group's options as they
  // are now (a scheduler's learning rate) -- read from the old units before they go.
  std::vector<std::vector<at::Tensor>> members(param_groups_.size());
  std::unordered_set<const void*> loadedLater;  // every parameter the restore writes
  {
    zero::ShardGroup& old = *shards_;
    for (size_t k = 0; k < old.size(); ++k) {
      for (const auto& p : old.unit(k).params()) {
        members[old.groupOf(k)].push_back(p.param);
        loadedLater.insert(p.param.unsafeGetTensorImpl());
      }
    }
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    groups.emplace_back(std::move(members[g]), param_groups_[g].options().clone());
  }
  for (size_t k = 0; k < shards_->unitCount(); ++k) shards_->unit(k).releaseForRebuild();
  DdpCore& core = wrapperCore_(loadedLater);  // the wrapper's buckets for the new world
  shards_.reset();
  sync_.reset();
  zero::BuiltShards built = zero::buildShards(core, std::move(groups), factory_, options_,
                                              /*reforming=*/true);
  shards_ = std::move(built.shards);
  sync_ = std::move(built.sync);
  param_groups_.clear();
  for (const auto& group : built.groups) add_param_group(group);
  shards_->trimPools();
  lastStep_ = {};
  stepping_ = false;
}

void ShardedOptimizer::waitForParameters() { shards_->settleGathers(); }

void ShardedOptimizer::zero_grad() { sync_->zeroGradients(); }

void ShardedOptimizer::save(torch::serialize::OutputArchive&) const {
  DTRAIN_THROW(InvalidArgument,
               "ShardedOptimizer: its state is spread over the ranks, and a libtorch archive "
               "holds one process's optimizer. HINT: shardRecords() gives this rank's part");
}

void ShardedOptimizer::load(torch::serialize::InputArchive&) {
  DTRAIN_THROW(InvalidArgument,
               "ShardedOptimizer: its state is spread over the ranks, and a libtorch archive "
               "holds one process's optimizer. HINT: loadShardState() loads a sharded state");
}

ZeroStats ShardedOptimizer::stats() const {
  zero::ShardGroup& shards = *shards_;
  ZeroStats s;
  s.stage = options_.stage;
  s.ranks = shards.group().size();
  s.parameters = shards.layout().numel();
  s.padding = shards.layout().padding();
  s.owned = shards.layout().shardNumel();
  s.units = shards.size();
  s.frozen = shards.frozenLayout().numel();
  std::unordered_set<const void*> seen;  // each storage once
  for (size_t k = 0; k < shards.unitCount(); ++k) {
    zero::ShardUnit& u = shards.unit(k);
    s.memory.parameters += u.parameterBytes();
    if (u.frozen()) {  // Note [Frozen units]: its parameters' memory is all it has
      s.memory.frozen += u.parameterBytes();
      continue;
    }
    s.memory.gradients += u.gradientBytes();
    s.memory.masterWeights += u.masterBytes();
    s.memory.offloaded += u.offloadedBytes();
    auto& optimizer = u.optimizer();
    auto it = optimizer.state().find(compat::optimizerStateKey(u.optimized()));
    if (it == optimizer.state().end()) continue;
    for (const auto& [field, tensor] : optim_state::fieldsOf(*it->second).tensors) {
      if (!tensor->defined() || !seen.insert(tensor->storage().data()).second) continue;
      s.memory.optimizerState += tensor->storage().nbytes();
      if (u.offloaded()) s.memory.offloaded += tensor->storage().nbytes();
    }
  }
  s.memory.buckets = shards.bucketBytes();
  s.memory.looseGradients = sync_->looseGradientBytes();
  s.reduceScatterWait = sync_->lastIteration().waited;
  s.optimizerStep = lastStep_.optimizerStep;
  s.allgatherWait = lastStep_.allgatherWait + shards.deferredWait();
  s.memory.gathered = shards.gatheredNow();
  s.memory.peakGathered = shards.gatheredPeak();
  s.memory.gatherPool = shards.gatheredBytes();
  s.unitGathers = lastStep_.unitGathers;
  s.prefetchedGathers = lastStep_.prefetchedGathers;
  s.unitGatherWait = lastStep_.unitGatherWait;
  return s;
}

}  // namespace dtrain
