// What a sharded checkpoint needs of a ShardedOptimizer (dtrain/torch/zero.h): this rank's shard
// records, by parameter name and element range (independent of units and world size), and the
// loading of a state saved at any world size. See Note [Shard records].
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include "../optimizer_state.h"
#include "../torch_compat.h"
#include "dtrain/base/error.h"
#include "dtrain/torch/zero.h"
#include "shard_group.h"

// Note [Shard records]
// A record is (parameter name, [begin, end) of its flattened elements) -> the master weights and
// the optimizer's state tensors of those elements, plus the step count. Units, padding and the
// world size do not appear: the records of all ranks tile every parameter exactly once, so a
// state saved at N ranks loads at M by asking, for each of the M-rank layout's records, for its
// range of each field, which the saver's records (one or several of them) cover. The padding at
// the end of a unit belongs to no record; it stays zero. Stage 3's frozen units (Note [Frozen
// units]) have records too: `master` is their owned block, with no state and no step.

namespace dtrain {

namespace {

torch::optim::OptimizerParamState* stateOf(zero::ShardUnit& u) {
  auto& optimizer = u.optimizer();
  auto it = optimizer.state().find(compat::optimizerStateKey(u.optimized()));
  return it == optimizer.state().end() ? nullptr : it->second.get();
}

size_t slotOf(zero::ShardUnit& u, size_t param) {
  const auto& params = u.layout().params;
  return static_cast<size_t>(std::find(params.begin(), params.end(), param) - params.begin());
}

// What this rank owns of every parameter, trained units first, then the frozen ones, each range
// with its unit.
std::vector<std::pair<OwnedRange, zero::ShardUnit*>> ownedRanges(zero::ShardGroup& shards) {
  std::vector<std::pair<OwnedRange, zero::ShardUnit*>> out;
  const int rank = shards.group().rank();
  for (const OwnedRange& r : shards.layout().ownedBy(rank)) {
    out.emplace_back(r, &shards.unit(r.unit));
  }
  for (const OwnedRange& r : shards.frozenLayout().ownedBy(rank)) {
    out.emplace_back(r, &shards.unit(shards.size() + r.unit));
  }
  return out;
}

// The field tensors of `state` (null: none) that a load may fill in place, each taken out of it
// where it is defined, shaped, typed and placed as `like`, and held by nothing else: no other
// handle, no view (a save in flight holds views). Undefined where not.
std::vector<at::Tensor> reusableFields(torch::optim::OptimizerParamState* state,
                                       const optim_state::StateFields& probe,
                                       const at::Tensor& like) {
  std::vector<at::Tensor> own(probe.tensors.size());
  if (state == nullptr) return own;
  optim_state::StateFields old = optim_state::fieldsOf(*state);
  for (size_t f = 0; f < own.size() && f < old.tensors.size(); ++f) {
    at::Tensor& t = *old.tensors[f].second;
    if (std::strcmp(old.tensors[f].first, probe.tensors[f].first) == 0 && t.defined() &&
        t.sizes() == like.sizes() && t.dtype() == like.dtype() && t.device() == like.device() &&
        t.use_count() == 1 && t.storage().use_count() == 1) {
      own[f] = std::move(t);
    }
  }
  return own;
}

// Zeroes the elements of the flat `tensor` that no (offset, length) of `written` covers.
void zeroOutside(at::Tensor& tensor, std::vector<std::pair<int64_t, int64_t>> written) {
  std::sort(written.begin(), written.end());
  int64_t pos = 0;
  for (const auto& [offset, len] : written) {
    if (offset > pos) tensor.narrow(0, pos, offset - pos).zero_();
    pos = std::max(pos, offset + len);
  }
  if (pos < tensor.numel()) tensor.narrow(0, pos, tensor.numel() - pos).zero_();
}

}  // namespace

std::vector<ShardRecord> ShardedOptimizer::shardRecords() {
  zero::ShardGroup& shards = *shards_;
  shards.settleGathers();  // Note [Deferred all-gathers]: the records view the blocks gathered
  std::vector<ShardRecord> out;
  for (const auto& [r, u] : ownedRanges(shards)) {
    const zero::UnitParam& p = u->params()[slotOf(*u, r.param)];
    ShardRecord rec;
    rec.param = p.name;
    rec.shape = p.param.sizes().vec();
    rec.begin = r.begin;
    rec.end = r.end;
    if (u->frozen()) {
      rec.master = u->ownedParams().narrow(0, r.shardOffset, r.end - r.begin);
      out.push_back(std::move(rec));
      continue;
    }
    rec.master = u->optimized().narrow(0, r.shardOffset, r.end - r.begin);
    if (auto* state = stateOf(*u)) {
      optim_state::StateFields fields = optim_state::fieldsOf(*state);
      for (const auto& [name, tensor] : fields.tensors) {
        if (tensor->defined()) {
          rec.state.emplace_back(name, tensor->narrow(0, r.shardOffset, r.end - r.begin));
        }
      }
      if (fields.step) rec.step = *fields.step;
    }
    out.push_back(std::move(rec));
  }
  return out;
}

void ShardedOptimizer::loadShardState(const ShardReader& read) {
  zero::ShardGroup& shards = *shards_;
  shards.settleGathers();  // a running all-gather would overwrite what is loaded
  shards.checkSteppable();
  at::NoGradGuard noGrad;
  const auto ranges = shards.layout().ownedBy(shards.group().rank());
  for (size_t k = 0; k < shards.size(); ++k) {
    zero::ShardUnit& u = shards.unit(k);
    auto& optimizer = u.optimizer();
    const char* type = optim_state::optimizerType(optimizer);
    DTRAIN_CHECK_ARG(type != nullptr,
                     "ShardedOptimizer::loadShardState: the real optimizer's type is not one "
                     "whose state can be loaded (SGD, Adam, AdamW, Adagrad, RMSprop)");
    const auto key = compat::optimizerStateKey(u.optimized());
    auto fresh = optim_state::newParamState(type);
    optim_state::StateFields probe = optim_state::fieldsOf(*fresh);
    auto& states = optimizer.state();
    // Each field is read straight into its place -- the master shard, and a state field's tensor
    // at its first saved range: the state's own where nothing else holds it (its pages touched
    // already, as DCP loads into the state_dict's tensors), else a new one, uninitialised --
    // with no staging copy and no pass of zeros first; what no saved range wrote (padding, a
    // range saved without that field) is zeroed afterwards, as a tensor made of zeros has it.
    std::vector<at::Tensor> own = reusableFields(stateOf(u), probe, u.optimized());
    states.erase(key);  // the unit ends exactly as saved: what was not saved is absent
    bool saved = false;
    std::optional<int64_t> step;
    std::vector<std::vector<std::pair<int64_t, int64_t>>> written(probe.tensors.size());
    for (const OwnedRange& r : ranges) {
      if (r.unit != k) continue;
      const std::string& name = u.params()[slotOf(u, r.param)].name;
      const int64_t len = r.end - r.begin;
      at::Tensor master = u.optimized().narrow(0, r.shardOffset, len);
      DTRAIN_CHECK(read({name, "master", r.begin, r.end}, master),
                   "ShardedOptimizer::loadShardState: the saved state has no values of {} "
                   "[{}, {})",
                   name, r.begin, r.end);
      for (size_t f = 0; f < probe.tensors.size(); ++f) {
        at::Tensor& tensor = *probe.tensors[f].second;
        const bool made = !tensor.defined();
        if (made) tensor = own[f].defined() ? own[f] : at::empty_like(u.optimized());
        at::Tensor place = tensor.narrow(0, r.shardOffset, len);
        if (!read({name, probe.tensors[f].first, r.begin, r.end}, place)) {
          if (made) tensor = at::Tensor();
          continue;
        }
        written[f].emplace_back(r.shardOffset, len);
        saved = true;
      }
      at::Tensor count = at::zeros({1}, at::kLong);
      if (probe.step && read({name, "step", r.begin, r.end}, count)) {
        const int64_t value = count.item<int64_t>();
        DTRAIN_CHECK(!step || *step == value,
                     "ShardedOptimizer::loadShardState: {} of {} has step {}, another parameter "
                     "of its unit step {}; one optimizer steps the unit",
                     name, u.describe(), value, *step);
        step = value;
        saved = true;
      }
    }
    for (size_t f = 0; f < probe.tensors.size(); ++f) {
      if (probe.tensors[f].second->defined()) zeroOutside(*probe.tensors[f].second, written[f]);
    }
    if (saved) {
      if (probe.step) *probe.step = step.value_or(0);
      states.emplace(key, std::move(fresh));
    }
    shards.shardWritten(k);
    if (!shards.unit(k).resharded()) shards.launchGather(k);  // stage 3: at its next use
  }
  for (size_t k = 0; k < shards.size(); ++k) {
    if (!shards.unit(k).resharded()) shards.finishGather(k);
  }
  // Frozen units: their owned blocks, gathered at their next use.
  for (const auto& [r, u] : ownedRanges(shards)) {
    if (!u->frozen()) continue;
    const std::string& name = u->params()[slotOf(*u, r.param)].name;
    const int64_t len = r.end - r.begin;
    at::Tensor place = u->ownedParams().narrow(0, r.shardOffset, len);
    DTRAIN_CHECK(read({name, "master", r.begin, r.end}, place),
                 "ShardedOptimizer::loadShardState: the saved state has no values of frozen {} "
                 "[{}, {}). HINT: a state saved where frozen parameters were whole (stages 1 and "
                 "2, or before stage 3 sharded them) has none; load such values into the model "
                 "before the stage-3 optimizer is built",
                 name, r.begin, r.end);
  }
}

}  // namespace dtrain
