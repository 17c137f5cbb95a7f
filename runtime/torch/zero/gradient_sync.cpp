#include "gradient_sync.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "../ddp/backward_pass.h"
#include "../ddp/nan_grad_fault.h"
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
// noSync(), stages 2 and 3 with ZeroOptions::Accumulation::ReduceScatter (the default): the
// backward of a forward inside the guard is armed as a synchronising one is (DdpCore asks
// armsUnderNoSync()), so each micro-batch's gradients are reduce-scattered and added to the
// shard's (Note [Accumulating into the shard]): between micro-batches a rank holds its shard's
// gradient only, as DeepSpeed's ZeRO-2 does with gradient accumulation steps; the sum of the
// micro-batches' averages is the average of their sum, to rounding.
// noSync() otherwise (Accumulation::Local, and stage 1 always): a backward after a forward
// inside the guard only accumulates: stage 1 into the units' buffers (the gradients are views of
// them), stages 2 and 3 into the parameters' own .grad, full-size, until the synchronising
// backward copies them into buckets (no communication until the accumulation boundary; Note
// [Unit states]). So then stage 3 keeps every unit's full gradients between micro-batches --
// its parameters it does not: a noSync() backward counts each unit's gradients as a
// synchronising one does
// and reshards the unit once they are all in, and its end reshards whatever is left (a unit
// with a parameter that pass did not reach).
//
// Note [Zeroed gradients]
// Under DDP a program drops the gradients it accumulated -- an abandoned accumulation, an epoch's
// leftover micro-batches -- with the optimizer's zero_grad() or the module's, and both reach
// every gradient there is. Under ZeRO they live in three places: the shards' .grad (S, what the
// optimizer sees), the units' buffers (stage 1, whose views are the parameters' .grad), and the
// parameters' own .grad (stages 2 and 3 under noSync()). The optimizer's zero_grad() sees only
// the first, the module's only the last two; so each is made to drop all:
//   - ShardedOptimizer::zero_grad() drops everything at once (zeroGradients): the shards'
//     gradients are unset, stage 1's open accumulation is abandoned unreduced (the next
//     backward opens a new one, which zeroes the buffers), stages 2 and 3 unset the parameters'
//     .grad.
//   - Anything else is found at the next pass's first gradient (a pre-hook on every gradient
//     accumulator), by comparing with what the last pass left: a shard's .grad unset or replaced
//     (libtorch's own zero_grad() through a torch::optim::Optimizer&) drops everything as above;
//     a parameter's .grad unset or replaced (torch::nn::Module::zero_grad(), either kind: it
//     assigns a detached tensor before zeroing) drops that parameter's part of S. The module's
//     zero_grad() drops the rest itself: it is the parameters' .grad or, at stage 1, their views.
// A gradient stages 2 and 3 would leave undefined -- after a synchronising backward, which moved
// it into the bucket and on into S -- could not show that the module zeroed it; it is left as a
// placeholder instead: zeros of the parameter's shape over one element of memory (an expanded
// scalar, shared by the unit), taken off again at the next pass's first gradient before autograd
// accumulates. Writing into a placeholder in place fails (its elements share one location): what
// the optimizer steps is the shard's gradient (clipGradNorm, GradScaler::unscale).
// Not seen: libtorch's zero_grad(false) through a torch::optim::Optimizer& (zeroing in place)
// zeroes S in place, and noSync()'s gradients outside it stay. The cost is one atomic load per
// gradient and, once per pass, a look at each parameter's and each shard's .grad.

namespace dtrain::zero {

namespace {

const void* implOf(const at::Tensor& t) {
  return t.defined() ? static_cast<const void*>(t.unsafeGetTensorImpl()) : nullptr;
}

}  // namespace

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
  gradMarks_.assign(params_.size(), nullptr);
  shardMarks_.assign(shards_->size(), nullptr);
  if (shards_->stage() != 1) {
    for (size_t k = 0; k < shards_->size(); ++k) {
      const ShardUnit& u = shards_->unit(k);
      if (u.params().empty()) continue;
      const at::Tensor zero = at::zeros({}, u.params().front().param.options());
      for (const auto& p : u.params()) placeholders_.push_back(zero.expand(p.param.sizes()));
    }
  }
  installHooks();
  std::lock_guard<std::mutex> lock(mutex_);
  markGradientsLocked();
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
    preKeys_.push_back(
        compat::addAccumulatorPreHook(accumulator, [this] { onGradientArriving(); }));
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

void ShardedGradientSync::armAccumulating(const std::vector<at::Tensor>& outputs) {
  arm(outputs);
  std::lock_guard<std::mutex> lock(mutex_);
  accumulatingPass_ = true;
}

void ShardedGradientSync::arm(const std::vector<at::Tensor>& outputs) {
  std::lock_guard<std::mutex> lock(mutex_);
  accumulatingPass_ = false;
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
  if (!starting_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!starting_.load(std::memory_order_relaxed)) return;
  startPassLocked();
  starting_.store(false, std::memory_order_release);
}

void ShardedGradientSync::startPassLocked() {
  // See Note [Zeroed gradients].
  at::NoGradGuard noGrad;
  bool shardsZeroed = false;
  for (size_t k = 0; k < shards_->size(); ++k) {
    shardsZeroed |= implOf(shards_->unit(k).optimized().grad()) != shardMarks_[k];
  }
  if (shardsZeroed) {
    dropAccumulatedLocked();
  } else {
    for (size_t i = 0; i < params_.size(); ++i) {
      if (implOf(tensorOf(i).grad()) != gradMarks_[i]) {
        shards_->dropShardGradient(params_[i].unit, params_[i].slot);
      }
    }
  }
  // A placeholder, or a view of one (torch::nn::Module::zero_grad(false) detaches and zeroes
  // it), goes: autograd must not accumulate into it.
  for (size_t i = 0; i < placeholders_.size(); ++i) {
    at::Tensor& grad = tensorOf(i).mutable_grad();
    if (grad.defined() && grad.data_ptr() == placeholders_[i].data_ptr()) grad = at::Tensor();
  }
  if (shards_->stage() == 1 && !open_) {
    shards_->openAccumulation();
    open_ = true;
  }
}

void ShardedGradientSync::dropAccumulatedLocked() {
  at::NoGradGuard noGrad;
  for (size_t k = 0; k < shards_->size(); ++k) {
    shards_->unit(k).optimized().mutable_grad() = at::Tensor();
  }
  if (shards_->stage() == 1) {
    if (open_) shards_->abandonAccumulation();
    open_ = false;
  } else {
    for (size_t i = 0; i < params_.size(); ++i) tensorOf(i).mutable_grad() = at::Tensor();
  }
  shards_->setLocalGradients(false);
}

void ShardedGradientSync::markGradientsLocked() {
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& grad = tensorOf(i).mutable_grad();
    if (!grad.defined() && i < placeholders_.size()) grad = placeholders_[i];
    gradMarks_[i] = implOf(grad);
  }
  for (size_t k = 0; k < shards_->size(); ++k) {
    shardMarks_[k] = implOf(shards_->unit(k).optimized().grad());
  }
  starting_.store(true, std::memory_order_release);
}

