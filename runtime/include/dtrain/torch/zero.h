#pragma once
// ShardedOptimizer: ZeRO stages 1 and 2 (Rajbhandari et al., arXiv:1910.02054) for a module
// trained with dtrain::DistributedDataParallel. Each rank keeps the optimizer state -- and, at
// stage 2, the averaged gradients -- of its own 1/N of the parameters, steps that part with a
// real libtorch optimizer (SGD, Adam, AdamW, RMSprop, Adagrad, built by the factory given), and
// all-gathers the updated parameters, so every rank ends each step with the same full model.
// Per parameter and rank, for float32 Adam: DDP holds 16 bytes, stage 1 8 + 8/N, stage 2
// 4 + 12/N (parameters 4, gradients 4 or 4/N, Adam's moments 8/N).
//
//   auto group = dtrain::init();
//   Net net;
//   dtrain::DistributedDataParallel<Net> ddp(net, group);
//   dtrain::ShardedOptimizer optimizer(
//       ddp, dtrain::optimizerFactory<torch::optim::AdamW>(torch::optim::AdamWOptions(1e-3)));
//   dtrain::GradScaler scaler(group);                 // optional, as with DDP
//   for (auto& batch : *loader) {
//     optimizer.zero_grad();
//     auto loss = loss_fn(ddp(batch.data), batch.target);
//     scaler.scale(loss).backward();   // gradients reduce-scattered into each rank's shard
//     scaler.unscale(optimizer);       // optional: then clip the true gradients
//     dtrain::clipGradNorm(optimizer, 1.0);
//     scaler.step(optimizer);          // each rank steps its shard; parameters all-gathered
//     scaler.update();
//   }
//
// It IS a torch::optim::Optimizer: its param_groups() are the shards this rank steps (their
// .grad the averaged gradients of its shard), with the options of the groups given, so
// GradScaler, LR schedulers and code that sets a group's learning rate take it as they take any
// optimizer. The module's own parameters stay full and equal on every rank (views into the units'
// flat buffers); their .grad is not the averaged gradient under ZeRO (stage 1: the buffers the
// reduce-scatter read, stage 2: a zero placeholder of no memory after a synchronising backward).
//
// Construction is collective: every rank builds it with the same groups. It takes over what
// DDP's backward does with the gradients (DDP's buckets are freed); forwards stay the DDP
// wrapper's (buffers, noSync()). Stage 3: dtrain/torch/fully_shard.h. Design: docs/design.md.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include "dtrain/comm/communicator.h"
#include "dtrain/torch/ddp.h"
#include "dtrain/torch/detail/shard_layout.h"

