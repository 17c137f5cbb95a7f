#include "init.h"

#include <algorithm>

#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "../ddp/model_sync.h"
#include "../torch_compat.h"
#include "built_unit.h"
#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "dtrain/torch/fully_shard.h"
#include "gradient_sync.h"
#include "shard_group.h"
#include "unit_binding.h"

namespace dtrain::zero {

namespace {

using Named = std::pair<std::string, at::Tensor>;

void checkOptions(DdpCore& ddp, const OptimizerFactory& factory, const ZeroOptions& options) {
  DTRAIN_CHECK_ARG(options.stage >= 1 && options.stage <= 3,
                   "ShardedOptimizer: ZeroOptions::stage is {}; stages 1, 2 and 3 exist",
                   options.stage);
  DTRAIN_CHECK_ARG(factory.defaults != nullptr && factory.make != nullptr,
                   "ShardedOptimizer: the optimizer factory has no {}. HINT: build it with "
                   "dtrain::optimizerFactory<torch::optim::AdamW>(torch::optim::AdamWOptions(...))",
                   factory.defaults ? "make function" : "defaults");
  DTRAIN_CHECK_ARG(
      options.unitBytes > 0 && options.firstUnitBytes > 0,
      "ShardedOptimizer: unit sizes must be positive (firstUnitBytes {}, unitBytes {})",
      options.firstUnitBytes, options.unitBytes);
  DTRAIN_CHECK_ARG(!options.reduceDtype || (options.stage >= 2 && options.masterWeights &&
                                            (*options.reduceDtype == at::kFloat ||
                                             *options.reduceDtype == at::kBFloat16 ||
                                             *options.reduceDtype == at::kHalf)),
                   "ShardedOptimizer: reduceDtype {} needs stage 2 or 3 (this is stage {}), "
                   "master weights (masterWeights is {}) and a floating dtype of 16 or 32 bits. "
                   "HINT: stage 1 reduces the gradients where autograd left them, in the "
                   "parameters' dtype",
                   options.reduceDtype ? c10::toString(*options.reduceDtype) : "none",
                   options.stage, options.masterWeights);
  DTRAIN_CHECK_ARG(!options.paramDtype ||
                       (options.stage == 3 && options.masterWeights &&
                        (*options.paramDtype == at::kBFloat16 || *options.paramDtype == at::kHalf)),
                   "ShardedOptimizer: paramDtype {} needs stage 3 (this is stage {}), master "
                   "weights (masterWeights is {}) and bfloat16 or float16. HINT: at stages 1 and "
                   "2 every rank keeps the whole model; convert it "
                   "(module->to(torch::kBFloat16)) and keep masterWeights for the same effect",
                   options.paramDtype ? c10::toString(*options.paramDtype) : "none", options.stage,
                   options.masterWeights);
  DTRAIN_CHECK_ARG(!options.offload || options.stage >= 2,
                   "ShardedOptimizer: offload needs stage 2 or 3 (this is stage 1, whose "
                   "gradients are reduced in place on the device). HINT: ZeroOptions::stage = 2");
  DTRAIN_CHECK_ARG(ddp.options().compression == GradientCompression::None,
                   "ShardedOptimizer: DDP's gradient compression ({}) does not apply to "
                   "reduce-scatters. HINT: construct DistributedDataParallel without compression",
                   gradientCompressionName(ddp.options().compression));
  DTRAIN_CHECK_ARG(!ddp.gradientSyncReplaced(),
                   "ShardedOptimizer: this DistributedDataParallel's gradients are handled by "
                   "another ShardedOptimizer already. HINT: one ShardedOptimizer per model, with "
                   "every parameter group in it");
}

// Which group each trained parameter belongs to, and each group's options.
std::vector<size_t> resolveGroups(
    const std::vector<Named>& trained, const std::vector<torch::optim::OptimizerParamGroup>& groups,
    const OptimizerFactory& factory,
    std::vector<std::unique_ptr<torch::optim::OptimizerOptions>>& options) {
  const size_t none = groups.size() + 1;
  std::vector<size_t> groupOf(trained.size(), groups.empty() ? 0 : none);
  if (groups.empty()) {
    options.push_back(factory.defaults->clone());
    return groupOf;
  }
  std::unordered_map<const void*, size_t> index;
  for (size_t i = 0; i < trained.size(); ++i) index[trained[i].second.unsafeGetTensorImpl()] = i;
  for (size_t g = 0; g < groups.size(); ++g) {
    options.push_back(groups[g].has_options() ? groups[g].options().clone()
                                              : factory.defaults->clone());
    for (size_t k = 0; k < groups[g].params().size(); ++k) {
      auto it = index.find(groups[g].params()[k].unsafeGetTensorImpl());
      DTRAIN_CHECK_ARG(it != index.end(),
                       "ShardedOptimizer: parameter {} of group {} is not a trained parameter of "
                       "the DistributedDataParallel's module (another module's, frozen, or a "
                       "copy). HINT: build the groups from ddp->named_parameters()",
                       k, g);
      DTRAIN_CHECK_ARG(groupOf[it->second] == none,
                       "ShardedOptimizer: parameter {} is in group {} and in group {}",
                       trained[it->second].first, groupOf[it->second], g);
      groupOf[it->second] = g;
    }
  }
  std::vector<std::string> left;
  for (size_t i = 0; i < trained.size(); ++i) {
    if (groupOf[i] == none) left.push_back(trained[i].first);
  }
  DTRAIN_CHECK_ARG(left.empty(),
                   "ShardedOptimizer: {} trained parameters are in no group: {}. HINT: every "
                   "parameter that requires grad is sharded; add them to a group (lr 0 keeps "
                   "them fixed) or freeze them (requires_grad(false)) before wrapping the module",
                   left.size(), fmt::join(left, ", "));
  return groupOf;
}

const char* dtypeName(int64_t dtype) {
  return dtype < 0 ? "none" : c10::toString(static_cast<at::ScalarType>(dtype));
}

// The same groups, dtypes, shapes and options on every rank, or an error on every rank naming
// the first difference.
void agreeAcrossRanks(ProcessGroup& group, const std::vector<Named>& trained,
                      const std::vector<Named>& frozen, const std::vector<size_t>& groupOf,
                      const ZeroOptions& options) {
  std::vector<ddp::NamedTensor> described;
  for (size_t i = 0; i < trained.size(); ++i) {
    described.push_back(
        {fmt::format("{} (optimizer group {})", trained[i].first, groupOf[i]), trained[i].second});
  }
  for (const auto& [name, t] : frozen) described.push_back({fmt::format("{} (frozen)", name), t});
  ddp::verifySameModel(group, described, {});
  const std::vector<int64_t> mine = {
      options.stage, static_cast<int64_t>(options.firstUnitBytes),
      static_cast<int64_t>(options.unitBytes), options.masterWeights ? 1 : 0,
      options.paramDtype ? static_cast<int64_t>(*options.paramDtype) : -1};
  auto all = group.allgatherHost(at::tensor(mine, at::kLong));
  for (size_t r = 0; r < all.size(); ++r) {
    const at::Tensor& theirs = all[r];
    const bool same = std::equal(mine.begin(), mine.end(), theirs.data_ptr<int64_t>());
    DTRAIN_CHECK(same,
                 "rank {}: ShardedOptimizer: ranks disagree on the ZeroOptions: this rank has "
                 "stage {}, units {}/{} bytes, master weights {}, paramDtype {}; rank {} has "
                 "stage {}, units {}/{} bytes, master weights {}, paramDtype {}. HINT: build the "
                 "optimizer alike on every rank",
                 group.rank(), mine[0], mine[1], mine[2], mine[3], dtypeName(mine[4]), r,
                 theirs.data_ptr<int64_t>()[0], theirs.data_ptr<int64_t>()[1],
                 theirs.data_ptr<int64_t>()[2], theirs.data_ptr<int64_t>()[3],
                 dtypeName(theirs.data_ptr<int64_t>()[4]));
  }
}

// Stage 3: the modules marked as units (ShardedUnit), pre-order, with their names.
struct Marked {
  std::string name;
  std::shared_ptr<ShardedUnitImpl> module;
  std::vector<size_t> params;  // indices into the trained parameters it owns
  std::vector<size_t> frozen;  // indices into the frozen ones (Note [Frozen units])
};

bool isAncestor(const std::string& outer, const std::string& inner) {
  return outer.empty() || inner.rfind(outer + ".", 0) == 0;
}

bool holds(const std::string& outer, const std::string& inner) {
  return outer == inner || isAncestor(outer, inner);
}

// Every trained parameter belongs to the innermost marked module that holds every module using
// it (registering it), else to the root. Untied, that is the innermost marked module that has
// it. Tied between modules neither of which holds the other (a shared embedding and output
// projection), the innermost marked module around them all, or the root: the parameter is then
// gathered whenever any of its users runs. Note [ZeRO-3 unit lifecycle].
std::vector<Marked> findMarked(torch::nn::Module& root) {
  std::vector<Marked> marked;
  for (const auto& m : root.named_modules("", /*include_self=*/true)) {
    if (auto unit = std::dynamic_pointer_cast<ShardedUnitImpl>(m.value())) {
      marked.push_back({m.key(), std::move(unit), {}, {}});
    }
  }
  DTRAIN_CHECK_ARG(!marked.empty(),
                   "ShardedOptimizer: stage 3 shards the modules marked as units, and the model "
                   "has none. HINT: wrap its layers in dtrain::ShardedUnit (or a Sequential's "
                   "children with dtrain::shardEveryChild()) before DistributedDataParallel");
  return marked;
}

// The marked module each of `params` belongs to (marked.size(): the root), by the rule above.
std::vector<size_t> ownersOf(torch::nn::Module& root, const std::vector<Marked>& marked,
                             const std::vector<Named>& params) {
  std::unordered_map<const void*, size_t> index;
  for (size_t i = 0; i < params.size(); ++i) index[params[i].second.unsafeGetTensorImpl()] = i;
  std::vector<std::vector<std::string>> users(params.size());
  for (const auto& m : root.named_modules("", /*include_self=*/true)) {
    for (const auto& p : m.value()->parameters(/*recurse=*/false)) {
      auto it = index.find(p.unsafeGetTensorImpl());
      if (it != index.end()) users[it->second].push_back(m.key());
    }
  }
  std::vector<size_t> owners(params.size(), marked.size());
  for (size_t i = 0; i < params.size(); ++i) {
    size_t& owner = owners[i];
    for (size_t g = 0; g < marked.size(); ++g) {
      const std::string& name = marked[g].name;
      const bool all = std::all_of(users[i].begin(), users[i].end(),
                                   [&](const std::string& user) { return holds(name, user); });
      // Holders of every user form a chain of ancestors: the deepest has the longest name.
      if (all && (owner == marked.size() || name.size() > marked[owner].name.size())) owner = g;
    }
  }
  return owners;
}

// Stage 3, Note [Frozen units]: the parameters that need no gradient, each once, in the
// module's order.
std::vector<Named> frozenParameters(torch::nn::Module& root) {
  std::vector<Named> out;
  std::unordered_set<const void*> seen;
  for (const auto& p : root.named_parameters(/*recurse=*/true)) {
    if (p.value().requires_grad() || !seen.insert(p.value().unsafeGetTensorImpl()).second) continue;
    out.emplace_back(p.key(), p.value());
  }
  return out;
}

// Stage 3: the frozen units, one per marked module with frozen parameters and dtype, last marked
// first as the trained ones; `ownerOf[u]`: frozen unit u's marked module.
ShardLayout layoutFrozen(const std::vector<Marked>& marked, const std::vector<Named>& frozen,
                         int ranks, std::vector<size_t>& ownerOf) {
  std::vector<ShardInput> inputs;
  for (const auto& [name, t] : frozen) {
    inputs.push_back(
        {t.numel(), static_cast<size_t>(t.element_size()), static_cast<int>(t.scalar_type())});
  }
  std::vector<std::vector<size_t>> groups;
  std::vector<size_t> groupOwner;
  for (size_t g = marked.size(); g-- > 0;) {
    if (marked[g].frozen.empty()) continue;
    groups.push_back(marked[g].frozen);
    groupOwner.push_back(g);
  }
  ownerOf.clear();
  if (groups.empty()) return {};
  // layoutUnits() wants every parameter in a group: those of the root go into one left out.
  std::vector<size_t> root;
  std::vector<char> owned(frozen.size(), 0);
  for (const auto& grp : groups) {
    for (size_t i : grp) owned[i] = 1;
  }
  for (size_t i = 0; i < frozen.size(); ++i) {
    if (!owned[i]) root.push_back(i);
  }
  if (!root.empty()) groups.push_back(root);
  ShardLayout layout = layoutUnits(inputs, groups, ranks);
  std::unordered_map<size_t, size_t> ownerOfParam;
  for (size_t g = 0; g < groups.size(); ++g) {
    const size_t owner = g < groupOwner.size() ? groupOwner[g] : marked.size();
    for (size_t i : groups[g]) ownerOfParam[i] = owner;
  }
  ShardLayout out;
  out.ranks = layout.ranks;
  for (const auto& u : layout.units) {
    const size_t owner = ownerOfParam.at(u.params.front());
    if (owner == marked.size()) continue;  // the root's stay whole
    out.units.push_back(u);
    ownerOf.push_back(owner);
  }
  return out;
}

// Stage 3: the layout's units are the marked modules', last marked first (the order backward
// completes them), then the root's. `ownerOf[k]`: unit k's marked module, or marked.size() for
// the root's.
ShardLayout layoutMarked(const std::vector<Marked>& marked, const std::vector<ShardInput>& inputs,
                         int ranks, std::vector<size_t>& ownerOf) {
  std::vector<std::vector<size_t>> groups;
  std::vector<size_t> groupOwner;
  std::vector<char> owned(inputs.size(), 0);
  for (size_t g = marked.size(); g-- > 0;) {
    if (marked[g].params.empty()) continue;
    groups.push_back(marked[g].params);
    groupOwner.push_back(g);
    for (size_t i : marked[g].params) owned[i] = 1;
  }
  std::vector<size_t> root;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!owned[i]) root.push_back(i);
  }
  if (!root.empty()) {
    groups.push_back(root);
    groupOwner.push_back(marked.size());
  }
  ShardLayout layout = layoutUnits(inputs, groups, ranks);
  std::unordered_map<size_t, size_t> ownerOfParam;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i : groups[g]) ownerOfParam[i] = groupOwner[g];
  }
  ownerOf.clear();
  for (const auto& u : layout.units) ownerOf.push_back(ownerOfParam.at(u.params.front()));
  return layout;
}