void ShardedGradientSync::zeroGradients() {
  std::lock_guard<std::mutex> lock(mutex_);
  dropAccumulatedLocked();
  markGradientsLocked();
}

void ShardedGradientSync::onGradientReady(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  if (state_ != State::Armed) {
    if (state_ == State::Local) {
      shards_->setLocalGradients(true);
      localGradientLocked(index);
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
  if (shards_->stage() != 3 || ready_[index]) return;
  ready_[index] = 1;
  const size_t k = params_[index].unit;
  if (--pending_[k] == 0) shards_->gradientsComplete(k);
}

void ShardedGradientSync::finishLocalPass() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (shards_->stage() == 3) {
    resetPassLocked();
    shards_->backwardEnded();  // frees the units a parameter left unfinished
  } else {
    callbackQueued_ = false;  // stages 1 and 2 stay Local until the next forward
  }
  markGradientsLocked();
}

void ShardedGradientSync::markReadyLocked(size_t index, bool hookFired) {
  ready_[index] = 1;
  const Param& p = params_[index];
  const fault::Fault* poison = nullptr;
  if (hookFired && !poisonedThisPass_ && !accumulatingPass_) {
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
    shards_->fillDeferred(p.unit);       // Note [Gradients wider than the parameters]
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
      [this](std::vector<size_t>& out) { finalizeLocked(out); },
      [this] {
        resetPassLocked();
        open_ = false;  // stage 1: the accumulation ended with its reduce-scatter
        markGradientsLocked();
      });
  if (missing.empty()) return;
  std::vector<std::string> names;
  for (size_t i : missing) names.push_back(nameOf(i));
  ddp::throwNoGradient("ShardedOptimizer", shards_->group().rank(), missing.size(), params_.size(),
                       ddp::listNames(names), ddpOptions_.findUnusedParameters);
}

void ShardedGradientSync::finalizeLocked(std::vector<size_t>& missing) {
  if (starting_.load()) {  // no gradient arrived at all in this pass
    startPassLocked();
    starting_.store(false);
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
  const fault::Fault* after = accumulatingPass_ ? nullptr
                                                : ddp::nanGradFault(shards_->group().rank(),
                                                                    stats_.iteration, true);
  if (const auto* f = after) {
    for (size_t k = 0; k < shards_->size(); ++k) {
      at::Tensor grad = shards_->shardGrad(k);
      if (grad.numel() == 0) continue;
      at::NoGradGuard noGrad;
      ddp::poison(grad, *f);  // this rank's shard alone: the reduce-scatter is over
      DTRAIN_LOG(Warn,
                 "rank {}: DTRAIN_FAULT {}: poisoned the shard of {} after the "
                 "reduce-scatter",
                 shards_->group().rank(), f->describe(), shards_->unit(k).describe());
      break;
    }
  }
  shards_->setLocalGradients(false);
  shards_->backwardEnded();
  stats_.waited = waited;
  stats_.finished = Clock::now();
  if (!accumulatingPass_) ++stats_.iteration;
}

void ShardedGradientSync::resetPassLocked() {
  state_ = State::Idle;
  callbackQueued_ = false;
  poisonedThisPass_ = false;
  std::fill(ready_.begin(), ready_.end(), 0);
  for (size_t k = 0; k < shards_->size(); ++k) pending_[k] = shards_->unit(k).params().size();
  nextUnit_ = 0;
  unused_.clear();
}

size_t ShardedGradientSync::looseGradientBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t bytes = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& grad = tensorOf(i).grad();
    if (!grad.defined()) continue;
    if (i < placeholders_.size() && implOf(grad) == implOf(placeholders_[i])) continue;
    ShardUnit& u = shards_->unit(params_[i].unit);
    if (u.holdsGrads() && grad.data_ptr() == u.gradView(params_[i].slot).data_ptr()) continue;
    bytes += grad.storage().nbytes();
  }
  return bytes;
}

}  // namespace dtrain::zero
