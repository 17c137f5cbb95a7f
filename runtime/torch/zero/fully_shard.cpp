// ShardedUnit (dtrain/torch/fully_shard.h) and its binding to the shards: the forward and the
// boundary of Note [ZeRO-3 unit lifecycle].
#include "dtrain/torch/fully_shard.h"

#include <cstdint>
#include <functional>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "built_unit.h"
#include "dtrain/base/error.h"
#include "dtrain/torch/process_group.h"
#include "dtrain/torch/zero.h"
#include "shard_group.h"
#include "unit_binding.h"

namespace dtrain {

namespace zero {

namespace {

// Identity in forward; in backward it gathers the unit before any of the unit's nodes run (they
// all wait for the gradient of its output). Holds its binding as an address: the ShardedUnit
// owns the binding, and the graph is used while the model lives.
struct GatherForBackward : public torch::autograd::Function<GatherForBackward> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& output,
                            int64_t binding) {
    ctx->saved_data["binding"] = binding;
    return output;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* binding = reinterpret_cast<UnitBinding*>(ctx->saved_data["binding"].toInt());
    binding->gatherForBackward();
    return {grads[0], at::Tensor()};
  }
};

// Identity in forward; in backward, the gradient of the unit's input is complete, so every node
// of the unit it waited for has run: what may free the unit's frozen parameters (Note [Frozen
// units]). Holds its binding as an address, as GatherForBackward does.
struct InputBoundary : public torch::autograd::Function<InputBoundary> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            int64_t binding) {
    ctx->saved_data["binding"] = binding;
    return input;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* binding = reinterpret_cast<UnitBinding*>(ctx->saved_data["binding"].toInt());
    binding->inputGradientArrived();
    return {grads[0], at::Tensor()};
  }
};

}  // namespace

UnitBinding::UnitBinding(std::weak_ptr<ShardGroup> shards, std::vector<size_t> units,
                         std::string name, bool reshardAfterForward,
                         std::optional<size_t> frozenRelease)
    : shards_(std::move(shards)),
      units_(std::move(units)),
      name_(std::move(name)),
      reshardAfterForward_(reshardAfterForward),
      frozenRelease_(frozenRelease) {}

ShardGroup& UnitBinding::shards() {
  auto shards = shards_.lock();
  DTRAIN_CHECK(shards != nullptr,
               "ShardedUnit {}: the stage-3 ShardedOptimizer that sharded "
               "its parameters is gone, and they with it. HINT: keep the optimizer alive while "
               "the model is used",
               name_);
  return *shards;  // the optimizer owns the group; it outlives this call
}

at::Tensor UnitBinding::forward(torch::nn::AnyModule& module, const at::Tensor& input) {
  ShardGroup& group = shards();
  std::vector<size_t> gathered;
  for (size_t k : units_) {
    if (group.unshard(k, ShardGroup::Why::Forward, name_)) gathered.push_back(k);
  }
  // ZeroOptions::paramDtype: a floating input in the dtype the unit computes in, as FSDP2's
  // MixedPrecisionPolicy(cast_forward_inputs=True); under autocast the same cast it would make.
  at::Tensor x = input;
  if (frozenRelease_ && at::GradMode::is_enabled() && x.requires_grad()) {
    group.frozenInputForward(*frozenRelease_);
    x = InputBoundary::apply(x, reinterpret_cast<intptr_t>(this));
  }
  for (size_t k : units_) {
    const ShardUnit& unit = group.unit(k);
    if (unit.converted() && x.is_floating_point() && x.scalar_type() != unit.dtype()) {
      x = x.to(unit.dtype());
      break;
    }
  }
  at::Tensor output;
  try {
    output = module.forward<at::Tensor>(x);
  } catch (...) {
    for (size_t k : gathered) group.reshard(k);
    throw;
  }
  const bool backward = !units_.empty() && at::GradMode::is_enabled() && output.requires_grad();
  // reshardAfterForward = false: kept for the backward, which frees it once its gradients are in
  // (a forward no backward follows frees as usual).
  if (reshardAfterForward_ || !backward) {
    for (size_t k : gathered) group.reshard(k);
  }
  if (!backward) return output;
  return GatherForBackward::apply(output, reinterpret_cast<intptr_t>(this));
}

void UnitBinding::gatherForBackward() {
  ShardGroup& group = shards();
  for (size_t k : units_) group.unshard(k, ShardGroup::Why::Backward, name_);
  if (frozenRelease_) group.armFrozenRelease(*frozenRelease_);
}

void UnitBinding::inputGradientArrived() {
  if (frozenRelease_) shards().frozenInputBackward(*frozenRelease_);
}

}  // namespace zero

ShardedUnitImpl::ShardedUnitImpl(torch::nn::AnyModule module, ShardedUnitOptions options)
    : module_(std::move(module)), options_(options) {
  DTRAIN_CHECK_ARG(!module_.is_empty(), "ShardedUnit: an empty module");
  const auto inner = module_.ptr();
  for (const auto& p : inner->named_parameters(/*recurse=*/false)) {
    register_parameter(p.key(), p.value(), p.value().requires_grad());
  }
  for (const auto& b : inner->named_buffers(/*recurse=*/false)) register_buffer(b.key(), b.value());
  for (const auto& c : inner->named_children()) register_module(c.key(), c.value());
}

