#include "reducer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "../torch_compat.h"
#include "backward_pass.h"
#include "buffer_tensor.h"
#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "nan_grad_fault.h"

// Note [Gradients in the buckets]
// DdpOptions::gradientAsBucketView is on by default. Copying gradients into the buckets and the
// averages back costs two passes over every gradient per step, on the training thread; on the
// 2-core development VM, whose memory copies at 2-3 GB/s once the data outgrow the caches, that
// was most of the communication a 25M-parameter MLP exposed (ddp_step_bench without a peer, load
// 7-10: a quarter to a third of the step in copy mode, 5-7 % with the gradients in the buckets).
// PyTorch keeps it off because its bucket views are autograd views (detach_() refused); ours are
// from_blob tensors over the bucket memory, which behave as any gradient does.
//
// A .grad reset to undefined (zero_grad(set_to_none = true): libtorch 2.x's default for
// torch::optim::Optimizer::zero_grad and torch::nn::Module::zero_grad) is not in the bucket when
// backward starts: autograd's AccumulateGrad takes the new gradient as .grad, and the post-hook
// copies it into its slot and points .grad back at the slot. That one copy (read, write) is the
// cheapest way into the bucket for a gradient autograd creates: re-pointing undefined .grads at
// their zeroed slots before backward, so that AccumulateGrad adds in place, would zero the slot
// and then read two tensors and write one, 1.4x the copy's time for 25.6M float32 gradients on
// the development VM (and the same as zero_grad(false), which examples could call instead). So
// the reducer keeps the copy.
//
// Note [DDP backward]
// Each parameter's gradient accumulator (the AccumulateGrad node that adds into .grad) carries a
// post-hook, so the hook runs once per backward, after the gradient is complete in .grad. The hook
// copies the gradient into its slot of a bucket (with gradientAsBucketView it already lives
// there), to be divided by the world size there or by the allreduce (Note [Averaging]); the bucket
// whose last gradient this was starts its allreduce at once, while autograd goes on with the
// earlier layers. Buckets are launched
// strictly in bucket order, so every rank issues the same collectives in the same order even when
// gradients arrive in a different order on different ranks.
//
// The first hook of a pass queues a callback with the autograd engine; the engine runs it after the
// last node of the pass, still inside backward(). It waits for every bucket, widens compressed
// buckets and writes the averaged gradients back to .grad, so that they are synchronised when
// backward() returns and no call can be forgotten. An exception thrown there comes out of
// backward().
//
// A parameter whose hook did not run by then got no gradient. Its slot is zeroed and its bucket
// launched anyway (so the ranks' collectives still line up); then the callback throws, naming it,
// unless findUnusedParameters marked it unused at the start of the pass, as PyTorch does.