// Each marked module with parameters of its own runs through its units from now on.
// `ownerOf[k]`: unit k's marked module, the trained units' then the frozen ones'.
void bindMarked(const std::vector<Marked>& marked, const std::vector<size_t>& ownerOf,
                const std::shared_ptr<ShardGroup>& shards) {
  for (size_t g = 0; g < marked.size(); ++g) {
    std::vector<size_t> mine, frozen, inside;
    for (size_t k = 0; k < ownerOf.size(); ++k) {
      if (ownerOf[k] == g) (k < shards->size() ? mine : frozen).push_back(k);
      // Note [Frozen units]: the trained units of the module and of those marked inside it.
      if (k < shards->size() && ownerOf[k] < marked.size() &&
          holds(marked[g].name, marked[ownerOf[k]].name)) {
        inside.push_back(k);
      }
    }
    if (mine.empty() && frozen.empty()) continue;  // nothing of its own: it runs as it is
    std::optional<size_t> release;
    if (!frozen.empty()) release = shards->addFrozenRelease(frozen, std::move(inside));
    mine.insert(mine.end(), frozen.begin(), frozen.end());
    marked[g].module->bind(
        std::make_shared<UnitBinding>(shards, std::move(mine), marked[g].name,
                                      marked[g].module->options().reshardAfterForward, release));
  }
}

