// fullyShard()'s sharding of a unit as it is built: Note [Units sharded when built].
#include "built_unit.h"

#include <numeric>
#include <unordered_set>

#include <ATen/ATen.h>

#include "../ddp/buffer_tensor.h"
#include "checkpoint/format.h"
#include "dtrain/base/error.h"
#include "dtrain/torch/detail/unit_layout.h"
#include "dtrain/torch/process_group.h"

namespace dtrain::zero {

namespace {

uint64_t checksumOf(const at::Tensor& param) {
  const at::Tensor host = param.detach().cpu().contiguous();
  return checkpoint::checksum(host.data_ptr(), host.nbytes());
}

}  // namespace

std::shared_ptr<BuiltUnit> shardWhenBuilt(torch::nn::Module& unit, const ShardPlacement& where) {
  DTRAIN_CHECK_ARG(where.ranks >= 1 && where.rank >= 0 && where.rank < where.ranks,
                   "fullyShard: rank {} of {} ranks is no place to keep a shard", where.rank,
                   where.ranks);
  std::unordered_set<const void*> skip;  // of units inside, sharded when built already
  for (const auto& m : unit.modules(/*include_self=*/false)) {
    auto inner = std::dynamic_pointer_cast<ShardedUnitImpl>(m);
    if (!inner || !inner->built()) continue;
    for (const auto& part : inner->built()->parts) {
      for (const auto& p : part.params) skip.insert(p.unsafeGetTensorImpl());
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (const auto& p : unit.named_parameters(/*recurse=*/true)) {
    const at::Tensor& t = p.value();
    if (!skip.insert(t.unsafeGetTensorImpl()).second) continue;
    DTRAIN_CHECK_ARG(t.numel() == 0 || t.storage().nbytes() > 0,
                     "fullyShard: parameter {} has no memory to shard (it belongs to a unit bound "
                     "to a stage-3 ShardedOptimizer already). HINT: shard a module when it is "
                     "built, before any optimizer takes it",
                     p.key());
    params.emplace_back(p.key(), t);
  }
  if (params.empty()) return nullptr;

  std::vector<ShardInput> inputs;
  for (const auto& [name, t] : params) {
    // Frozen parameters in parts of their own, as the optimizer's frozen units (Note [Frozen
    // units] in shard_group.h).
    const int frozen = t.requires_grad() ? 0 : 64;
    inputs.push_back({t.numel(), static_cast<size_t>(t.element_size()),
                      static_cast<int>(t.scalar_type()) + frozen});
  }
  std::vector<size_t> all(params.size());
  std::iota(all.begin(), all.end(), size_t{0});
  const ShardLayout layout = layoutUnits(inputs, {all}, where.ranks);

  auto built = std::make_shared<BuiltUnit>(where);
  std::vector<uint64_t> sums;
  at::NoGradGuard noGrad;
  for (const UnitLayout& u : layout.units) {
    BuiltPart part;
    part.layout = u;
    for (size_t i : u.params) {
      part.names.push_back(params[i].first);
      part.params.push_back(params[i].second);
      sums.push_back(checksumOf(params[i].second));
    }
    part.owned = at::zeros(
        {u.shardNumel},
        at::TensorOptions().dtype(part.params.front().scalar_type()).device(where.device));
    built->parts.push_back(std::move(part));
  }
  for (const OwnedRange& r : layout.ownedBy(where.rank)) {
    const at::Tensor& from = params[r.param].second;
    built->parts[r.unit]
        .owned.narrow(0, r.shardOffset, r.end - r.begin)
        .copy_(from.detach().reshape({-1}).narrow(0, r.begin, r.end - r.begin));
  }
  built->checksum = checkpoint::checksum(sums.data(), sums.size() * sizeof(uint64_t));

  // The parameters' memory goes: each part's parameters become views of one storage without
  // any, as a unit's between uses.
  for (BuiltPart& part : built->parts) {
    const auto options = part.owned.options();
    // Sized for set_() to accept the views, then without bytes: what releasing a unit leaves.
    const size_t bytes = static_cast<size_t>(part.layout.numel) * part.owned.element_size();
    at::Storage none(at::Storage::use_byte_size_t(), bytes, at::DataPtr(nullptr, where.device),
                     /*allocator=*/nullptr, /*resizable=*/false);
    for (size_t j = 0; j < part.params.size(); ++j) {
      at::Tensor& p = part.params[j];
      p.set_data(ddp::tensorIn(none, part.layout.offsets[j], p.sizes(), options));
    }
    none.unsafeGetStorageImpl()->set_nbytes(0);
  }
  for (const auto& b : unit.buffers(/*recurse=*/true)) {
    if (b.device() != where.device) b.set_data(b.to(where.device));
  }
  return built;
}

at::Tensor BuiltUnit::gather(size_t k, comm::Communicator& comm, const comm::CallOptions& call) {
  BuiltPart& part = parts.at(k);
  const int64_t s = part.layout.shardNumel;
  at::Tensor full = at::empty({s * where.ranks}, part.owned.options());
  if (s > 0) comm.allgather(part.owned.data_ptr(), full.data_ptr(), s, toDataType(full), call);
  at::NoGradGuard noGrad;
  for (size_t j = 0; j < part.params.size(); ++j) {
    at::Tensor& p = part.params[j];
    p.set_data(full.narrow(0, part.layout.offsets[j], p.numel()).view(p.sizes()));
  }
  return full;
}

std::vector<const void*> builtParameters(torch::nn::Module& root) {
  std::vector<const void*> out;
  for (const auto& m : root.modules(/*include_self=*/true)) {
    auto unit = std::dynamic_pointer_cast<ShardedUnitImpl>(m);
    if (!unit || !unit->built()) continue;
    for (const auto& part : unit->built()->parts) {
      for (const auto& p : part.params) out.push_back(p.unsafeGetTensorImpl());
    }
  }
  return out;
}

}  // namespace dtrain::zero
