#include "shard_group.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/optim/optimizer.h>

#include "../ddp/nan_grad_fault.h"
#include "../torch_compat.h"
#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"

// Note [Accumulating into the shard]
// Gradients accumulate until zero_grad(), as with any libtorch optimizer: a second synchronising
// backward before step() adds its average to the shard's gradient S (under noSync() with the
// default accumulation, every micro-batch's backward does).
//   Stage 1: each unit's reduce-scatter computes (sum over ranks of block r) / N, so S is folded
//   into this rank's own block as N S before the collective: (N S + sum of the ranks' new
//   gradients) / N = S + their average; when S is zero -- zero_grad() each step -- the result is
//   bitwise the average DDP's allreduce computes. The block is S itself (the reduce-scatter runs
//   in place), and the other blocks hold
//   this rank's share of the last reduce-scatter's input. Before the first gradient of the next
//   backward is accumulated (a pre-hook on the gradient accumulators, so also when that backward
//   is a noSync() one), the other blocks are zeroed and S multiplied by N: one pass over the
//   buffer, what zero_grad() costs DDP.
//   Stages 2 and 3: when S holds a gradient, the reduce-scatter writes the bucket's own block in
//   place and that average is added to S once it has arrived (S + the ranks' average, the same
//   arithmetic whichever rank owns an element, so stage 2 and stage 3 agree bitwise whatever
//   their units); when it holds none, it writes S directly. With master weights S is the float32
//   master gradient, and the reduce-scatter's result is added to it afterwards likewise.
// A shard whose gradient zero_grad() unset (libtorch 2.x) counts as zero and gets it back.
//
// Note [Gradients wider than the parameters]
// A unit whose parameters are 16-bit and whose gradients are reduced in float32
// (ZeroOptions::paramDtype with a float32 reduceDtype, FSDP2's MixedPrecisionPolicy(bfloat16,
// float32)) would hold a float32 bucket -- twice its parameters' bytes -- from its first
// gradient, through the rest of its backward, while the activations of that backward are still
// alive. Instead fill() leaves each gradient as autograd made it, in the parameter's dtype, in
// its .grad, and fillDeferred() -- once the unit's last gradient is in and a stage-3 unit has
// been resharded -- leases the bucket and copies them all into it, converting, before the
// unit's reduce-scatter is launched: during the unit's backward it holds its gradients in 16
// bits, half the bucket, as FSDP2 does (its foreach_reduce copies the unit's gradients into the
// float32 reduce-scatter input after its backward and the reshard). The values are the same
// bitwise: the conversion is exact either way. train_gpt's small preset with --amp at batch 8
// per rank: the peak per rank 5.5 MiB (2.4 %) lower (gpt_bench), the step time unchanged (A/B).

// Note [Gradient buckets of stage 2]
// A stage-2 unit's full gradients exist only from its first gradient of a synchronising backward
// to the end of its reduce-scatter: each gradient autograd hands over is copied into a bucket and
// the parameter's .grad released. Buckets come from a pool and go back to it; when
// ZeroOptions::bucketsInFlight of them are out and another unit needs one, backward waits for the
// oldest reduce-scatter first (when one is running; otherwise the pool grows), so the full-size
// gradient memory stays a few units whatever the model's size. A bucket goes back when its
// reduce-scatter is finished there (or at the end of backward), not as soon as the collective is
// over: so which buffers a step takes does not depend on how fast its collectives ran, and on the
// CPU the communicator's cache (Note [Communication buffers of a step] in collectives.h) sees the
// same requests every step -- a bucket returned early in one step, idle at a trim, would be freed
// and touched fresh again in the next slower step.