namespace dtrain::ddp {

namespace {

using Clock = DdpIterationStats::Clock;

std::string namesOf(const std::vector<NamedTensor>& params, const std::vector<size_t>& indices,
                    size_t limit = 8) {
  std::vector<std::string> names;
  for (size_t i : indices) names.push_back(params[i].name);
  return listNames(names, limit);
}

}  // namespace

Reducer::Reducer(std::shared_ptr<ProcessGroup> group, std::vector<NamedTensor> params,
                 const DdpOptions& options)
    : group_(std::move(group)),
      comm_(group_->communicator()),
      options_(options),
      params_(std::move(params)) {
  divisor_ = at::scalar_tensor(1.0 / group_->size(), at::TensorOptions().dtype(at::kDouble));
  ready_.assign(params_.size(), 0);
  usedLocally_.assign(params_.size(), 0);
  rebuilt_ = !options_.rebuildBuckets || options_.findUnusedParameters;
  buildBuckets(assignBuckets(bucketInputs(), options_.firstBucketBytes, options_.bucketBytes));
  if (options_.findUnusedParameters) {
    usedMemory_ = comm_.allocate(std::max<size_t>(1, params_.size() * sizeof(int32_t)));
    usedMap_ = tensorOver(usedMemory_, 0, {static_cast<int64_t>(params_.size())},
                          at::TensorOptions().dtype(at::kInt).device(group_->device()));
  }
  installHooks();
}

Reducer::~Reducer() {
  for (size_t i = 0; i < hookKeys_.size(); ++i) {
    compat::removeAccumulatorPostHook(accumulators_[i], hookKeys_[i]);
  }
  // A pass interrupted by an error may leave collectives that still write into the buckets.
  for (auto& bucket : buckets_) {
    if (!bucket.work) continue;
    try {
      bucket.work->wait(options_.timeout);
    } catch (const std::exception& e) {
      DTRAIN_LOG(Debug, "DDP: pending bucket allreduce failed at shutdown: {}", e.what());
    }
  }
}

std::vector<BucketInput> Reducer::bucketInputs() const {
  std::vector<BucketInput> inputs;
  for (const auto& p : params_) {
    inputs.push_back({static_cast<size_t>(p.tensor.numel()) * p.tensor.element_size(),
                      static_cast<int>(p.tensor.scalar_type())});
  }
  return inputs;
}

void Reducer::buildBuckets(const std::vector<std::vector<size_t>>& assignment) {
  buckets_.clear();
  slots_.assign(params_.size(), Slot{});
  for (auto& indices : assignment) {
    Bucket bucket;
    bucket.params = indices;
    bucket.dtype = params_[indices.front()].tensor.scalar_type();
    for (size_t i : indices) bucket.numel += params_[i].tensor.numel();
    auto options = at::TensorOptions().dtype(bucket.dtype).device(group_->device());
    size_t elem = c10::elementSize(bucket.dtype);
    bucket.memory = comm_.allocate(std::max<size_t>(1, bucket.numel * elem));
    bucket.flat = tensorOver(bucket.memory, 0, {bucket.numel}, options);
    int64_t offset = 0;
    for (size_t entry = 0; entry < indices.size(); ++entry) {
      const at::Tensor& p = params_[indices[entry]].tensor;
      bucket.views.push_back(tensorOver(bucket.memory, offset, p.sizes(), options));
      slots_[indices[entry]] = {buckets_.size(), entry};
      offset += p.numel();
    }
    // Note [Averaging]
    // float32 and float64 buckets that travel as they are are averaged by the allreduce itself
    // (ReduceOp::Avg: a backend that reduces in one pass, as the shared-memory one does, divides on
    // the way; with gradientAsBucketView nothing then touches a gradient between autograd and the
    // allreduce). 16-bit buckets and compressed ones are divided first, as PyTorch does, so their
    // sums cannot overflow.
    bucket.averagedByAllreduce = options_.compression == GradientCompression::None &&
                                 (bucket.dtype == at::kFloat || bucket.dtype == at::kDouble);
    if (options_.compression != GradientCompression::None && bucket.dtype == at::kFloat) {
      auto wireType = options_.compression == GradientCompression::Fp16 ? at::kHalf : at::kBFloat16;
      bucket.wireMemory = comm_.allocate(std::max<size_t>(1, bucket.numel * 2));
      bucket.wire = tensorOver(bucket.wireMemory, 0, {bucket.numel}, options.dtype(wireType));
    }
    bucket.pending = indices.size();
    buckets_.push_back(std::move(bucket));
  }
  if (options_.gradientAsBucketView) {
    // Gradients that exist move into the buckets (also the old buckets' views, on a rebuild).
    at::NoGradGuard noGrad;
    for (size_t i = 0; i < params_.size(); ++i) {
      at::Tensor& grad = params_[i].tensor.mutable_grad();
      if (!grad.defined()) continue;
      viewOf(i).copy_(grad);
      grad = viewOf(i);
    }
  }
  if (log::enabled(log::Level::Info)) {
    std::string sizes;
    for (const auto& b : buckets_) {
      sizes += fmt::format("{}{:.2f} MiB ({} tensors)", sizes.empty() ? "" : ", ",
                           b.numel * c10::elementSize(b.dtype) / 1048576.0, b.params.size());
    }
    DTRAIN_LOG(Info, "DDP: {} parameters in {} buckets: {}", params_.size(), buckets_.size(),
               sizes);
  }
}

void Reducer::installHooks() {
  for (size_t i = 0; i < params_.size(); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(params_[i].tensor);
    DTRAIN_CHECK(accumulator != nullptr,
                 "DistributedDataParallel: parameter {} has no gradient accumulator (is it a leaf "
                 "tensor that requires grad?)",
                 params_[i].name);
    hookKeys_.push_back(
        compat::addAccumulatorPostHook(accumulator, [this, i] { onGradientReady(i); }));
    accumulators_.push_back(std::move(accumulator));
  }
}

std::vector<std::vector<std::string>> Reducer::bucketNames() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : buckets_) {
    out.emplace_back();
    for (size_t i : b.params) out.back().push_back(params_[i].name);
  }
  return out;
}

