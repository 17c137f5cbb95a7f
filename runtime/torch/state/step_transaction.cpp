// What follows a step discarded after a lost node (TrainingState::tryStep): the survivors made
// equal again, and the samplers re-sharded for the new world.
//
// Note [Settling after a re-form]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The commit of a step is the success of its collectives on this rank: a rank whose gradient
// sync completed holds the gradient averaged over every member (the lost ones had contributed
// before they went) and applies the step; a rank whose sync failed applies nothing. Both can
// happen in one step -- a ring allreduce finishes on some ranks while the lost node cuts the
// others off -- so no vote during the step could prevent it without a message of its own in
// every step. It is settled here instead, only after a failure: the members compare the step
// they were in (one allgather of a number); when some applied one step more, the lowest-ranked
// of them hands its replicated state (parameters, buffers, optimizers, schedulers, scalers,
// sampler positions) to the rest by broadcast, and every member runs the next step from there.
// A step is never half applied on a rank, and the ranks never go on apart. A newer membership
// epoch may cut the settling itself short (a node lost right after a re-form, or a join that
// waited DTRAIN_JOIN_WAIT for a step boundary): the members re-form again and settle again, and
// a rank that had begun to receive a state says so -- its own may now be part of another's -- so
// it is handed a whole one and never hands its own. If none is left whole (the only member ahead
// lost meanwhile, every other receiving), the job restarts.

#include <cstring>
#include <sstream>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/serialize/archive.h>

#include "../torch_compat.h"
#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "dtrain/torch/grad_scaler.h"
#include "dtrain/torch/process_group.h"
#include "registry.h"

