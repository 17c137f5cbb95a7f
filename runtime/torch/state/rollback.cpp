// The replicated half of a ZeRO rollback after a lost node (state::Rollback, rollback.h).
#include "rollback.h"

#include <sstream>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/module.h>
#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/serialize/archive.h>

#include "../torch_compat.h"
#include "dtrain/base/error.h"
#include "dtrain/torch/process_group.h"
#include "dtrain/torch/zero.h"
#include "registry.h"

namespace dtrain::state {

void copyReplicated(Registry& r, int64_t generation, ReplicaCopy& into) {
  at::NoGradGuard noGrad;
  into.generation = generation;
  size_t b = 0;
  for (auto& [name, module] : r.modules) {
    for (auto& buffer : module->buffers(/*recurse=*/true)) {
      if (!buffer.defined()) continue;
      if (b < into.buffers.size() && into.buffers[b].sizes() == buffer.sizes() &&
          into.buffers[b].scalar_type() == buffer.scalar_type()) {
        into.buffers[b].copy_(buffer);
      } else {
        into.buffers.resize(b + 1);
        into.buffers[b] = buffer.detach().clone();
      }
      ++b;
    }
  }
  into.buffers.resize(b);
  into.optimizers.clear();
  for (auto& [name, optimizer] : r.optimizers) {
    torch::serialize::OutputArchive archive;
    optimizer->save(archive);
    std::ostringstream out;
    archive.save_to(out);
    into.optimizers.push_back(out.str());
  }
  into.shardedOptions.clear();
  for (auto& e : r.sharded) {
    std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> groups;
    for (auto& g : e.optimizer->param_groups()) groups.push_back(g.options().clone());
    into.shardedOptions.push_back(std::move(groups));
  }
  into.schedulers.clear();
  for (auto& [name, scheduler] : r.schedulers) {
    into.schedulers.push_back(compat::schedulerStepCount(*scheduler));
  }
  into.scalers.clear();
  for (auto& [name, scaler] : r.scalers) into.scalers.push_back(scaler->state());
  into.samplers.clear();
  for (size_t i = 0; i < r.samplers.size(); ++i) {
    into.samplers.push_back(i < r.stepStart.size() ? r.stepStart[i] : r.samplers[i].state());
  }
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  into.cpuGenerator = generator.get_state();
}

void restoreReplicated(Registry& r, ProcessGroup& group, const ReplicaCopy& from) {
  at::NoGradGuard noGrad;
  size_t b = 0;
  dropGradients(r);
  for (auto& [name, module] : r.modules) {
    for (auto& buffer : module->buffers(/*recurse=*/true)) {
      if (!buffer.defined()) continue;
      DTRAIN_CHECK(b < from.buffers.size(), "rollback: more module buffers than were copied");
      buffer.copy_(from.buffers[b++]);
    }
  }
  for (size_t i = 0; i < r.optimizers.size() && i < from.optimizers.size(); ++i) {
    torch::serialize::InputArchive archive;
    std::istringstream in(from.optimizers[i]);
    archive.load_from(in);
    r.optimizers[i].second->load(archive);
  }
  for (size_t i = 0; i < r.sharded.size() && i < from.shardedOptions.size(); ++i) {
    auto& groups = r.sharded[i].optimizer->param_groups();
    for (size_t g = 0; g < groups.size() && g < from.shardedOptions[i].size(); ++g) {
      groups[g].set_options(from.shardedOptions[i][g]->clone());
    }
  }
  for (size_t i = 0; i < r.schedulers.size() && i < from.schedulers.size(); ++i) {
    compat::schedulerStepCount(*r.schedulers[i].second) = from.schedulers[i];
  }
  for (size_t i = 0; i < r.scalers.size() && i < from.scalers.size(); ++i) {
    r.scalers[i].second->loadState(from.scalers[i]);
  }
  r.stepStart.resize(r.samplers.size());
  for (size_t i = 0; i < r.samplers.size() && i < from.samplers.size(); ++i) {
    r.samplers[i].sampler->reshard(group.size(), group.rank(), from.samplers[i]);
    r.stepStart[i] = from.samplers[i];
  }
  if (from.cpuGenerator.defined()) {
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(from.cpuGenerator);
  }
}

}  // namespace dtrain::state