void Reducer::arm(const std::vector<at::Tensor>& outputs) {
  std::lock_guard<std::mutex> lock(mutex_);
  ddp::checkPreviousPassEnded(callbackQueued_, group_->rank(), "DistributedDataParallel",
                              nextBucket_, buckets_.size(), "bucket allreduces");
  bool rearm = state_ == State::Armed;
  state_ = State::Armed;
  if (options_.findUnusedParameters) unused_.search(outputs, accumulators_, rearm);
}

void Reducer::disarm() {
  std::lock_guard<std::mutex> lock(mutex_);
  state_ = State::Local;
  unused_.clear();
}

void Reducer::onGradientReady(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto now = Clock::now();
  if (state_ != State::Armed) {
    if (state_ == State::Local) {
      if (params_[index].tensor.grad().defined()) usedLocally_[index] = 1;
    } else if (!warnedUnexpected_) {
      warnedUnexpected_ = true;
      warnBackwardWithoutForward("DistributedDataParallel", group_->rank());
    }
    return;
  }
  if (!callbackQueued_) {
    callbackQueued_ = true;
    uint64_t iteration = stats_.iteration;
    stats_ = DdpIterationStats{};
    stats_.iteration = iteration;
    stats_.firstGradient = now;
    compat::queueEngineCallback([this] { finalizeBackward(); });
    for (size_t u : unused_.unused()) markReadyLocked(u, false);
  }
  stats_.lastGradient = now;
  if (!rebuilt_ && !ready_[index]) arrival_.push_back(index);
  if (ready_[index]) {
    throwGradientTwice("DistributedDataParallel", group_->rank(), params_[index].name,
                       options_.findUnusedParameters);
  }
  markReadyLocked(index, true);
}

void Reducer::markReadyLocked(size_t index, bool hookFired) {
  ready_[index] = 1;
  at::Tensor& view = viewOf(index);
  at::Tensor& param = params_[index].tensor;
  const at::Tensor& grad = param.grad();
  {
    at::NoGradGuard noGrad;
    if (grad.defined()) {
      DTRAIN_CHECK(!grad.is_sparse(),
                   "DistributedDataParallel: parameter {} has a sparse gradient; only dense "
                   "gradients are supported. HINT: use a dense embedding (sparse=false)",
                   params_[index].name);
      if (hookFired) usedLocally_[index] = 1;
      // See Note [Averaging]: the division is part of the allreduce, or done here.
      const bool averaged = buckets_[slots_[index].bucket].averagedByAllreduce;
      if (grad.data_ptr() == view.data_ptr()) {
        if (!averaged) view.mul_(divisor_);
      } else {
        if (averaged) {
          view.copy_(grad);
        } else {
          at::mul_out(view, grad, divisor_);
        }
        if (options_.gradientAsBucketView && hookFired) param.mutable_grad() = view;
      }
      if (hookFired && !poisonedThisPass_) {
        if (const auto* f = nanGradFault(group_->rank(), stats_.iteration, /*after=*/false)) {
          poison(view, *f);  // enters the allreduce, so every rank gets it
          poisonedThisPass_ = true;
          DTRAIN_LOG(Warn, "rank {}: DTRAIN_FAULT {}: poisoned {} before the allreduce",
                     group_->rank(), f->describe(), params_[index].name);
        }
      }
    } else {
      view.zero_();
    }
  }
  Bucket& bucket = buckets_[slots_[index].bucket];
  if (--bucket.pending == 0) launchReadyBucketsLocked();
}