namespace dtrain::state {

namespace {

// `bytes` from `root` to every member. Host values travel through ProcessGroup::broadcastHost
// (a GPU group's collectives take no host tensor).
void broadcastBytes(ProcessGroup& group, std::string& bytes, int root) {
  at::Tensor size = at::tensor({static_cast<int64_t>(bytes.size())}, at::kLong);
  group.broadcastHost(size, root);
  at::Tensor data = at::empty({size.item<int64_t>()}, at::kByte);
  if (group.rank() == root) std::memcpy(data.data_ptr(), bytes.data(), bytes.size());
  if (data.numel() > 0) group.broadcastHost(data, root);
  bytes.assign(static_cast<const char*>(data.data_ptr()), static_cast<size_t>(data.numel()));
}

// What `save` writes into a libtorch archive on `root`, given to `load` on every other member.
template <typename Save, typename Load>
void broadcastArchive(ProcessGroup& group, int root, const Save& save, const Load& load) {
  std::string bytes;
  if (group.rank() == root) {
    torch::serialize::OutputArchive archive;
    save(archive);
    std::ostringstream out;
    archive.save_to(out);
    bytes = out.str();
  }
  broadcastBytes(group, bytes, root);
  if (group.rank() != root) {
    torch::serialize::InputArchive archive;
    std::istringstream in(bytes);
    archive.load_from(in);
    load(archive);
  }
}

// `root`'s replicated state to every member: with `parameters`, the modules' parameters (under
// ZeRO the sharded optimizers' are restored from the mirrors instead, and their groups' options
// are sent).
void handOver(Registry& r, ProcessGroup& group, int root, bool parameters) {
  at::NoGradGuard noGrad;
  for (auto& [name, module] : r.modules) {
    for (auto& p : module->parameters(/*recurse=*/true)) {
      if (parameters && p.numel() > 0) group.broadcast(p, root);
    }
    for (auto& b : module->buffers(/*recurse=*/true)) {
      if (b.defined() && b.numel() > 0) group.broadcast(b, root);
    }
  }
  for (auto& [name, optimizer] : r.optimizers) {
    broadcastArchive(
        group, root, [&](auto& out) { optimizer->save(out); },
        [&](auto& in) { optimizer->load(in); });
  }
  for (auto& e : r.sharded) {  // the options a scheduler or the program set: the learning rate
    for (auto& g : e.optimizer->param_groups()) {
      broadcastArchive(
          group, root, [&](auto& out) { g.options().serialize(out); },
          [&](auto& in) { g.options().serialize(in); });
    }
  }
  for (auto& [name, scheduler] : r.schedulers) {
    at::Tensor count = at::tensor({static_cast<int64_t>(compat::schedulerStepCount(*scheduler))},
                                  at::kLong);
    group.broadcastHost(count, root);
    compat::schedulerStepCount(*scheduler) = static_cast<unsigned>(count.item<int64_t>());
  }
  for (auto& [name, scaler] : r.scalers) {
    GradScalerState s = scaler->state();
    at::Tensor v = at::tensor({s.scale, s.growthFactor, s.backoffFactor,
                               static_cast<double>(s.growthInterval),
                               static_cast<double>(s.growthTracker)},
                              at::kDouble);
    group.broadcastHost(v, root);
    auto a = v.accessor<double, 1>();
    s.scale = a[0];
    s.growthFactor = a[1];
    s.backoffFactor = a[2];
    s.growthInterval = static_cast<int64_t>(a[3]);
    s.growthTracker = static_cast<int64_t>(a[4]);
    scaler->loadState(s);
  }
}

// Every sampler from `root`'s position where the step to run begins, re-sharded for the world.
void shareSamplers(Registry& r, ProcessGroup& group, int root) {
  for (size_t i = 0; i < r.samplers.size(); ++i) {
    SamplerState at = i < r.stepStart.size() ? r.stepStart[i] : r.samplers[i].state();
    std::vector<uint8_t> encoded = at.encode();
    std::string bytes(encoded.begin(), encoded.end());
    broadcastBytes(group, bytes, root);
    at = SamplerState::decode(std::vector<uint8_t>(bytes.begin(), bytes.end()));
    r.samplers[i].sampler->reshard(group.size(), group.rank(), at);
    if (i < r.stepStart.size()) r.stepStart[i] = at;
  }
}

}  // namespace

void handOverReplicated(Registry& r, ProcessGroup& group, int root) {
  // On a newcomer: what its optimizer built alone left (ZeRO's placeholders of the first build).
  dropGradients(r);
  handOver(r, group, root, /*parameters=*/false);
  r.stepStart.resize(r.samplers.size());
  shareSamplers(r, group, root);
}

void dropGradients(Registry& r) {
  for (auto& [name, module] : r.modules) {
    for (auto& p : module->parameters(/*recurse=*/true)) {
      if (p.grad().defined()) p.mutable_grad() = at::Tensor();
    }
  }
}

int64_t settleAfterReform(Registry& r, ProcessGroup& group, int64_t step, bool* partial) {
  // The discarded step's gradients, partly accumulated, must not reach the next attempt.
  dropGradients(r);
  const auto all = group.allgatherHost(at::tensor({step, *partial ? 1L : 0L}, at::kLong));
  // The root: the lowest-ranked member at the highest step whose state is whole.
  int64_t top = -1;
  int root = -1;
  bool equal = true;
  for (int i = 0; i < static_cast<int>(all.size()); ++i) {
    const int64_t s = all[static_cast<size_t>(i)][0].item<int64_t>();
    const bool whole = all[static_cast<size_t>(i)][1].item<int64_t>() == 0;
    if (s != step || !whole) equal = false;
    if (whole && s > top) {
      top = s;
      root = i;
    }
  }
  DTRAIN_CHECK(root >= 0,
               "rank {}/{}: a settling after a re-form was cut short by another membership "
               "change while every member was receiving state, so none holds a whole one; the "
               "job restarts from its last checkpoint",
               group.rank(), group.size());
  if (!equal) {
    DTRAIN_LOG(Warn,
               "members were at different steps after the re-form; rank {} (at step {}) "
               "hands its state over (Note [Settling after a re-form])",
               root, top);
    if (group.rank() != root) *partial = true;
    handOver(r, group, root, /*parameters=*/true);
  }
  shareSamplers(r, group, root);
  *partial = false;
  return top;
}

}  // namespace dtrain::state
