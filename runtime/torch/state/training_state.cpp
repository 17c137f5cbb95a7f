#include "dtrain/torch/training_state.h"

#include <utility>

#include <ATen/ATen.h>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "dtrain/torch/process_group.h"
#include "dtrain/torch/zero.h"
#include "fault.h"
#include "registry.h"

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

bool TrainingState::tryStep(const std::function<void()>& work) {
  try {
    work();
    return true;
  } catch (const std::exception& e) {
    if (!group_->reformsOnNodeLoss()) throw;
    // A failure of the program's own, with every collective healthy, is no node loss.
    if (dynamic_cast<const MembershipChanged*>(&e) == nullptr &&
        group_->communicator().error() == nullptr) {
      throw;
    }
    if (!registry_->sharded.empty()) {
      DTRAIN_LOG(Error,
                 "step {}: a collective failed under ZeRO, whose sharded state does not re-form "
                 "in memory yet: the job restarts from its last checkpoint ({})",
                 step_, e.what());
      throw;
    }
    DTRAIN_LOG(Warn, "step {}: discarded on rank {}: {}", step_, group_->rank(), e.what());
    // No new epoch in time: not a loss the launcher decided to survive.
    if (!group_->reform()) throw;
  }
  step_ = state::settleAfterReform(*registry_, *group_, step_);
  return false;
}

}  // namespace dtrain