void Reducer::launchReadyBucketsLocked() {
  comm::CallOptions call;
  call.stream = compat::currentStream(group_->device());
  call.timeout = options_.timeout;
  while (nextBucket_ < buckets_.size() && buckets_[nextBucket_].pending == 0) {
    Bucket& b = buckets_[nextBucket_++];
    stats_.bucketLaunched.push_back(Clock::now());
    at::Tensor& travels = b.wire.defined() ? b.wire : b.flat;
    if (b.wire.defined()) b.wire.copy_(b.flat);
    b.work = comm_.allreduceAsync(
        travels.data_ptr(), static_cast<size_t>(b.numel), toDataType(travels),
        b.averagedByAllreduce ? comm::ReduceOp::Avg : comm::ReduceOp::Sum, call);
  }
  if (nextBucket_ == buckets_.size() && options_.findUnusedParameters && !usedWork_) {
    auto host = at::from_blob(usedLocally_.data(), {static_cast<int64_t>(usedLocally_.size())},
                              at::kChar);
    usedMap_.copy_(host);
    usedWork_ = comm_.allreduceAsync(usedMap_.data_ptr(), usedLocally_.size(),
                                     comm::DataType::Int32, comm::ReduceOp::Sum, call);
  }
}

void Reducer::finalizeBackward() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.backwardEnd = Clock::now();
  std::vector<size_t> missing = finishPass(
      [this](std::vector<size_t>& out) { finalizeLocked(out); }, [this] { resetPassLocked(); });
  if (missing.empty() && !rebuilt_) {
    rebuilt_ = true;
    rebuildBucketsLocked();
  }
  if (missing.empty()) return;
  throwNoGradient("DistributedDataParallel", group_->rank(), missing.size(), params_.size(),
                  namesOf(params_, missing), options_.findUnusedParameters);
}

void Reducer::finalizeLocked(std::vector<size_t>& missing) {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!ready_[i]) missing.push_back(i);
  }
  // See Note [DDP backward]: launch what is left so that the ranks' collectives line up.
  for (size_t i : missing) markReadyLocked(i, false);
  // Bucket by bucket, so that writing one back overlaps with the later ones' allreduces.
  // With findUnusedParameters, parameters this rank did not use wait for the used map: whether
  // another rank used them decides whether their .grad is touched.
  bool deferUnused = options_.findUnusedParameters;
  std::chrono::nanoseconds waited{0};
  // The end-of-backward callback's current stream, which the write-back below runs on (comm.h:
  // waitOnStream).
  void* stream = compat::currentStream(group_->device());
  for (auto& bucket : buckets_) {
    auto start = Clock::now();
    bucket.work->waitOnStream(stream, options_.timeout);
    waited += Clock::now() - start;
    bucket.work.reset();
    if (!missing.empty()) continue;
    at::NoGradGuard noGrad;
    if (bucket.wire.defined()) bucket.flat.copy_(bucket.wire);
    for (size_t entry = 0; entry < bucket.params.size(); ++entry) {
      size_t i = bucket.params[entry];
      if (!deferUnused || usedLocally_[i]) writeBackLocked(i, bucket.views[entry]);
    }
  }
  if (usedWork_) {
    auto start = Clock::now();
    usedWork_->waitOnStream(stream, options_.timeout);
    waited += Clock::now() - start;
    if (missing.empty()) {
      at::NoGradGuard noGrad;
      at::Tensor used = usedMap_.cpu();
      for (size_t i = 0; i < params_.size(); ++i) {
        // No rank used it: .grad stays as it was (PyTorch's semantics).
        if (!usedLocally_[i] && used.data_ptr<int32_t>()[i] > 0) writeBackLocked(i, viewOf(i));
      }
    }
  }
  if (missing.empty()) {
    if (const auto* f = nanGradFault(group_->rank(), stats_.iteration, /*after=*/true)) {
      for (auto& p : params_) {
        at::Tensor grad = p.tensor.grad();
        if (!grad.defined()) continue;
        at::NoGradGuard noGrad;
        poison(grad, *f);  // this rank alone: the allreduce is over
        DTRAIN_LOG(Warn, "rank {}: DTRAIN_FAULT {}: poisoned {} after the allreduce",
                   group_->rank(), f->describe(), p.name);
        break;
      }
    }
  }
  stats_.waited = waited;
  stats_.finished = Clock::now();
  ++stats_.iteration;
}