namespace dtrain {

namespace zero {
class ShardGroup;
class ShardedGradientSync;
class ShardMirror;
}  // namespace zero

// How each rank builds the real optimizer over its shards: the defaults (as a libtorch
// optimizer's constructor takes them) and a function that builds one over parameter groups.
struct OptimizerFactory {
  std::shared_ptr<const torch::optim::OptimizerOptions> defaults;
  std::function<std::unique_ptr<torch::optim::Optimizer>(
      std::vector<torch::optim::OptimizerParamGroup>)>
      make;
};

// The factory of any libtorch optimizer whose constructor takes (param_groups, options):
//   dtrain::optimizerFactory<torch::optim::SGD>(torch::optim::SGDOptions(0.1).momentum(0.9))
template <typename OptimizerType, typename OptionsType>
OptimizerFactory optimizerFactory(const OptionsType& defaults) {
  OptimizerFactory f;
  f.defaults = std::make_shared<OptionsType>(defaults);
  f.make = [defaults](std::vector<torch::optim::OptimizerParamGroup> groups) {
    return std::make_unique<OptimizerType>(std::move(groups), defaults);
  };
  return f;
}

struct ZeroOptions {
  // 1: optimizer state (and master weights) sharded; 2: gradients too; 3: parameters too.
  int stage = 2;
  // Units: the parameters that are reduce-scattered and all-gathered as one flat buffer (Note
  // [Shard layout] in dtrain/torch/detail/shard_layout.h).
  size_t firstUnitBytes = kDefaultFirstUnitBytes;
  size_t unitBytes = kDefaultUnitBytes;
  // Parameters of a lower precision (bfloat16, float16) get float32 master shards: the optimizer
  // steps the master copy and the parameters are its rounding. Parameters already in float32 (or
  // float64) are stepped in place: no copy.
  bool masterWeights = true;
  // Stages 2 and 3, units of a lower precision than their master weights: the dtype their
  // gradients are reduce-scattered in (float32: the ranks' bfloat16 gradients summed without
  // 16-bit rounding, as PyTorch FSDP's MixedPrecision(reduce_dtype=torch.float32); twice the
  // bytes on the wire). Unset: the parameters' own. Units already in float32 are unaffected.
  std::optional<at::ScalarType> reduceDtype;
  // Stage 3, under autocast (FSDP2's MixedPrecisionPolicy(param_dtype=...)): the dtype the float32
  // parameters of marked units (ShardedUnit) are gathered and computed in -- bfloat16 or float16.
  // Their float32 values become master shards that the optimizer steps (masterWeights needed);
  // a rank keeps its master block alone, rounded into each all-gather (half the bytes), and the
  // module's parameters are views of the gathered unit in this dtype. So autocast finds the
  // weights in its own dtype and makes no copy of them: between forward and backward nothing but
  // the gathered unit holds them, freed on reshard (unset, autocast's cast copies, which autograd
  // saves, hold ~2 bytes per parameter of every unit from forward to backward). A marked unit's
  // forward casts a floating input to this dtype (FSDP2's cast_forward_inputs). The root's units
  // stay float32. shardRecords(), checkpoints and gatherFullParameters() give the float32 values.
  std::optional<at::ScalarType> paramDtype;
  // Stages 2 and 3: how many full-size gradient buckets may be waiting for their reduce-scatter
  // before backward waits for the oldest. Stage 3 on the CPU with backwardPrefetch leases one at
  // a time anyway (two for backward's last unit): the reduce-scatters queued before the
  // prefetched unit's all-gather are over by the time backward needs that unit (docs/design.md
  // "Sharding").
  int bucketsInFlight = 2;
  // Overlap unit k's all-gather with unit k+1's optimizer step. Off: one unit after the other.
  bool overlapAllgather = true;
  // step() returns once the last unit's all-gather is issued, without waiting for the ones still
  // running; the DDP wrapper's next forward waits for them before the module runs, so they run
  // while the program prepares its next batch (docs/design.md "Sharding"). So
  // does everything of dtrain that reads the parameters: the next step(), shardRecords(),
  // loadShardState(), a Checkpointer's save and restore. Code that reads the module's
  // parameters itself between step() and that forward -- an EMA copy, an evaluation through the
  // module rather than the wrapper, logging weight norms -- calls waitForParameters() first:
  // until then they are partly the last step's, partly this one's. Off by default.
  bool deferAllgatherWait = false;
  // Stage 3 (docs/design.md "Sharding", Prefetch): once the first step has recorded the order in
  // which the marked units are needed, a unit's gather for backward also issues the all-gather of
  // the unit backward needs next, so it runs while this one computes (FSDP's backward prefetch).
  // forwardPrefetch does the same in forward; off by default: a rank whose forward leaves out a
  // unit the others run is then caught at its missing gradient rather than at once by the units'
  // labels (docs/design.md "Sharding", Which unit is gathered).
  bool backwardPrefetch = true;
  bool forwardPrefetch = false;
  // Stages 2 and 3: CPU offload (DeepSpeed's offload_optimizer, FSDP's CPUOffload). On an
  // accelerator the optimizer state and float32 master shards -- float32 parameters get one
  // too -- live in the host's pinned memory and the real optimizer steps there: each unit's
  // reduce-scattered gradient is copied to the host when it arrives, its new parameter block
  // back to the device after its step. The device keeps the parameters' blocks and their
  // averaged gradients only (stage 3: 2 x 4 / N bytes per float32 parameter, against 16 / N).
  // On a CPU-only job the state is on the host already: accepted, changes nothing.
  bool offload = false;
  // Deadline of the collectives waited for; zero: the communicator's.
  comm::Millis timeout = comm::Millis::zero();
  // Stages 2 and 3 under noSync() (gradient accumulation): where a micro-batch's gradients wait
  // for the step. ReduceScatter (the default): each micro-batch's backward reduce-scatters its
  // gradients into the shard's gradient, as a synchronising backward does (they add up:
  // docs/design.md "Sharding"), so a rank holds its shard's gradient only -- 4 / N bytes per
  // float32 parameter whatever the accumulation, DeepSpeed's ZeRO-2 with gradient accumulation
  // steps -- at one reduce-scatter per micro-batch. Local: they accumulate full-size in the
  // parameters' .grad until the synchronising backward, as under DDP: one reduce-scatter per
  // step, the full gradients held between micro-batches (where bandwidth is scarcer than
  // memory). Stage 1 always accumulates locally, in its units' buffers.
  enum class Accumulation { ReduceScatter, Local };
  Accumulation accumulation = Accumulation::ReduceScatter;
};

// Bytes this rank holds, measured from the tensors' storages (each storage counted once).
struct ZeroMemory {
  // The full parameters (every rank has all of them); stage 3: the owned blocks, and the full
  // parameters of units gathered now. Frozen parameters of marked modules included.
  size_t parameters = 0;
  size_t gradients = 0;       // held between steps: stage 1 full, stage 2 this rank's shard
  size_t masterWeights = 0;   // float32 master shards (lower-precision parameters; offload: all)
  size_t optimizerState = 0;  // the real optimizers' state over this rank's shards
  // Stage 2's full-size gradient buckets (alive only while their reduce-scatter runs, reused
  // by the next backward): communication memory, like DDP's buckets without
  // gradientAsBucketView. On the CPU, the most in use at once over the last step (between steps
  // they wait in the communicator's cache, BufferStats::cachedBytes); on a GPU, those in use and
  // those kept free for the next backward.
  size_t buckets = 0;
  // Gradients of the module's parameters outside the units' buffers: stages 2 and 3's full
  // gradients accumulated under noSync() until the synchronising backward.
  size_t looseGradients = 0;
  // Stage 3: bytes of the full parameters of marked units gathered now (each unit's padded
  // size, while it holds a buffer of the reuse pool), and the most ever gathered at once.
  size_t gathered = 0;
  size_t peakGathered = 0;
  // Stage 3: the buffers gathered units draw from, counted as `buckets` are -- communication
  // memory (docs/design.md, "Communication buffers").
  size_t gatherPool = 0;

