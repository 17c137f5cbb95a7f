#include "dtrain/torch/training_state.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "dtrain/torch/process_group.h"
#include "dtrain/torch/zero.h"
#include "fault.h"
#include "registry.h"
#include "rollback.h"

namespace dtrain {

namespace state {

SamplerState SamplerEntry::state() const {
  return consumed ? sampler->state(consumed()) : sampler->state();
}

}  // namespace state

namespace {

// Throws InvalidArgument when `entries` holds one named `name` already: names are unique per kind.
template <typename Entries, typename NameOf>
void checkUnique(const Entries& entries, NameOf nameOf, const char* kind, const std::string& name) {
  for (const auto& e : entries) {
    DTRAIN_CHECK_ARG(nameOf(e) != name, "TrainingState: {} named \"{}\" is registered already",
                     kind, name);
  }
}

}  // namespace

TrainingState::TrainingState(std::shared_ptr<ProcessGroup> group)
    : group_(std::move(group)), registry_(std::make_unique<state::Registry>()) {
  DTRAIN_CHECK_ARG(group_ != nullptr, "TrainingState: null process group");
}

TrainingState::~TrainingState() = default;

void TrainingState::addModule(const std::string& name, std::shared_ptr<torch::nn::Module> module) {
  DTRAIN_CHECK_ARG(module != nullptr, "TrainingState::addModule(\"{}\"): null module", name);
  checkUnique(
      registry_->modules, [](const auto& e) { return e.first; }, "a module", name);
  registry_->modules.emplace_back(name, std::move(module));
}

void TrainingState::addOptimizer(const std::string& name, torch::optim::Optimizer& optimizer) {
  checkUnique(
      registry_->optimizers, [](const auto& e) { return e.first; }, "an optimizer", name);
  checkUnique(
      registry_->sharded, [](const auto& e) { return e.name; }, "an optimizer", name);
  // Sharded state is kept as shard records, never gathered (Note [Sharded checkpoint files]).
  if (auto* zero = dynamic_cast<ShardedOptimizer*>(&optimizer)) {
    registry_->sharded.push_back({name, zero});
    return;
  }
  registry_->optimizers.emplace_back(name, &optimizer);
}

void TrainingState::addScheduler(const std::string& name, torch::optim::LRScheduler& scheduler) {
  checkUnique(
      registry_->schedulers, [](const auto& e) { return e.first; }, "a scheduler", name);
  registry_->schedulers.emplace_back(name, &scheduler);
}

void TrainingState::addScaler(const std::string& name, GradScaler& scaler) {
  checkUnique(
      registry_->scalers, [](const auto& e) { return e.first; }, "a scaler", name);
  registry_->scalers.emplace_back(name, &scaler);
}

void TrainingState::addSampler(const std::string& name, DistributedSampler& sampler,
                               std::function<size_t()> consumed) {
  checkUnique(
      registry_->samplers, [](const auto& e) { return e.name; }, "a sampler", name);
  registry_->samplers.push_back({name, &sampler, std::move(consumed)});
}

void TrainingState::setMetadata(const std::string& key, MetadataValue value) {
  DTRAIN_CHECK_ARG(!key.empty(), "TrainingState::setMetadata: empty key");
  if (auto* t = std::get_if<at::Tensor>(&value)) {
    DTRAIN_CHECK_ARG(t->defined(), "TrainingState::setMetadata(\"{}\"): undefined tensor", key);
    value = t->detach().cpu().contiguous();
  }
  registry_->metadata[key] = std::move(value);
}

const std::map<std::string, MetadataValue>& TrainingState::metadata() const {
  return registry_->metadata;
}

void TrainingState::beginStep(int64_t step) {
  step_ = step;
  registry_->stepStart.clear();
  for (const auto& e : registry_->samplers) registry_->stepStart.push_back(e.state());
  fault::injectAt(group_->rank(), step);
}

void TrainingState::setMirrorInterval(int64_t steps) {
  DTRAIN_CHECK_ARG(steps >= 1, "TrainingState::setMirrorInterval({}): at least 1 step", steps);
  mirrorInterval_ = steps;
}

void TrainingState::refreshMirrors() {
  if (registry_->sharded.empty() || step_ < 0 || !group_->reformsOnNodeLoss()) return;
  if (!rollback_) {
    rollback_ = std::make_unique<state::Rollback>();
    for (const auto& e : registry_->sharded) {
      const std::string why = e.optimizer->whyNotMirrored();
      if (why.empty()) continue;
      // The same on every rank: none of them mirrors, and a lost node takes the restart path.
      rollback_->unmirrored = fmt::format("optimizer \"{}\" is not mirrored: {}", e.name, why);
      DTRAIN_LOG(Warn, "{}; a lost node takes the restart path", rollback_->unmirrored);
      break;
    }
  }
  state::Rollback& rb = *rollback_;
  if (!rb.unmirrored.empty()) return;
  if (!rb.refreshNow && rb.lastRefresh >= 0 && step_ - rb.lastRefresh < mirrorInterval_ &&
      step_ >= rb.lastRefresh) {
    return;
  }
  state::copyReplicated(*registry_, step_, rb.pending);
  for (const auto& e : registry_->sharded) e.optimizer->refreshMirror(step_);
  std::swap(rb.current, rb.pending);
  rb.lastRefresh = step_;
  rb.refreshNow = false;
}

int64_t TrainingState::restoreShards(const std::exception* failure) {
  // A failed step rethrows its failure (the caller is handling it); a join at a step boundary
  // has none.
  const std::string what = failure != nullptr ? failure->what()
                                              : "a node taken in at this step boundary";
  const auto fail = [&](const std::string& message) {
    DTRAIN_LOG(Error, "{}", message);
    if (failure != nullptr) throw;
    DTRAIN_THROW(Error, "{}", message);
  };
  if (rollback_ && !rollback_->unmirrored.empty()) {
    fail(fmt::format("step {}: the group changed under ZeRO and {}: the job restarts from its "
                     "last checkpoint ({})",
                     step_, rollback_->unmirrored, what));
  }
  if (!rollback_ || (rollback_->current.generation < 0 && rollback_->pending.generation < 0)) {
    fail(fmt::format("step {}: the group changed under ZeRO before its sharded state was first "
                     "mirrored (TrainingState::beginStep() gives the steps): the job restarts "
                     "from its last checkpoint ({})",
                     step_, what));
  }
  if (failure != nullptr) {
    DTRAIN_LOG(Warn, "step {}: discarded on rank {}: {}", step_, group_->rank(), what);
  }
  state::Rollback& rb = *rollback_;
  const std::vector<ShardedOptimizer*> optimizers = registry_->shardedOptimizers();
  const int before = group_->size();
  if (!group_->reform()) {
    fail(fmt::format("step {}: rank {}: no membership epoch came to re-form in ({})", step_,
                     group_->rank(), what));
  }
  // A node joined (an epoch that takes nodes in loses none): every old rank's blocks are alive.
  // When the failure came before any optimizer stepped (in forward, backward, a mirror refresh),
  // they and the replicated state are still those of the step's start -- one more generation to
  // offer, the newest, and only the step in flight runs again. The units are still the old
  // world's until the restore builds them again.
  rb.live = {};
  if (group_->size() > before && std::none_of(optimizers.begin(), optimizers.end(),
                                              [](ShardedOptimizer* o) { return o->stepping(); })) {
    for (auto* o : optimizers) o->keepLiveBlocks(step_);
    state::copyReplicated(*registry_, step_, rb.live);
  }
  std::string why;
  const auto started = std::chrono::steady_clock::now();
  uint64_t sent = 0;
  int joined = 0;
  const int64_t generation = restoreFromMirrors(
      optimizers, *group_, {rb.current.generation, rb.pending.generation, rb.live.generation}, why,
      &sent, &joined);
  if (generation < 0) {
    DTRAIN_THROW(Error,
                 "step {}: ZeRO's sharded state cannot be restored in memory: {}; the job "
                 "restarts from its last checkpoint (the failure: {})",
                 step_, why, what);
  }
  state::restoreReplicated(*registry_, *group_,
                           rb.current.generation == generation   ? rb.current
                           : rb.pending.generation == generation ? rb.pending
                                                                 : rb.live);
  rb.live = {};
  // Ranks taken into the running round have the sharded state now, and the rest from rank 0.
  if (joined > 0) state::handOverReplicated(*registry_, *group_, 0);
  lastRestore_ = {
      generation, sent,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()};
  DTRAIN_LOG(
      Warn,
      "step {}: the sharded state of step {} restored from the mirrors on {} ranks{} in {:.3f} "
      "s, {} payload bytes through rank {} (sent; Note [Shard mirrors]); {} step(s) run again",
      step_, generation, group_->size(),
      joined > 0 ? fmt::format(" ({} of them joined)", joined) : std::string(),
      lastRestore_.seconds, sent, group_->rank(), step_ - generation + (failure ? 1 : 0));
  rb.refreshNow = true;
  return generation;
}

bool TrainingState::tryCollective(const std::function<void()>& work) {
  if (group_->joinPending()) return false;
  try {
    work();
    return true;
  } catch (const std::exception& e) {
    if (!membershipChanged(e)) throw;
    DTRAIN_LOG(Warn,
               "rank {}: a collective between steps was cut short ({}); the next step "
               "re-forms the group",
               group_->rank(), e.what());
    return false;
  }
}

bool TrainingState::membershipChanged(const std::exception& e) const {
  if (!group_->reformsOnNodeLoss()) return false;
  // The group's communicator or a subgroup made from it failed: the watcher aborts them all at a
  // new epoch, and a subgroup's connection to a lost node may break before it does.
  if (group_->communicator().errorWithGroups() != nullptr) return true;
  // A failure of the program's own, with every collective healthy, is no node loss.
  if (dynamic_cast<const MembershipChanged*>(&e) == nullptr) return false;
  // Aborted while the group and its subgroups are healthy: the collective ran on a subgroup made
  // before a re-form (aborted with that world), which waiting for another epoch cannot mend.
  DTRAIN_THROW(InvalidArgument,
               "step {}: rank {}/{}: a collective ran on a communicator aborted at an earlier "
               "membership change ({}); the group has re-formed since (membership epoch {}). "
               "HINT: subgroups (split/newGroup) are not re-formed: make them again from the "
               "group when its epoch() changes (docs/training.md, \"Surviving a lost node\")",
               step_, group_->rank(), group_->size(), e.what(), group_->epoch());
}

int64_t TrainingState::joinShards() {
  // The wrapper's core and the units are made again with the members (reformUnits): no longer
  // deferred.
  group_->settleJoin();
  const std::vector<ShardedOptimizer*> optimizers = registry_->shardedOptimizers();
  std::string why;
  int joined = 0;
  uint64_t sent = 0;
  const auto started = std::chrono::steady_clock::now();
  const int64_t generation = restoreFromMirrors(optimizers, *group_, {}, why, &sent, &joined);
  DTRAIN_CHECK(generation >= 0,
               "rank {} was taken into a running round, but the members' sharded state cannot "
               "be restored in memory: {}; the job restarts from its last checkpoint",
               group_->rank(), why);
  state::handOverReplicated(*registry_, *group_, 0);
  lastRestore_ = {
      generation, sent,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()};
  // Its first refreshMirrors() mirrors the restored generation, as the members' does.
  return generation;
}

bool TrainingState::tryStep(const std::function<void()>& work) {
  if (group_->joinPending()) {
    // Note [Joining a running round] (launcher/cluster/master/node_loss.h): the members re-form
    // with this rank and settle; so does it, at their step, before its first. Under ZeRO they
    // restore their sharded state from the mirrors into the new world, this rank's blocks
    // included (Note [Shard mirrors]).
    for (const auto& e : registry_->sharded) {
      // The members' mirrors are off too (the same reason on every rank): their restore would
      // fail and the job restart; this rank says why at once, before the members are told.
      const std::string why = e.optimizer->whyNotMirrored();
      DTRAIN_CHECK_ARG(why.empty(),
                       "rank {} was taken into a running round (launch --on-node-join live), but "
                       "optimizer \"{}\" is not mirrored ({}), so the members cannot hand it its "
                       "shards. HINT: use --on-node-join restart (the default) for this program",
                       group_->rank(), e.name, why);
    }
    // Note [Admission when ready] (runtime/comm/world_reform.cpp): the members learn now that
    // this rank is ready, leave their step, and form the epoch with it.
    group_->admit();
    if (registry_->sharded.empty()) {
      step_ = settle();
      group_->settleJoin();
    } else {
      step_ = joinShards();
    }
    DTRAIN_LOG(Warn, "joined at step {} as rank {}/{} (membership epoch {})", step_, group_->rank(),
               group_->size(), group_->epoch());
    return false;
  }
  if (group_->stepBoundary()) {
    // Note [Joins at step boundaries] (runtime/comm/world_reform.cpp): nothing of the step ran.
    DTRAIN_LOG(Warn,
               "step {}: rank {} re-forms before the step with the nodes taken into the running "
               "round (nothing discarded)",
               step_, group_->rank());
    if (!registry_->sharded.empty()) {
      step_ = restoreShards(nullptr);
      return false;
    }
    DTRAIN_CHECK(group_->reform(), "step {}: rank {}: a join was ready but no epoch came", step_,
                 group_->rank());
    step_ = settle();
    return false;
  }
  try {
    refreshMirrors();
    work();
    return true;
  } catch (const std::exception& e) {
    if (!membershipChanged(e)) throw;
    if (!registry_->sharded.empty()) {
      step_ = restoreShards(&e);
      return false;
    }
    DTRAIN_LOG(Warn, "step {}: discarded on rank {}: {}", step_, group_->rank(), e.what());
    // No new epoch in time: not a loss the launcher decided to survive.
    if (!group_->reform()) throw;
  }
  step_ = settle();
  return false;
}

int64_t TrainingState::settle() {
  bool partial = false;
  for (;;) {
    try {
      return state::settleAfterReform(*registry_, *group_, step_, &partial);
    } catch (const std::exception& e) {
      if (!membershipChanged(e)) throw;
      DTRAIN_LOG(Warn, "step {}: the settling after the re-form was cut short on rank {}: {}",
                 step_, group_->rank(), e.what());
      if (!group_->reform()) throw;
    }
  }
}

}  // namespace dtrain