void Reducer::rebuildBucketsLocked() {
  const size_t n = params_.size();
  // This rank's arrival order, then whatever did not arrive in reverse registration order.
  std::vector<int64_t> order;
  std::vector<char> seen(n, 0);
  for (size_t i : arrival_) {
    if (!seen[i]) order.push_back(static_cast<int64_t>(i));
    seen[i] = 1;
  }
  for (size_t i = n; i-- > 0;) {
    if (!seen[i]) order.push_back(static_cast<int64_t>(i));
  }
  arrival_.clear();
  arrival_.shrink_to_fit();
  // Rank 0's order, so that every rank buckets and launches alike.
  at::Tensor shared = at::tensor(order, at::TensorOptions().dtype(at::kLong)).to(group_->device());
  group_->broadcast(shared, 0);
  shared = shared.cpu();
  std::vector<size_t> walk(n);
  std::vector<char> hit(n, 0);
  for (size_t k = 0; k < n; ++k) {
    const int64_t i = shared.data_ptr<int64_t>()[k];
    DTRAIN_CHECK(i >= 0 && static_cast<size_t>(i) < n && !hit[i],
                 "rank {}: DistributedDataParallel: rank 0's gradient order is not a permutation "
                 "of the {} parameters (entry {} is {})",
                 group_->rank(), n, k, i);
    hit[i] = 1;
    walk[k] = static_cast<size_t>(i);
  }
  auto assignment = assignBucketsInOrder(bucketInputs(), walk, options_.firstBucketBytes,
                                         options_.bucketBytes);
  std::vector<std::vector<size_t>> current;
  for (const auto& b : buckets_) current.push_back(b.params);
  if (assignment == current) {
    DTRAIN_LOG(Info, "DDP: gradients arrived in bucket order; buckets kept");
    return;
  }
  std::vector<Bucket> old = std::move(buckets_);  // alive until the gradients have moved over
  buildBuckets(assignment);
  DTRAIN_LOG(Info,
             "DDP: buckets rebuilt in the order the gradients arrived (rank 0's): {} "
             "buckets, the first holds {}",
             buckets_.size(), namesOf(params_, buckets_.front().params, 4));
}

void Reducer::writeBackLocked(size_t index, const at::Tensor& view) {
  at::Tensor& grad = params_[index].tensor.mutable_grad();
  if (options_.gradientAsBucketView) {
    if (!grad.defined() || grad.data_ptr() != view.data_ptr()) grad = view;
  } else if (grad.defined()) {
    grad.copy_(view);
  } else {
    grad = view.clone();
  }
}

void Reducer::resetPassLocked() {
  state_ = State::Idle;
  callbackQueued_ = false;
  std::fill(ready_.begin(), ready_.end(), 0);
  std::fill(usedLocally_.begin(), usedLocally_.end(), 0);
  poisonedThisPass_ = false;
  nextBucket_ = 0;
  for (auto& bucket : buckets_) {
    bucket.pending = bucket.params.size();
    bucket.work.reset();
  }
  usedWork_.reset();
  unused_.clear();
}

}  // namespace dtrain::ddp