  // Offload (ZeroOptions::offload on an accelerator): how many of the bytes above are in the
  // host's memory -- master shards, their gradients, the optimizer state -- plus the pinned
  // buffer each unit's gradient crosses in. Zero on a CPU-only job.
  size_t offloaded = 0;
  // Stage 3: how many of `parameters` are the frozen parameters of marked modules (their owned
  // blocks, ~1/N of them, and their full size while gathered). Frozen parameters of no marked
  // module are not counted: they stay whole, outside the optimizer.
  size_t frozen = 0;

  size_t modelState() const { return parameters + gradients + masterWeights + optimizerState; }
};

struct ZeroStats {
  int stage = 0;
  int ranks = 1;
  int64_t parameters = 0;  // elements of every trained parameter
  // Stage 3: elements of the frozen parameters of marked modules, sharded in units of their own
  // (no gradient, no optimizer state); not in `parameters`, `padding` or `owned`.
  int64_t frozen = 0;
  int64_t padding = 0;  // elements added so that every unit divides into `ranks` blocks
  int64_t owned = 0;    // elements of this rank's shards, padding included
  size_t units = 0;
  ZeroMemory memory;
  // The last step: how long the end of backward waited for reduce-scatters, how long this rank's
  // optimizer steps took, and how long its all-gathers were waited for after its last unit's
  // step: by step(), or with deferAllgatherWait by whatever waited for them since (the next
  // forward, waitForParameters()).
  std::chrono::nanoseconds reduceScatterWait{0};
  std::chrono::nanoseconds optimizerStep{0};
  std::chrono::nanoseconds allgatherWait{0};
  // Stage 3, the forwards and backwards since the step before the last: the marked units'
  // all-gathers, how many of them were prefetched, and how long the units waited for them.
  size_t unitGathers = 0;
  size_t prefetchedGathers = 0;
  std::chrono::nanoseconds unitGatherWait{0};
};

// What this rank holds of one parameter: its elements [begin, end) of the flattened parameter,
// with views (write to load) of their master weights and optimizer state. Independent of units
// and world size: a checkpoint keyed by (param, begin, end) re-shards onto any world size.
// Stage 3 has records of the frozen parameters of marked modules too: their values as `master`,
// no state.
struct ShardRecord {
  std::string param;           // the module's name for it
  std::vector<int64_t> shape;  // the whole parameter's
  int64_t begin = 0;
  int64_t end = 0;
  at::Tensor master;  // [end - begin]: float32 master weights, or the parameter's values
  // [end - begin] each: "exp_avg", "exp_avg_sq", "momentum_buffer", ... (those the optimizer has;
  // none before its first step).
  std::vector<std::pair<std::string, at::Tensor>> state;
  std::optional<int64_t> step;  // optimizers that count steps, once they have
};

// One request of loadShardState(): elements [begin, end) of `field` ("master", a state field's
// name, or "step") of parameter `param`.
struct ShardField {
  std::string param;
  std::string field;
  int64_t begin = 0;
  int64_t end = 0;
};
// Fills `out` (float32 or the field's dtype, [end - begin]; "step": int64 [1]) with what was
// saved, gathered from the records of whichever ranks held it; false, `out` untouched, when
// nothing was saved for that field (the state stays absent). `out` is a view of the place the
// values go (the shard's own memory): write into it (copy_, fill_), never rebind it.
using ShardReader = std::function<bool(const ShardField& what, at::Tensor& out)>;

class ShardedOptimizer : public torch::optim::Optimizer {
 public:
  // Every trained parameter of `ddp`'s module, in one group with the factory's defaults.
  template <typename ModuleType>
  ShardedOptimizer(DistributedDataParallel<ModuleType>& ddp, OptimizerFactory factory,
                   ZeroOptions options = {})
      : ShardedOptimizer(ddp.core(), {}, std::move(factory), options) {
    followWrapper(ddp);
  }
  // Groups of the module's parameters, as a libtorch optimizer takes them (a group without
  // options gets the factory's defaults). Together they must hold every trained parameter,
  // each once.
  template <typename ModuleType>
  ShardedOptimizer(DistributedDataParallel<ModuleType>& ddp,
                   std::vector<torch::optim::OptimizerParamGroup> groups, OptimizerFactory factory,
                   ZeroOptions options = {})
      : ShardedOptimizer(ddp.core(), std::move(groups), std::move(factory), options) {
    followWrapper(ddp);
  }
  ShardedOptimizer(DdpCore& ddp, std::vector<torch::optim::OptimizerParamGroup> groups,
                   OptimizerFactory factory, ZeroOptions options);
  ~ShardedOptimizer() override;

