#include "gradient_sync.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "../backward_pass.h"
#include "../nan_grad_fault.h"
#include "../torch_compat.h"
#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"

// Note [Sharded backward]
// DDP's backward (Note [DDP backward]) with units for buckets and a reduce-scatter for the
// allreduce: a post-hook on each parameter's gradient accumulator hands the finished gradient to
// its unit (ShardGroup::fill); the unit whose last gradient this was starts its reduce-scatter,
// units strictly in unit order so that every rank issues the same collectives in the same order.
// The first hook of a pass queues a callback with the autograd engine that marks what got no
// gradient (zeros, so the ranks' collectives still line up), launches the rest, waits for every
// unit and throws, naming the parameters, when some got no gradient and findUnusedParameters is
// off. Its errors come out of backward().
//
// Unused parameters (findUnusedParameters): those the forward's outputs do not reach take part
// with zeros at the start of the pass. A parameter no rank used is then stepped with a zero
// gradient -- momentum and weight decay still apply -- where a libtorch optimizer over DDP skips
// a parameter whose .grad stayed undefined: a shard is one flat tensor, as FSDP's flat parameters
// and DeepSpeed's partitions are, and they do the same.
//
// noSync(): a backward after a forward inside the guard only accumulates: stage 1 into the
// units' buffers (the gradients are views of them), stages 2 and 3 into the parameters' own
// .grad, full-size, until the synchronising backward copies them into buckets (DeepSpeed's first
// behaviour: no communication until the accumulation boundary; Note [Unit states]). So under
// noSync() stage 3 keeps every unit's full gradients between micro-batches -- its parameters
// it does not: a noSync() backward counts each unit's gradients as a synchronising one does
// and reshards the unit once they are all in, and its end reshards whatever is left (a unit
// with a parameter that pass did not reach).