// Units sharded when built (Note [Units sharded when built]): every rank built them for this
// group, and built the same values. One allgather of (checksum, placement) per marked module, so
// every rank judges the same table and fails alike.
void agreeOnBuiltUnits(ProcessGroup& pg, const std::vector<Marked>& marked) {
  std::vector<int64_t> mine;
  for (const Marked& m : marked) {
    const auto& built = m.module->built();
    int64_t placement = 0;  // 0: not sharded when built; -1: for another place; else the ranks
    uint64_t sum = 0;
    if (built) {
      const ShardPlacement& place = built->where;
      const bool here = place.rank == pg.rank() && place.ranks == pg.size() &&
                        place.device == pg.device();
      placement = here ? place.ranks : -1;
      sum = built->checksum;
    }
    mine.push_back(placement);
    mine.push_back(static_cast<int64_t>(sum));
  }
  std::vector<std::vector<int64_t>> rows;
  for (const auto& t : pg.allgatherHost(at::tensor(mine, at::kLong))) {
    rows.emplace_back(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
  }
  for (size_t g = 0; g < marked.size(); ++g) {
    std::vector<int> notHere, notBuilt;
    std::map<int64_t, std::vector<int>> bySum;
    for (size_t r = 0; r < rows.size(); ++r) {
      const int64_t placement = rows[r][2 * g];
      if (placement == -1) notHere.push_back(static_cast<int>(r));
      if (placement == 0) notBuilt.push_back(static_cast<int>(r));
      bySum[rows[r][2 * g + 1]].push_back(static_cast<int>(r));
    }
    if (notBuilt.size() == rows.size()) continue;
    DTRAIN_CHECK(notHere.empty(),
                 "rank {}: ShardedOptimizer: unit {} was sharded when built for another place "
                 "than this group (rank {} of {}, {}) on ranks {}. HINT: pass the group that "
                 "trains the model to fullyShard",
                 pg.rank(), marked[g].name, pg.rank(), pg.size(), pg.device().str(),
                 fmt::join(notHere, ", "));
    DTRAIN_CHECK(notBuilt.empty(),
                 "rank {}: ShardedOptimizer: unit {} was sharded when built (fullyShard) on some "
                 "ranks but built whole on ranks {}. HINT: build the model alike on every rank",
                 pg.rank(), marked[g].name, fmt::join(notBuilt, ", "));
    if (bySum.size() == 1) continue;
    std::vector<std::string> groups;
    for (const auto& [sum, ranks] : bySum) {
      groups.push_back(
          fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", ")));
    }
    DTRAIN_THROW(Error,
                 "rank {}: ShardedOptimizer: unit {} was built with different values on {} "
                 "(fullyShard keeps a checksum of what each rank built): no rank holds the "
                 "others' values to make them agree. HINT: seed every rank alike "
                 "(torch::manual_seed) and build the model in the same order before fullyShard",
                 pg.rank(), marked[g].name, fmt::join(groups, " than on "));
  }
}