  // Steps this rank's shards with the real optimizer, then all-gathers the parameters (unit k's
  // all-gather overlapping unit k+1's step). Collective. With a closure: runs it first (with
  // gradients enabled), as libtorch's optimizers do, and returns its loss.
  torch::Tensor step(LossClosure closure = nullptr) override;

  // Waits for the all-gathers the last step() left running (ZeroOptions::deferAllgatherWait):
  // the module's parameters are then this step's on every rank. A no-op when none are running.
  void waitForParameters();

  // Drops every gradient accumulated so far, as zero_grad() does under DDP: the shards' (unset,
  // libtorch 2.x's set_to_none), and what noSync() backwards accumulated outside them. The
  // module's zero_grad() drops them too; libtorch's own through a torch::optim::Optimizer& (this
  // hides it: it is not virtual) does where it unsets them (its default), and keeps noSync()'s
  // where it zeroes them in place (zero_grad(false)). See docs/design.md "Sharding".
  void zero_grad();

  // Sharded state does not fit libtorch's archive: refused with a hint.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  const ZeroOptions& options() const { return options_; }
  const ShardLayout& layout() const;
  ZeroStats stats() const;

  // This rank's shard records (see ShardRecord), in unit order.
  std::vector<ShardRecord> shardRecords();
  // Loads a state saved at any world size: every field of every record of this rank is asked of
  // `read`; the parameters are then all-gathered. Collective.
  void loadShardState(const ShardReader& read);

  // After the process group re-formed among the survivors of a lost node (ProcessGroup::
  // reform): the DDP wrapper's buckets and this optimizer's units are built again for the new
  // world, with the groups' options as they are now. Their state starts empty, and the wrapper
  // does not broadcast this optimizer's parameters: the caller loads both (TrainingState::tryStep
  // from the in-memory mirrors: docs/design.md "Sharded state across a lost node"). An optimizer
  // built through a DistributedDataParallel wrapper. Collective over the new members.
  void reformUnits();
  // Whether reformUnits() can rebuild this optimizer (built through the wrapper).
  bool reformable() const { return static_cast<bool>(wrapperCore_); }