// Note [Buckets back before the next prefetch]
// Stage 3 on the CPU, where a buffer given back to the communicator serves the next request
// (Note [Communication buffers of a step] in collectives.h), and a communicator runs its
// collectives one at a time in issue order (runtime/comm/collective_queue.h). While unit k
// computes its backward, three units' buffers are needed: unit k gathered, unit k-1 arriving
// (the prefetch), and the bucket of unit k+1, whose reduce-scatter overlaps that compute. Two
// more used to join them: unit k's own bucket, leased at its first gradient while its gathered
// parameters were still alive, and the bucket of unit k+2, held until a later lease waited for
// it -- four units' buffers and autograd's gradient at the peak, where PyTorch's FSDP2
// (foreach_reduce frees the gathered parameters before the reduce-scatter's copy-in, and waits
// for each reduce-scatter on the CPU) holds three. Three rules, none of which waits for more
// than backward waits for anyway:
//   - a resharded unit's gradients stay in .grad, as autograd made them, until its last one is
//     in; then the reshard gives its gathered buffer back and the bucket takes it (fill()
//     deferred as in Note [Gradients wider than the parameters]). The same copies, made when
//     the reduce-scatter could start anyway;
//   - before backward prefetches the next unit, unshard() waits for unit k's own all-gather --
//     which it would wait for next anyway -- and finishes the reduce-scatters issued before it,
//     over by then; their buckets go back and the prefetched unit takes one;
//   - a unit's bucket is leased once the reduce-scatters issued before the prefetched unit's
//     all-gather are over: backward waits for that all-gather right after, and it runs after
//     them. So one bucket is leased at a time (two for the last unit of backward, which
//     prefetches nothing), bucketsInFlight or not, and the shard gradient the new
//     reduce-scatter writes -- allocated while autograd still holds the unit's last gradient --
//     no longer meets a second bucket.
// Which buffers a step holds does not depend on how fast its collectives ran. zero_peer_bench's
// 4.7M MLP at 2 ranks: 12.0 MiB of buffers at the most instead of 16.0, the peak per rank
// 47.85 MiB (51.85 before) against FSDP2's 49.72-51.79; the step the same (A/B in
// benchmarks/README.md). On a device the pools keep their own free buffers, so a bucket cannot
// take a gathered unit's memory, and the streams' order is not the host's: none applies there.