// Makes the parameters of units sharded when built full again, part by part, just before the
// first unit that holds one of them is bound, and lets a part go once all its parameters are
// bound (Note [Units sharded when built]). The same sequence of gathers on every rank: the
// layout's.
class BuiltGathers {
 public:
  BuiltGathers(const std::vector<Marked>& marked, comm::CallOptions call) : call_(std::move(call)) {
    for (const Marked& m : marked) {
      const auto& built = m.module->built();
      if (!built) continue;
      for (size_t k = 0; k < built->parts.size(); ++k) {
        const size_t id = parts_.size();
        parts_.push_back({built, k, at::Tensor(), built->parts[k].params.size()});
        for (const auto& p : built->parts[k].params) partOf_[p.unsafeGetTensorImpl()] = id;
      }
      modules_.push_back(m.module);
    }
  }

  // This rank's block as built, when `params` in `layout` -- the unit about to be bound -- are
  // one part exactly as fullyShard laid it out: then it is the owned block as it is, and nothing
  // is gathered (the part is done). Undefined otherwise. The same answer on every rank.
  at::Tensor adopt(const std::vector<at::Tensor>& params, const UnitLayout& layout) {
    auto it = partOf_.find(params.front().unsafeGetTensorImpl());
    if (it == partOf_.end()) return {};
    Part& part = parts_[it->second];
    const BuiltPart& built = part.built->parts[part.index];
    if (part.full.defined() || built.params.size() != params.size() ||
        built.layout.shardNumel != layout.shardNumel || built.layout.offsets != layout.offsets) {
      return {};
    }
    for (size_t j = 0; j < params.size(); ++j) {
      if (!built.params[j].is_same(params[j])) return {};
    }
    at::Tensor owned = std::move(part.built->parts[part.index].owned);
    part.left = 0;
    return owned;
  }