  // Node loss (docs/design.md "Sharded state across a lost node"): TrainingState::tryStep's
  // under `launch --on-node-loss continue`, not the program's. Copies this rank's
  // blocks (master weights or parameter values, optimizer state, step counts) to a rank of
  // another node, as the state at the start of training step `generation`; each rank keeps such
  // a copy of another's. Collective.
  void refreshMirror(int64_t generation);
  // Empty when refreshMirror() can mirror this optimizer, else why not (offloaded shards on an
  // accelerator, units of several dtypes, built without the wrapper): the same on every rank.
  std::string whyNotMirrored();
  // Bytes the mirrors hold on this rank: its own blocks' copy and the held rank's, twice.
  size_t mirrorBytes() const;
  // Inside step(), or a step() that failed after it began changing the units: the blocks may no
  // longer be those of the step's start (TrainingState::tryStep's test before keeping them).
  bool stepping() const { return stepping_; }
  // After a failure outside step(): this rank's blocks, as they are, offered as those of the
  // start of step `generation` by the next restore (TrainingState::tryStep). Not collective.
  void keepLiveBlocks(int64_t generation);

  // Internal: the units and their state machine.
  zero::ShardGroup& shards() { return *shards_; }
  zero::ShardMirror& mirror();

 private:
  struct StepTimes {
    std::chrono::nanoseconds optimizerStep{0};
    std::chrono::nanoseconds allgatherWait{0};
    size_t unitGathers = 0;  // stage 3: ZeroStats'
    size_t prefetchedGathers = 0;
    std::chrono::nanoseconds unitGatherWait{0};
  };

  // The wrapper's machinery as it is now: after a re-form, made again for the new world first.
  // `loadedLater`: the parameters the caller loads next, which the wrapper made again for the new
  // world does not broadcast.
  template <typename ModuleType>
  void followWrapper(DistributedDataParallel<ModuleType>& ddp) {
    wrapperCore_ = [&ddp](const std::unordered_set<const void*>& loadedLater) -> DdpCore& {
      if (ddp.stale()) ddp.reform(loadedLater);
      return ddp.core();
    };
  }

  ZeroOptions options_;
  OptimizerFactory factory_;
  // null: built over a DdpCore alone
  std::function<DdpCore&(const std::unordered_set<const void*>& loadedLater)> wrapperCore_;
  std::shared_ptr<zero::ShardGroup> shards_;
  std::shared_ptr<zero::ShardedGradientSync> sync_;  // owned with DDP, which drives it
  std::unique_ptr<zero::ShardMirror> mirror_;        // made at the first refreshMirror()
  StepTimes lastStep_;
  bool stepping_ = false;
};

// Node loss under ZeRO (docs/design.md "Sharded state across a lost node"): after
// `group` re-formed among the survivors, the newest generation of which every old rank's blocks
// are on some survivor -- its own copy, or the mirror another node keeps -- and of which every
// survivor holds the rest of its state (`replicated`: the generations TrainingState kept its
// replicated state of). Each of `optimizers` is then built again for the new world
// (reformUnits()) and loaded with that generation, each element of each block sent once, from
// the survivor that holds it to its new owner; returns it, and the bytes this rank sent in
// `bytesSent`. A rank taken into the running round (its mirror empty: it held no block of the
// old world) receives its blocks like the others; `joined` is how many such ranks the group has.
// With no such generation nothing changes: returns -1 and `why` names the ranks whose blocks are
// lost. Collective over the new members.
int64_t restoreFromMirrors(const std::vector<ShardedOptimizer*>& optimizers, ProcessGroup& group,
                           const std::vector<int64_t>& replicated, std::string& why,
                           uint64_t* bytesSent = nullptr, int* joined = nullptr);

// Clips the gradients of `optimizer`'s shards so that their norm over every rank -- the norm of
// the whole model's averaged gradient -- is at most `maxNorm`, as torch::nn::utils::
// clip_grad_norm_ does for a full model: squares (|g|^p; max for infinity) summed over this rank's
// shards, one allreduce, the same scale on every rank. Returns the norm before clipping. Call it
// after GradScaler::unscale(). Collective.
double clipGradNorm(ShardedOptimizer& optimizer, double maxNorm, double normType = 2.0);

}  // namespace dtrain