namespace dtrain::zero {

namespace {

const char* gradsName(ShardGroup::Grads s) {
  switch (s) {
    case ShardGroup::Grads::Empty: return "empty";
    case ShardGroup::Grads::Accumulating: return "accumulating";
    case ShardGroup::Grads::Reducing: return "reducing";
    case ShardGroup::Grads::Reduced: return "reduced";
  }
  return "?";
}

const char* paramsName(ShardGroup::Params s) {
  switch (s) {
    case ShardGroup::Params::Gathered: return "gathered";
    case ShardGroup::Params::Stepped: return "stepped";
    case ShardGroup::Params::Gathering: return "gathering";
    case ShardGroup::Params::Free: return "free (sharded)";
  }
  return "?";
}

}  // namespace

ShardGroup::ShardGroup(std::shared_ptr<ProcessGroup> group, ShardLayout layout,
                       std::vector<std::unique_ptr<ShardUnit>> units, std::vector<size_t> unitGroup,
                       const ZeroOptions& options, ShardLayout frozenLayout)
    : group_(std::move(group)),
      comm_(group_->communicator()),
      layout_(std::move(layout)),
      frozenLayout_(std::move(frozenLayout)),
      units_(std::move(units)),
      unitGroup_(std::move(unitGroup)),
      options_(options),
      grads_(units_.size(), options.stage == 1 ? Grads::Reduced : Grads::Empty),
      params_(units_.size(), Params::Gathered),
      reduceWork_(units_.size()),
      reduceInto_(units_.size()),
      gatherWork_(units_.size()),
      reduceIssued_(units_.size(), 0),
      gatherIssued_(units_.size(), 0),
      // Note [Communication buffers of a step]: host memory goes back to the communicator.
      pool_(comm_, /*keepFree=*/!group_->device().is_cpu()),
      paramPool_(comm_, /*keepFree=*/!group_->device().is_cpu()),
      gathers_(units_.size(), 0),
      modules_(units_.size()),
      forwardOrder_(units_.size()),
      backwardOrder_(units_.size()),
      releasesOf_(units_.size()) {
  DTRAIN_CHECK(units_.size() == layout_.units.size() + frozenLayout_.units.size(),
               "ZeRO: {} units for {} trained and {} frozen ones", units_.size(),
               layout_.units.size(), frozenLayout_.units.size());
  for (size_t k = 0; k < units_.size(); ++k) {
    if (units_[k]->resharded()) params_[k] = Params::Free;  // the unit was built sharded
  }
}

ShardGroup::~ShardGroup() {
  // Collectives still running write into the units' memory: wait for them before it goes.
  for (auto* works : {&reduceWork_, &gatherWork_}) {
    for (auto& work : *works) {
      if (!work) continue;
      try {
        work->wait(options_.timeout);
      } catch (const std::exception& e) {
        DTRAIN_LOG(Debug, "ZeRO: a pending collective failed at shutdown: {}", e.what());
      }
    }
  }
}

comm::CallOptions ShardGroup::call() const {
  comm::CallOptions c;
  c.stream = compat::currentStream(group_->device());
  c.timeout = options_.timeout;
  return c;
}

void ShardGroup::openAccumulation() {
  if (stage() != 1) return;
  at::NoGradGuard noGrad;
  const int64_t n = group_->size();
  const int64_t r = group_->rank();
  for (size_t k = 0; k < units_.size(); ++k) {
    ShardUnit& u = *units_[k];
    DTRAIN_CHECK(grads_[k] == Grads::Reduced,
                 "rank {}: ZeRO: {} is {}, not reduced, when a new "
                 "accumulation opens",
                 r, u.describe(), gradsName(grads_[k]));
    const int64_t s = u.shardNumel();
    if (u.hasMaster()) {
      u.fullGrads().zero_();
    } else {
      u.fullGrads().narrow(0, 0, r * s).zero_();
      u.fullGrads().narrow(0, (r + 1) * s, u.paddedNumel() - (r + 1) * s).zero_();
      if (u.shardGradAttached()) {
        u.reduced().mul_(static_cast<double>(n));  // see Note [Accumulating into the shard]
      } else {
        u.reduced().zero_();
        u.attachShardGrad();
      }
    }
    grads_[k] = Grads::Accumulating;
  }
}

void ShardGroup::abandonAccumulation() {
  if (stage() != 1) return;
  for (size_t k = 0; k < units_.size(); ++k) {
    DTRAIN_CHECK(grads_[k] == Grads::Accumulating || grads_[k] == Grads::Reduced,
                 "rank {}: ZeRO: {} is {} when its accumulation is dropped", group_->rank(),
                 units_[k]->describe(), gradsName(grads_[k]));
    grads_[k] = Grads::Reduced;
  }
}

void ShardGroup::dropShardGradient(size_t k, size_t j) {
  ShardUnit& u = *units_[k];
  if (!u.shardGradAttached()) return;
  const int64_t s = u.shardNumel();
  const int64_t mine = group_->rank() * s;
  const int64_t first = u.layout().offsets[j];
  const int64_t begin = std::max(mine, first);
  const int64_t end = std::min(mine + s, first + u.params()[j].param.numel());
  if (begin >= end) return;
  at::NoGradGuard noGrad;
  u.shardGrad().narrow(0, begin - mine, end - begin).zero_();
}

void ShardGroup::lease(size_t k) {
  // See Note [Gradient buckets of stage 2].
  ShardUnit& u = *units_[k];
  const size_t bytes = u.paddedNumel() * c10::elementSize(u.gradType());
  // See Note [Buckets back before the next prefetch]
  if (stage() == 3 && buffersBackInOrder() && prefetched_ != UnitOrder::kNone &&
      params_[prefetched_] == Params::Gathering) {
    finishReducesBefore(prefetched_);
  }
  auto bucket = pool_.takeFree(bytes);
  while (!bucket && pool_.leased() >= static_cast<size_t>(std::max(1, options_.bucketsInFlight)) &&
         !reducing_.empty()) {
    finishReduce(reducing_.front());
    bucket = pool_.takeFree(bytes);
  }
  if (!bucket) bucket = pool_.allocate(bytes);
  u.leaseGrads(std::move(bucket));
}

void ShardGroup::finishReducesBefore(size_t k) {
  while (!reducing_.empty() && reduceIssued_[reducing_.front()] < gatherIssued_[k]) {
    finishReduce(reducing_.front());
  }
}

bool ShardGroup::defersFill(size_t k) const {
  const ShardUnit& u = *units_[k];
  if (stage() == 1) return false;
  if (c10::elementSize(u.gradType()) > c10::elementSize(u.dtype())) return true;
  // See Note [Buckets back before the next prefetch]
  return stage() == 3 && u.resharded() && buffersBackInOrder();
}

void ShardGroup::fill(size_t k, size_t j, const fault::Fault* poison) {
  if (!defersFill(k)) {
    copyIn(k, j, poison);
    return;
  }
  // See Note [Gradients wider than the parameters].
  DTRAIN_CHECK(grads_[k] == Grads::Empty,
               "rank {}: ZeRO: a gradient of {} arrived while its unit is {}", group_->rank(),
               units_[k]->params()[j].name, gradsName(grads_[k]));
  if (poison != nullptr) {
    deferredPoison_ = poison;
    poisonUnit_ = k;
    poisonSlot_ = j;
  }
}

void ShardGroup::fillDeferred(size_t k) {
  if (!defersFill(k)) return;
  for (size_t j = 0; j < units_[k]->params().size(); ++j) {
    const bool poisoned = deferredPoison_ != nullptr && poisonUnit_ == k && poisonSlot_ == j;
    copyIn(k, j, poisoned ? deferredPoison_ : nullptr);
    if (poisoned) deferredPoison_ = nullptr;
  }
}

void ShardGroup::copyIn(size_t k, size_t j, const fault::Fault* poison) {
  ShardUnit& u = *units_[k];
  if (stage() != 1 && grads_[k] == Grads::Empty) {
    lease(k);
    grads_[k] = Grads::Accumulating;
  }
  DTRAIN_CHECK(grads_[k] == Grads::Accumulating,
               "rank {}: ZeRO: a gradient of {} arrived while "
               "its unit is {}",
               group_->rank(), u.params()[j].name, gradsName(grads_[k]));
  at::NoGradGuard noGrad;
  at::Tensor& view = u.gradView(j);
  at::Tensor& grad = u.params()[j].param.mutable_grad();
  const bool avg = averagedByCollective(u.gradType());
  const double inv = 1.0 / group_->size();
  if (stage() == 1) {
    // The gradient is the view already, unless something replaced .grad (libtorch 2.x's
    // Module::zero_grad() unsets it): then autograd made a new one, which moves in.
    if (!grad.defined()) {
      view.zero_();
    } else if (grad.data_ptr() != view.data_ptr()) {
      view.copy_(grad);
    }
    grad = view;
    if (!avg) view.mul_(inv);
  } else {
    if (!grad.defined()) {
      view.zero_();
    } else if (avg) {
      view.copy_(grad);
    } else {
      at::mul_out(view, grad, at::scalar_tensor(inv, grad.options().dtype(at::kDouble)));
    }
    grad = at::Tensor();  // the full gradient lives on in the bucket only
  }
  if (poison != nullptr) {
    ddp::poison(view, *poison);  // enters the reduce-scatter: lands in one rank's shard
    DTRAIN_LOG(Warn, "rank {}: DTRAIN_FAULT {}: poisoned {} before the reduce-scatter",
               group_->rank(), poison->describe(), u.params()[j].name);
  }
}

at::Tensor ShardGroup::addedLater(size_t k) {
  ShardUnit& u = *units_[k];
  if (stage() == 1 || !u.gradInReduced() || !u.shardGradAttached()) return {};
  const int64_t s = u.shardNumel();
  return u.fullGrads().narrow(0, group_->rank() * s, s);
}

void ShardGroup::launchReduce(size_t k) {
  DTRAIN_CHECK(grads_[k] == Grads::Accumulating,
               "rank {}: ZeRO: reduce-scatter of {}, which is "
               "{}",
               group_->rank(), units_[k]->describe(), gradsName(grads_[k]));
  units_[k]->ensureReduced();
  reduceInto_[k] = addedLater(k);  // see Note [Accumulating into the shard]
  reduceWork_[k] = reduceScatterUnit(comm_, *units_[k], call(), reduceInto_[k]);
  reduceIssued_[k] = ++issued_;
  grads_[k] = Grads::Reducing;
  reducing_.push_back(k);
}

std::chrono::nanoseconds ShardGroup::finishReduce(size_t k) {
  ShardUnit& u = *units_[k];
  DTRAIN_CHECK(grads_[k] == Grads::Reducing && !reducing_.empty() && reducing_.front() == k,
               "rank {}: ZeRO: waiting for the reduce-scatter of {}, which is {}", group_->rank(),
               u.describe(), gradsName(grads_[k]));
  const auto start = std::chrono::steady_clock::now();
  reducing_.pop_front();
  auto work = std::move(reduceWork_[k]);
  work->waitOnStream(compat::currentStream(group_->device()), options_.timeout);
  const auto waited = std::chrono::steady_clock::now() - start;
  at::NoGradGuard noGrad;
  if (u.hasMaster() && !u.gradInReduced()) {
    u.takeReduced();
  } else if (reduceInto_[k].defined()) {
    u.reduced().add_(reduceInto_[k]);  // the shard's gradient + this backward's average
    reduceInto_[k] = at::Tensor();
  } else if (!u.shardGradAttached()) {
    u.attachShardGrad();
  }
  u.letGoOfGradient();
  if (stage() != 1) {
    pool_.give(u.returnGrads());
    grads_[k] = Grads::Empty;
  } else {
    grads_[k] = Grads::Reduced;
  }
  return waited;
}

void ShardGroup::checkSteppable() const {
  for (size_t k = 0; k < units_.size(); ++k) {
    const bool ready = grads_[k] == (stage() == 1 ? Grads::Reduced : Grads::Empty) &&
                       !localGradients_;
    const Params rest = units_[k]->resharded() ? Params::Free : Params::Gathered;
    DTRAIN_CHECK(ready && params_[k] == rest,
                 "rank {}: ShardedOptimizer::step(): {} is {} (gradients) and {} (parameters): "
                 "its gradients of this step are not averaged yet. HINT: the last micro-batch's "
                 "forward and backward must run outside noSync(), and step() after backward() "
                 "has returned",
                 group_->rank(), units_[k]->describe(), gradsName(grads_[k]),
                 paramsName(params_[k]));
  }
}

void ShardGroup::stepUnit(size_t k) {
  ShardUnit& u = *units_[k];
  const Params rest = u.resharded() ? Params::Free : Params::Gathered;
  DTRAIN_CHECK(params_[k] == rest, "rank {}: ZeRO: step of {}, which is {}", group_->rank(),
               u.describe(), paramsName(params_[k]));
  u.optimizer().step();
  shardWritten(k);
}

void ShardGroup::shardWritten(size_t k) {
  ShardUnit& u = *units_[k];
  const Params rest = u.resharded() ? Params::Free : Params::Gathered;
  DTRAIN_CHECK(params_[k] == rest, "rank {}: ZeRO: {} is {}, not {}, when its shard is written",
               group_->rank(), u.describe(), paramsName(params_[k]), paramsName(rest));
  if (u.hasMaster() && u.ownedParams().defined()) {  // a converted unit rounds at its gathers
    at::NoGradGuard noGrad;
    u.ownedParams().copy_(u.master());  // offload: from the host's memory, per unit
  }
  // A resharded unit's owned block is all it has: the next unshard gathers the new values.
  if (!u.resharded()) params_[k] = Params::Stepped;
}

namespace {

const char* whyName(ShardGroup::Why why) {
  switch (why) {
    case ShardGroup::Why::Forward: return "forward";
    case ShardGroup::Why::Backward: return "backward";
    case ShardGroup::Why::Full: return "full";
  }
  return "?";
}

}  // namespace

bool ShardGroup::unshard(size_t k, Why why, const std::string& module) {
  ShardUnit& u = *units_[k];
  DTRAIN_CHECK(u.resharded() || params_[k] == Params::Gathered,
               "rank {}: ZeRO-3: gathering {}, "
               "which is {}",
               group_->rank(), u.describe(), paramsName(params_[k]));
  if (modules_[k].empty()) modules_[k] = module;
  if (why == Why::Backward && !inBackward_) {
    inBackward_ = true;
    forwardOrder_.finishRecording();
  }
  const bool mine = params_[k] != Params::Gathered;
  if (params_[k] == Params::Free) issueUnitGather(k, why, /*prefetch=*/false);
  // Note [Prefetching units]: the next unit's all-gather goes out before this one is waited for.
  // A forward gather inside backward (a recompute) neither records nor prefetches.
  UnitOrder* order = why == Why::Backward                  ? &backwardOrder_
                     : why == Why::Forward && !inBackward_ ? &forwardOrder_
                                                           : nullptr;
  const size_t next = order ? order->needed(k) : UnitOrder::kNone;
  const bool prefetch = why == Why::Backward ? options_.backwardPrefetch : options_.forwardPrefetch;
  if (prefetch && next != UnitOrder::kNone && params_[next] == Params::Free) {
    if (why == Why::Backward && buffersBackInOrder()) {
      // See Note [Buckets back before the next prefetch]
      if (params_[k] == Params::Gathering) waitUnitGather(k, why);
      finishReducesBefore(k);
    }
    issueUnitGather(next, why, /*prefetch=*/true);
  }
  if (params_[k] == Params::Gathering) waitUnitGather(k, why);
  return mine;
}

void ShardGroup::issueUnitGather(size_t k, Why why, bool prefetch) {
  ShardUnit& u = *units_[k];
  const size_t bytes = u.paddedNumel() * c10::elementSize(u.dtype());
  auto buffer = paramPool_.takeFree(bytes);
  if (!buffer) buffer = paramPool_.allocate(bytes);
  gatheredNow_ += bytes;
  gatheredPeak_ = std::max(gatheredPeak_, gatheredNow_);
  u.holdFull(std::move(buffer));
  params_[k] = Params::Gathering;
  gatherIssued_[k] = ++issued_;
  comm::CallOptions labelled = call();  // Note [Which unit is gathered]
  labelled.label = fmt::format("unit {} {} {} ({})", k, whyName(why), ++gathers_[k], modules_[k]);
  labelled.check = true;
  ++counts_.gathers;
  if (prefetch) ++counts_.prefetched;
  if (prefetch && why == Why::Backward) prefetched_ = k;
  inUnitTerms(k, why, [&] { gatherWork_[k] = allgatherUnit(comm_, u, labelled); });
}

at::Tensor ShardGroup::gatherMaster(size_t k) {
  ShardUnit& u = *units_[k];
  DTRAIN_CHECK(u.converted(), "rank {}: ZeRO-3: {} keeps no master of its parameters' values",
               group_->rank(), u.describe());
  const at::Tensor send = u.master().to(group_->device()).contiguous();
  at::Tensor full = at::empty({u.paddedNumel()}, send.options());
  comm::CallOptions labelled = call();  // Note [Which unit is gathered]
  labelled.label = fmt::format("unit {} master ({})", k, u.describe());
  labelled.check = true;
  inUnitTerms(k, Why::Full, [&] {
    comm_.allgather(send.data_ptr(), full.data_ptr(), static_cast<size_t>(u.shardNumel()),
                    toDataType(send), labelled);
  });
  return full;
}

void ShardGroup::waitUnitGather(size_t k, Why why) {
  inUnitTerms(k, why, [&] { counts_.waited += finishGather(k); });
}

template <typename Step>
void ShardGroup::inUnitTerms(size_t k, Why why, Step&& step) {
  try {
    step();
  } catch (const InvalidArgument& e) {  // the check, here or on a peer that aborted first
    gatherFailed<InvalidArgument>(e, k, why);
  } catch (const TimeoutError& e) {
    gatherFailed<TimeoutError>(e, k, why);
  } catch (const NetworkError& e) {
    gatherFailed<NetworkError>(e, k, why);
  } catch (const Error& e) {
    gatherFailed<Error>(e, k, why);
  }
}

template <typename E>
void ShardGroup::gatherFailed(const E& error, size_t k, Why why) const {
  DTRAIN_THROW(E,
               "rank {}: ZeRO-3: gathering {} for its {} failed: {}. HINT: every rank must "
               "run the same sharded units' forward and backward, in the same order (where the "
               "ranks name different units, one did not); an evaluation loop that runs more "
               "batches on one rank than on another does not (give every rank the same number "
               "of batches, as DistributedSampler does by padding)",
               group_->rank(), modules_[k], whyName(why), error.what());
}

void ShardGroup::reshard(size_t k) {
  ShardUnit& u = *units_[k];
  DTRAIN_CHECK(params_[k] == Params::Gathered && u.resharded(),
               "rank {}: ZeRO-3: freeing {}, "
               "which is {}",
               group_->rank(), u.describe(), paramsName(params_[k]));
  gatheredNow_ -= u.paddedNumel() * c10::elementSize(u.dtype());
  paramPool_.give(u.releaseFull());
  params_[k] = Params::Free;
}

void ShardGroup::gradientsComplete(size_t k) {
  if (units_[k]->resharded() && params_[k] == Params::Gathered) reshard(k);
  for (size_t r : releasesOf_[k]) {
    FrozenRelease& release = releases_[r];
    if (!release.armed || release.trainedLeft == 0) continue;
    --release.trainedLeft;
    tryFrozenRelease(r);
  }
}

size_t ShardGroup::addFrozenRelease(std::vector<size_t> frozen, std::vector<size_t> trained) {
  const size_t id = releases_.size();
  for (size_t k : frozen) {
    DTRAIN_CHECK(k < units_.size() && units_[k]->frozen(), "ZeRO-3: unit {} is not frozen", k);
  }
  for (size_t k : trained) releasesOf_.at(k).push_back(id);
  FrozenRelease release;
  release.frozen = std::move(frozen);
  release.trained = std::move(trained);
  releases_.push_back(std::move(release));
  return id;
}

void ShardGroup::frozenInputForward(size_t r) { ++releases_.at(r).inputs; }

void ShardGroup::frozenInputBackward(size_t r) {
  FrozenRelease& release = releases_.at(r);
  if (release.inputs > 0) --release.inputs;
  tryFrozenRelease(r);
}

void ShardGroup::armFrozenRelease(size_t r) {
  FrozenRelease& release = releases_.at(r);
  if (release.armed) return;  // a module called twice: its second call's boundary came first
  release.armed = true;
  release.trainedLeft = release.trained.size();
}

void ShardGroup::tryFrozenRelease(size_t r) {
  FrozenRelease& release = releases_[r];
  if (!release.armed || release.inputs > 0 || release.trainedLeft > 0) return;
  release.armed = false;
  for (size_t k : release.frozen) {
    if (params_[k] == Params::Gathering) waitUnitGather(k, Why::Backward);
    if (params_[k] == Params::Gathered) reshard(k);
  }
}

void ShardGroup::backwardEnded() {
  inBackward_ = false;
  prefetched_ = UnitOrder::kNone;
  backwardOrder_.finishRecording();
  for (size_t k = 0; k < units_.size(); ++k) {
    if (!units_[k]->resharded()) continue;
    if (params_[k] == Params::Gathering) waitUnitGather(k, Why::Backward);
    if (params_[k] == Params::Gathered) reshard(k);
  }
  for (FrozenRelease& release : releases_) {  // Note [Frozen units]: the next pass counts anew
    release.armed = false;
    release.inputs = 0;
  }
}

void ShardGroup::trimPools() {
  pool_.trim();
  paramPool_.trim();
  comm_.trimBuffers();
}

ShardGroup::GatherCounts ShardGroup::takeGatherCounts() {
  GatherCounts out = counts_;
  counts_ = {};
  return out;
}

void ShardGroup::launchGather(size_t k) {
  DTRAIN_CHECK(params_[k] == Params::Stepped, "rank {}: ZeRO: all-gather of {}, which is {}",
               group_->rank(), units_[k]->describe(), paramsName(params_[k]));
  gatherWork_[k] = allgatherUnit(comm_, *units_[k], call());
  params_[k] = Params::Gathering;
}

std::chrono::nanoseconds ShardGroup::finishGather(size_t k) {
  DTRAIN_CHECK(params_[k] == Params::Gathering,
               "rank {}: ZeRO: waiting for the all-gather of "
               "{}, which is {}",
               group_->rank(), units_[k]->describe(), paramsName(params_[k]));
  const auto start = std::chrono::steady_clock::now();
  auto work = std::move(gatherWork_[k]);
  work->waitOnStream(compat::currentStream(group_->device()), options_.timeout);
  params_[k] = Params::Gathered;
  return std::chrono::steady_clock::now() - start;
}

void ShardGroup::settleGathers() {
  for (size_t k = units_.size(); k-- > 0;) {
    // A marked unit's gather (stage 3) is a prefetch its use waits for, not a step's.
    if (!units_[k]->resharded() && params_[k] == Params::Gathering) {
      deferredWait_ += finishGather(k);
    }
  }
}

}  // namespace dtrain::zero