  // Before unit `params` is bound (unless adopted). `deferred`: this rank joins a running round
  // and makes no collective before it settles (Note [Joining a running round]), so a part that
  // needs its peers' blocks is refused.
  void gather(const std::vector<at::Tensor>& params, comm::Communicator& comm,
              bool deferred = false) {
    for (const auto& p : params) {
      auto it = partOf_.find(p.unsafeGetTensorImpl());
      if (it == partOf_.end()) continue;
      Part& part = parts_[it->second];
      DTRAIN_CHECK_ARG(part.full.defined() || !deferred,
                       "ShardedOptimizer: this rank joins a running round (launch --on-node-join "
                       "live), and a unit sharded when built (fullyShard) is laid out otherwise "
                       "than the optimizer's units: gathering it needs the members, who are not "
                       "there before the first step. HINT: build that module whole on a newcomer, "
                       "or use --on-node-join restart");
      if (!part.full.defined()) part.full = part.built->gather(part.index, comm, call_);
    }
  }

  // After: parts all of whose parameters are bound go.
  void bound(const std::vector<at::Tensor>& params) {
    for (const auto& p : params) {
      auto it = partOf_.find(p.unsafeGetTensorImpl());
      if (it == partOf_.end()) continue;
      Part& part = parts_[it->second];
      if (--part.left == 0) {
        part.full = at::Tensor();
        part.built->parts[part.index].owned = at::Tensor();
      }
    }
  }