at::Tensor ShardedUnitImpl::forward(const at::Tensor& input) {
  if (!binding_) {
    refuseUnbuilt("run");
    return module_.forward<at::Tensor>(input);
  }
  return binding_->forward(module_, input);
}

void ShardedUnitImpl::train(bool on) {
  torch::nn::Module::train(on);
  module_.ptr()->train(on);
}

void ShardedUnitImpl::refuseUnbuilt(const char* what) const {
  if (!built_) return;
  size_t count = 0;
  for (const auto& part : built_->parts) count += part.params.size();
  DTRAIN_THROW(InvalidArgument,
               "ShardedUnit ({} parameters, the first {}): it was sharded when built "
               "(fullyShard) and no stage-3 ShardedOptimizer holds it yet, so its parameters "
               "have no memory and it cannot {}. HINT: build the ShardedOptimizer with "
               "ZeroOptions::stage = 3 over the DistributedDataParallel first",
               count, built_->parts.front().names.front(), what);
}

// A unit sharded when built cannot be converted: its parameters have no memory. A "conversion"
// to where and what it is already (Module::to() of the whole model) changes nothing.
void ShardedUnitImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  if (built_) {
    bool same = device == built_->where.device;
    for (const auto& part : built_->parts) same = same && part.owned.scalar_type() == dtype;
    if (!same) {
      refuseUnbuilt("be converted to another device or dtype (build it on its device, in its "
                    "dtype, before fullyShard)");
    }
  }
  torch::nn::Module::to(device, dtype, non_blocking);
}

void ShardedUnitImpl::to(torch::Dtype dtype, bool non_blocking) {
  if (built_) {
    for (const auto& part : built_->parts) {
      if (part.owned.scalar_type() != dtype) {
        refuseUnbuilt("be converted to another dtype (convert the module before fullyShard)");
      }
    }
  }
  torch::nn::Module::to(dtype, non_blocking);
}

void ShardedUnitImpl::to(torch::Device device, bool non_blocking) {
  if (built_ && device != built_->where.device) {
    refuseUnbuilt("move to another device (give fullyShard the group or device it trains on)");
  }
  torch::nn::Module::to(device, non_blocking);
}

ShardPlacement::ShardPlacement(int rank, int ranks, c10::Device device)
    : rank(rank), ranks(ranks), device(device) {}

ShardPlacement::ShardPlacement(const ProcessGroup& group)
    : rank(group.rank()), ranks(group.size()), device(group.device()) {}

ShardedUnit fullyShard(torch::nn::AnyModule module, const ShardPlacement& where,
                       ShardedUnitOptions options) {
  ShardedUnit unit(std::move(module), options);
  unit->setBuilt(zero::shardWhenBuilt(*unit, where));
  return unit;
}

void ShardedUnitImpl::bind(std::shared_ptr<zero::UnitBinding> binding) {
  // A binding whose ShardGroup is gone (a ShardedOptimizer built again after a re-form) gives
  // way.
  DTRAIN_CHECK_ARG(binding_ == nullptr || binding_->expired(),
                   "ShardedUnit {}: bound to a second stage-3 "
                   "ShardedOptimizer. HINT: one ShardedOptimizer per model",
                   binding->name());
  binding_ = std::move(binding);
}

torch::nn::Sequential shardEveryChild(const torch::nn::Sequential& sequential,
                                      ShardedUnitOptions options) {
  torch::nn::Sequential out;
  const auto children = sequential->named_children();
  size_t i = 0;
  for (const torch::nn::AnyModule& m : *sequential) {
    std::string name = children[i++].key();
    out->push_back(std::move(name),
                   std::make_shared<ShardedUnitImpl>(torch::nn::AnyModule(m), options));
  }
  return out;
}

void visitFullParameters(ShardedOptimizer& optimizer,
                         const std::function<void(const std::string&, const at::Tensor&)>& visit) {
  zero::ShardGroup& shards = optimizer.shards();
  shards.settleGathers();  // Note [Deferred all-gathers]: the last step's, not waited for yet
  at::NoGradGuard noGrad;
  for (size_t k = 0; k < shards.unitCount(); ++k) {  // the frozen units too, last
    zero::ShardUnit& unit = shards.unit(k);
    if (unit.converted()) {  // ZeroOptions::paramDtype: the values are the master's
      const at::Tensor full = shards.gatherMaster(k);
      for (size_t j = 0; j < unit.params().size(); ++j) {
        const at::Tensor& p = unit.params()[j].param;
        visit(unit.params()[j].name,
              full.narrow(0, unit.layout().offsets[j], p.numel()).view(p.sizes()));
      }
      continue;
    }
    const bool gathered = shards.unshard(k, zero::ShardGroup::Why::Full,
                                         unit.params().front().name);
    try {
      for (const auto& p : unit.params()) visit(p.name, p.param.detach());
    } catch (...) {
      if (gathered) shards.reshard(k);
      throw;
    }
    if (gathered) shards.reshard(k);
  }
}

std::vector<std::pair<std::string, at::Tensor>> gatherFullParameters(ShardedOptimizer& optimizer) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  visitFullParameters(optimizer, [&](const std::string& name, const at::Tensor& full) {
    out.emplace_back(name, full.clone());
  });
  return out;
}

}  // namespace dtrain