namespace dtrain::zero {

using Clock = DdpIterationStats::Clock;

ShardedGradientSync::ShardedGradientSync(std::shared_ptr<ShardGroup> shards,
                                         const DdpOptions& ddpOptions)
    : shards_(std::move(shards)), ddpOptions_(ddpOptions) {
  std::vector<size_t> pending;
  for (size_t k = 0; k < shards_->size(); ++k) {
    pending.push_back(shards_->unit(k).params().size());
    for (size_t j = 0; j < shards_->unit(k).params().size(); ++j) params_.push_back({k, j});
  }
  pending_ = pending;
  ready_.assign(params_.size(), 0);
  installHooks();
}

ShardedGradientSync::~ShardedGradientSync() {
  for (size_t i = 0; i < postKeys_.size(); ++i) {
    compat::removeAccumulatorPostHook(accumulators_[i], postKeys_[i]);
  }
  for (size_t i = 0; i < preKeys_.size(); ++i) {
    compat::removeAccumulatorPreHook(accumulators_[i], preKeys_[i]);
  }
}

const std::string& ShardedGradientSync::nameOf(size_t index) const {
  return shards_->unit(params_[index].unit).params()[params_[index].slot].name;
}

const at::Tensor& ShardedGradientSync::tensorOf(size_t index) const {
  // The unit's handle on the parameter: the same TensorImpl as the module's.
  return shards_->unit(params_[index].unit).params()[params_[index].slot].param;
}

void ShardedGradientSync::installHooks() {
  for (size_t i = 0; i < params_.size(); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(tensorOf(i));
    DTRAIN_CHECK(accumulator != nullptr,
                 "ShardedOptimizer: parameter {} has no gradient accumulator (is it a leaf tensor "
                 "that requires grad?)",
                 nameOf(i));
    postKeys_.push_back(
        compat::addAccumulatorPostHook(accumulator, [this, i] { onGradientReady(i); }));
    if (shards_->stage() == 1) {
      preKeys_.push_back(
          compat::addAccumulatorPreHook(accumulator, [this] { onGradientArriving(); }));
    }
    accumulators_.push_back(std::move(accumulator));
  }
}

std::vector<std::vector<std::string>> ShardedGradientSync::bucketNames() const {
  std::vector<std::vector<std::string>> out;
  for (size_t k = 0; k < shards_->size(); ++k) {
    out.emplace_back();
    for (const auto& p : shards_->unit(k).params()) out.back().push_back(p.name);
  }
  return out;
}

void ShardedGradientSync::arm(const std::vector<at::Tensor>& outputs) {
  std::lock_guard<std::mutex> lock(mutex_);
  ddp::checkPreviousPassEnded(callbackQueued_, shards_->group().rank(), "ShardedOptimizer",
                              nextUnit_, shards_->size(), "unit reduce-scatters");
  const bool rearm = state_ == State::Armed;
  state_ = State::Armed;
  if (ddpOptions_.findUnusedParameters) unused_.search(outputs, accumulators_, rearm);
}

void ShardedGradientSync::disarm() {
  std::lock_guard<std::mutex> lock(mutex_);
  state_ = State::Local;
  unused_.clear();
}

void ShardedGradientSync::onGradientArriving() {
  if (open_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (open_.load(std::memory_order_relaxed)) return;
  shards_->openAccumulation();
  open_.store(true, std::memory_order_release);
}

void ShardedGradientSync::onGradientReady(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  if (state_ != State::Armed) {
    if (state_ == State::Local) {
      shards_->setLocalGradients(true);
      if (shards_->stage() == 3) localGradientLocked(index);
    }
    if (state_ == State::Idle && !warnedUnexpected_) {
      warnedUnexpected_ = true;
      ddp::warnBackwardWithoutForward("ShardedOptimizer", shards_->group().rank());
    }
    return;
  }
  if (!callbackQueued_) {
    callbackQueued_ = true;
    const uint64_t iteration = stats_.iteration;
    stats_ = DdpIterationStats{};
    stats_.iteration = iteration;
    stats_.firstGradient = now;
    compat::queueEngineCallback([this] { finalizeBackward(); });
    for (size_t u : unused_.unused()) markReadyLocked(u, false);
  }
  stats_.lastGradient = now;
  if (ready_[index]) {
    ddp::throwGradientTwice("ShardedOptimizer", shards_->group().rank(), nameOf(index),
                            ddpOptions_.findUnusedParameters);
  }
  markReadyLocked(index, true);
}

void ShardedGradientSync::localGradientLocked(size_t index) {
  if (!callbackQueued_) {
    callbackQueued_ = true;
    compat::queueEngineCallback([this] { finishLocalPass(); });
  }
  if (ready_[index]) return;
  ready_[index] = 1;
  const size_t k = params_[index].unit;
  if (--pending_[k] == 0) shards_->gradientsComplete(k);
}

void ShardedGradientSync::finishLocalPass() {
  std::lock_guard<std::mutex> lock(mutex_);
  resetPassLocked();
  shards_->backwardEnded();  // frees the units a parameter left unfinished
}

void ShardedGradientSync::markReadyLocked(size_t index, bool hookFired) {
  ready_[index] = 1;
  const Param& p = params_[index];
  const fault::Fault* poison = nullptr;
  if (hookFired && !poisonedThisPass_) {
    poison = ddp::nanGradFault(shards_->group().rank(), stats_.iteration, /*after=*/false);
    poisonedThisPass_ = poison != nullptr;
  }
  const at::Tensor& grad = tensorOf(index).grad();
  DTRAIN_CHECK(!grad.defined() || !grad.is_sparse(),
               "ShardedOptimizer: parameter {} has a sparse gradient; only dense gradients are "
               "supported. HINT: use a dense embedding (sparse=false)",
               nameOf(index));
  shards_->fill(p.unit, p.slot, poison);
  if (--pending_[p.unit] == 0) {
    shards_->gradientsComplete(p.unit);  // stage 3: Note [ZeRO-3 unit lifecycle]
    launchReadyUnitsLocked();
  }
}

void ShardedGradientSync::launchReadyUnitsLocked() {
  while (nextUnit_ < shards_->size() && pending_[nextUnit_] == 0) {
    stats_.bucketLaunched.push_back(Clock::now());
    shards_->launchReduce(nextUnit_++);
  }
}

void ShardedGradientSync::finalizeBackward() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.backwardEnd = Clock::now();
  std::vector<size_t> missing = ddp::finishPass(
      [this](std::vector<size_t>& out) { finalizeLocked(out); }, [this] { resetPassLocked(); });
  if (missing.empty()) return;
  std::vector<std::string> names;
  for (size_t i : missing) names.push_back(nameOf(i));
  ddp::throwNoGradient("ShardedOptimizer", shards_->group().rank(), missing.size(), params_.size(),
                       ddp::listNames(names), ddpOptions_.findUnusedParameters);
}

void ShardedGradientSync::finalizeLocked(std::vector<size_t>& missing) {
  if (shards_->stage() == 1 && !open_.load()) {
    shards_->openAccumulation();  // no gradient arrived at all in this pass
    open_.store(true);
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!ready_[i]) missing.push_back(i);
  }
  // See Note [Sharded backward]: launch what is left so that the ranks' collectives line up.
  for (size_t i : missing) markReadyLocked(i, false);
  std::chrono::nanoseconds waited{0};
  for (size_t k = 0; k < shards_->size(); ++k) {
    if (shards_->gradState(k) == ShardGroup::Grads::Reducing) waited += shards_->finishReduce(k);
  }
  if (const auto* f = ddp::nanGradFault(shards_->group().rank(), stats_.iteration, true)) {
    for (size_t k = 0; k < shards_->size(); ++k) {
      at::Tensor& grad = shards_->shardGrad(k);
      if (grad.numel() == 0) continue;
      at::NoGradGuard noGrad;
      ddp::poison(grad, *f);  // this rank's shard alone: the reduce-scatter is over
      DTRAIN_LOG(Warn, "rank {}: DTRAIN_FAULT {}: poisoned the shard of {} after the "
                 "reduce-scatter", shards_->group().rank(), f->describe(),
                 shards_->unit(k).describe());
      break;
    }
  }
  shards_->setLocalGradients(false);
  shards_->backwardEnded();
  stats_.waited = waited;
  stats_.finished = Clock::now();
  ++stats_.iteration;
}

void ShardedGradientSync::resetPassLocked() {
  state_ = State::Idle;
  callbackQueued_ = false;
  poisonedThisPass_ = false;
  open_.store(false);
  std::fill(ready_.begin(), ready_.end(), 0);
  for (size_t k = 0; k < shards_->size(); ++k) pending_[k] = shards_->unit(k).params().size();
  nextUnit_ = 0;
  unused_.clear();
}

size_t ShardedGradientSync::looseGradientBytes() const {
  size_t bytes = 0;
  for (size_t k = 0; k < shards_->size(); ++k) {
    ShardUnit& u = shards_->unit(k);
    for (size_t j = 0; j < u.params().size(); ++j) {
      const at::Tensor& grad = u.params()[j].param.grad();
      if (!grad.defined()) continue;
      if (u.holdsGrads() && grad.data_ptr() == u.gradView(j).data_ptr()) continue;
      bytes += grad.storage().nbytes();
    }
  }
  return bytes;
}

}  // namespace dtrain::zero