  // Once every unit is bound: the records go, the units run through their bindings.
  void done() {
    for (const auto& m : modules_) m->setBuilt(nullptr);
  }

 private:
  struct Part {
    std::shared_ptr<BuiltUnit> built;
    size_t index;
    at::Tensor full;  // while some of its parameters are not bound yet
    size_t left;      // parameters not bound yet
  };
  comm::CallOptions call_;
  std::vector<Part> parts_;
  std::unordered_map<const void*, size_t> partOf_;
  std::vector<std::shared_ptr<ShardedUnitImpl>> modules_;
};

// The owned block of a unit built again after a re-form, before its values are loaded.
at::Tensor emptyBlock(const at::Tensor& param, const UnitLayout& unit, ProcessGroup& pg) {
  return at::zeros({unit.shardNumel}, param.options().device(pg.device()));
}

at::ScalarType masterTypeOf(at::ScalarType dtype, const ZeroOptions& options) {
  const bool low = dtype == at::kHalf || dtype == at::kBFloat16;
  return options.masterWeights && low ? at::kFloat : dtype;
}

}  // namespace

BuiltShards buildShards(DdpCore& ddp, std::vector<torch::optim::OptimizerParamGroup> groups,
                        const OptimizerFactory& factory, const ZeroOptions& options,
                        bool reforming) {
  checkOptions(ddp, factory, options);
  ProcessGroup& pg = ddp.group();
  const auto& trained = ddp.trainedParameters();
  DTRAIN_CHECK_ARG(!trained.empty(), "ShardedOptimizer: the module has no trained parameters");
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> groupOptions;
  const std::vector<size_t> groupOf = resolveGroups(trained, groups, factory, groupOptions);
  // Stage 3 shards the frozen parameters of marked modules too (Note [Frozen units]).
  const std::vector<Named> frozen = options.stage == 3 ? frozenParameters(*ddp.module())
                                                       : std::vector<Named>();
  // A rank taken into a running round builds its units alone, as after a re-form, and settles
  // with the members at its first step: the check across ranks and the values come then
  // (TrainingState::tryStep, ShardedOptimizer::reformUnits; Note [Shard mirrors]).
  const bool deferred = pg.joinPending();
  const bool emptyBlocks = reforming || deferred;
  if (!deferred) agreeAcrossRanks(pg, trained, frozen, groupOf, options);

  // One key per (group, dtype): Note [Shard layout].
  std::vector<ShardInput> inputs;
  for (size_t i = 0; i < trained.size(); ++i) {
    const at::Tensor& t = trained[i].second;
    inputs.push_back({t.numel(), static_cast<size_t>(t.element_size()),
                      static_cast<int>(groupOf[i] * 64 + static_cast<size_t>(t.scalar_type()))});
  }
  std::vector<Marked> marked;  // stage 3
  std::vector<size_t> ownerOf;
  ShardLayout layout;
  ShardLayout frozenLayout;
  std::vector<Named> frozenOfRoot;  // stay whole
  if (options.stage == 3) {
    marked = findMarked(*ddp.module());
    const std::vector<size_t> owners = ownersOf(*ddp.module(), marked, trained);
    for (size_t i = 0; i < trained.size(); ++i) {
      if (owners[i] < marked.size()) marked[owners[i]].params.push_back(i);
    }
    const std::vector<size_t> frozenOwners = ownersOf(*ddp.module(), marked, frozen);
    for (size_t i = 0; i < frozen.size(); ++i) {
      if (frozenOwners[i] < marked.size()) {
        marked[frozenOwners[i]].frozen.push_back(i);
      } else {
        frozenOfRoot.push_back(frozen[i]);
      }
    }
    if (!deferred) agreeOnBuiltUnits(pg, marked);
    layout = layoutMarked(marked, inputs, pg.size(), ownerOf);
    std::vector<size_t> frozenOwnerOf;
    frozenLayout = layoutFrozen(marked, frozen, pg.size(), frozenOwnerOf);
    ownerOf.insert(ownerOf.end(), frozenOwnerOf.begin(), frozenOwnerOf.end());
  } else {
    DTRAIN_CHECK_ARG(zero::builtParameters(*ddp.module()).empty(),
                     "ShardedOptimizer: the model has units sharded when built (fullyShard), "
                     "which only stage 3 keeps sharded (this is stage {}). HINT: ZeroOptions::"
                     "stage = 3, or build the model whole for stages 1 and 2",
                     options.stage);
    layout = planShards(inputs, pg.size(), options.firstUnitBytes, options.unitBytes);
  }
  comm::CallOptions builtCall;  // as ShardGroup's calls
  builtCall.stream = compat::currentStream(pg.device());
  builtCall.timeout = options.timeout;
  BuiltGathers builtGathers(marked, builtCall);

  BuiltShards built;
  // Inside replaceGradientSync: DDP's buckets, if its reducer was made (a forward before the
  // optimizer), are freed before the units take their memory.
  ddp.replaceGradientSync([&]() -> std::shared_ptr<ddp::GradientSync> {
    std::vector<std::unique_ptr<ShardUnit>> units;
    std::vector<size_t> unitGroup;
    // A frozen parameter of the root built sharded (tied to a use outside its unit) is made
    // whole, as the root's frozen parameters are.
    for (const auto& [name, t] : frozenOfRoot) {
      builtGathers.gather({t}, pg.communicator(), deferred);
      builtGathers.bound({t});
    }
    for (size_t k = 0; k < layout.units.size(); ++k) {
      const UnitLayout& u = layout.units[k];
      std::vector<UnitParam> params;
      std::vector<at::Tensor> tensors;
      for (size_t i : u.params) {
        params.push_back({trained[i].first, trained[i].second});
        tensors.push_back(trained[i].second);
      }
      const at::ScalarType dtype = trained[u.params.front()].second.scalar_type();
      const bool resharded = options.stage == 3 && ownerOf[k] < marked.size();
      // A unit fullyShard laid out as this layout does takes its block as built; any other is
      // gathered once from the blocks as built (Note [Units sharded when built]).
      at::Tensor asBuilt = resharded ? builtGathers.adopt(tensors, u) : at::Tensor();
      // Built again after a re-form: the module's parameters have no memory; the block is
      // loaded from the mirrors next (Note [Shard mirrors]).
      if (emptyBlocks && resharded) asBuilt = emptyBlock(trained[u.params.front()].second, u, pg);
      if (!asBuilt.defined()) builtGathers.gather(tensors, pg.communicator(), deferred);
      // ZeroOptions::paramDtype: a marked unit's float32 parameters held in it, their values
      // the master's.
      const bool convert = options.paramDtype && resharded && dtype == at::kFloat;
      UnitDtypes types;
      types.param = convert ? *options.paramDtype : dtype;
      types.master = convert ? dtype : masterTypeOf(dtype, options);
      types.grad = options.reduceDtype && types.master != types.param ? *options.reduceDtype
                                                                      : types.param;
      units.push_back(std::make_unique<ShardUnit>(
          k, u, std::move(params), pg.rank(), pg.size(), options.stage, types, pg.communicator(),
          pg.device(), resharded, options.offload, asBuilt));
      if (!asBuilt.defined()) builtGathers.bound(tensors);
      const size_t g = groupOf[u.params.front()];
      std::vector<torch::optim::OptimizerParamGroup> one;
      one.emplace_back(std::vector<at::Tensor>{units.back()->optimized()},
                       groupOptions[g]->clone());
      units.back()->setOptimizer(factory.make(std::move(one)));
      unitGroup.push_back(g);
    }
    for (size_t f = 0; f < frozenLayout.units.size(); ++f) {  // Note [Frozen units]
      const UnitLayout& u = frozenLayout.units[f];
      std::vector<UnitParam> params;
      std::vector<at::Tensor> tensors;
      for (size_t i : u.params) {
        params.push_back({frozen[i].first, frozen[i].second});
        tensors.push_back(frozen[i].second);
      }
      const at::ScalarType dtype = frozen[u.params.front()].second.scalar_type();
      at::Tensor asBuilt = emptyBlocks ? emptyBlock(frozen[u.params.front()].second, u, pg)
                                       : builtGathers.adopt(tensors, u);
      if (!asBuilt.defined()) builtGathers.gather(tensors, pg.communicator(), deferred);
      UnitDtypes types;
      types.param = types.master = types.grad = dtype;
      units.push_back(std::make_unique<ShardUnit>(
          layout.units.size() + f, u, std::move(params), pg.rank(), pg.size(), options.stage, types,
          pg.communicator(), pg.device(), /*resharded=*/true, /*offload=*/false, asBuilt,
          /*frozen=*/true));
      if (!asBuilt.defined()) builtGathers.bound(tensors);
    }
    for (size_t g = 0; g < groupOptions.size(); ++g) {
      std::vector<at::Tensor> shards;
      for (size_t k = 0; k < unitGroup.size(); ++k) {  // the trained units: frozen ones follow
        if (unitGroup[k] == g) shards.push_back(units[k]->optimized());
      }
      built.groups.emplace_back(std::move(shards), groupOptions[g]->clone());
    }
    if (log::enabled(log::Level::Info)) {
      DTRAIN_LOG(Info,
                 "ZeRO stage {}: {} parameters ({} elements) in {} units; each of {} ranks "
                 "owns {} elements, {} of them padding in all; {} frozen units ({} elements)",
                 options.stage, trained.size(), layout.numel(), layout.units.size(), pg.size(),
                 layout.shardNumel(), layout.padding(), frozenLayout.units.size(),
                 frozenLayout.numel());
    }
    built.shards = std::make_shared<ShardGroup>(ddp.groupPtr(), layout, std::move(units),
                                                std::move(unitGroup), options, frozenLayout);
    built.sync = std::make_shared<ShardedGradientSync>(built.shards, ddp.options());
    bindMarked(marked, ownerOf, built.shards);
    builtGathers.done();
    return built.sync;
  });
  return built;
}

}  // namespace dtrain::zero
