#pragma once
// ShardGroup: every unit of one ShardedOptimizer and what happens to them in a step, as an
// explicit state machine per unit (Note [Unit states]): the gradient side -- written by backward,
// reduce-scattered, reduced -- and the parameter side -- stepped, all-gathered. Every transition
// checks the state it leaves, so a call out of order fails naming the unit instead of corrupting
// it. The backward's hooks (gradient_sync.h) and ShardedOptimizer::step drive it.

#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "collectives.h"
#include "dtrain/torch/detail/shard_layout.h"
#include "dtrain/torch/process_group.h"
#include "dtrain/torch/zero.h"
#include "fault.h"
#include "shard_unit.h"
#include "unit_order.h"

namespace dtrain::zero {

// Note [Unit states]
// Gradient side, per unit:
//   stage 1:  Reduced --openAccumulation--> Accumulating --launchReduce--> Reducing
//             --finishReduce--> Reduced; Accumulating --abandonAccumulation--> Reduced
//   stage 2:  Empty --fill (leases a bucket)--> Accumulating --launchReduce--> Reducing
//             --finishReduce (gives the bucket back)--> Empty
// Stage 1 opens every unit at once, before the first gradient of a backward after a
// synchronising one is accumulated (Note [Accumulating into the shard]); noSync() backwards then
// accumulate into the open units, and the synchronising backward fills and reduces them. Stage 2
// units hold memory only from their first gradient of a synchronising backward to the end of
// their reduce-scatter; under noSync() its gradients stay in the parameters' own .grad.
// Parameter side, per unit:
//   Gathered --stepUnit--> Stepped --launchGather--> Gathering --finishGather--> Gathered
// A step needs every unit's gradients Reduced (stage 1) or Empty (stage 2): a step in the middle
// of an accumulation would use a half-made gradient.
//
// Note [ZeRO-3 unit lifecycle]
// Stage 3 is stage 2 with one more state on the parameter side; the gradient side, the
// backward's hooks (Note [Sharded backward]), the optimizers, the records and the norm are
// stage 2's, unchanged. Its units are not planned by size: each module the user marks
// (ShardedUnit, dtrain/torch/fully_shard.h) is one unit per dtype (layoutUnits()), in reverse
// order of marking -- the order backward completes them, the order their reduce-scatters are
// issued -- and the parameters of no marked module form the root's units, last.
// A marked module's unit ("resharded") holds, between uses, only its owned block (S elements,
// memory of its own) and the optimizer's state over it:
//   Free --unshard--> Gathered --reshard--> Free
// unshard: a buffer of P elements from the parameter pool (Communicator memory, reused: fresh
// pages are slow to touch and glibc returns large blocks to the kernel) becomes the data of the
// ONE storage all the unit's parameters share (ShardUnit::holdFull, Note [Sharded memory]), and
// the all-gather writes every rank's block into it. reshard: the storage's data is swapped for
// nothing and the buffer goes back to the pool. Neither bumps a version counter, so the tensors
// autograd saved in forward are valid again once the unit is gathered for backward.
// Who does what, and when:
//   forward   ShardedUnit::forward unshards (when Free), runs the module, reshards what it
//             unsharded, and passes its output through GatherForBackward (an autograd
//             Function at the unit boundary, fully_shard.cpp).
//   backward  GatherForBackward's backward runs before any node of the unit -- they all need
//             the gradient of its output -- and unshards (a no-op when Gathered: a module
//             called twice in one forward meets its second boundary first). The hooks of
//             Note [Sharded backward] copy each finished gradient into a pooled bucket and
//             free .grad (stage 2's fill); the post-hook that completes the unit reshards it
//             (ShardGroup::gradientsComplete): after the unit's last gradient accumulator has
//             run, no node that needs its parameters is left, as every node that reads a
//             parameter sends a gradient into its accumulator. The unit's reduce-scatter
//             starts in unit order, as at stage 2, and gives the bucket back when it is done.
//   step      each unit's optimizer steps its owned block (a master copy for 16-bit units)
//             and the parameters stay Free: nothing is all-gathered. Root units are stage 2's:
//             Gathered --stepUnit--> Stepped --launchGather--> Gathering --> Gathered.
// So between steps a rank holds its blocks, the root's parameters, and no marked unit in full;
// during forward one unit (plus the units nested in it), during backward the units whose
// gradients are not all in. Collectives are issued by every rank in the same order because the
// same graph runs on every rank; a unit one rank skips is Note [Which unit is gathered].
//
// Note [Frozen units]
// A marked module's parameters that need no gradient (a frozen base under LoRA adapters) are
// sharded as its trained ones are -- PyTorch FSDP2 shards them alike -- but in units of their own,
// laid out as the trained ones (layoutUnits(), one per marked module and dtype) and numbered after
// every trained unit: size() counts the trained units, which the gradient side, the optimizers
// and step() know; unitCount() all of them, which the parameter side knows. A frozen unit is a
// ShardUnit with its owned block and nothing else: no gradient, reduce-scatter, master weights or
// optimizer state, never converted to ZeroOptions::paramDtype (it has no master to keep the
// values as given). Its module's binding gathers it with the trained units -- one label each,
// Note [Which unit is gathered] -- in forward and for backward. Freeing it in backward is the
// question: no gradient accumulator tells when the last node reading a frozen parameter has run.
// Such a node exists only because another of its inputs needs a gradient, and that gradient
// flows either to the module's input or to a trained parameter inside the module (its own units'
// or those of marked modules nested in it). So the frozen units of a module are freed (a
// "release", armed by the module's gather for backward) once both are in for this pass:
//   - the gradient of every input of the module's forwards that needed one (an identity autograd
//     Function on the input counts the forwards and, in backward, the gradients that arrived);
//   - the gradients of every trained unit inside the module (gradientsComplete()).
// A pass in which one of them never comes (a nested unit control flow skipped) frees them at its
// end, with whatever else is gathered (backwardEnded()). Not covered: a node whose only other
// operand needing a gradient is a parameter outside the module (tied to an ancestor's and used
// here with no other operand that needs a gradient); such a model would read freed memory and is
// what ShardedUnitOptions::reshardAfterForward = false does not fix either -- mark the ancestor.
// Shard records (Note [Shard records]) carry a frozen unit's owned block as `master` with no
// state, so checkpoints save, re-shard and export frozen parameters as they do trained ones.
//
// Note [Which unit is gathered]
// A unit's forward that one rank runs and another skips (an evaluation loop with more batches on
// one rank: FSDP's most reported hang) puts two different gathers at the same sequence number.
// Of two units of the same size and dtype, the collectives would be indistinguishable -- the
// ranks would silently exchange each other's parameters. So every gather of a resharded unit is
// labelled "unit <k> <why> <n> (<module>)" -- why: forward, backward or full
// (gatherFullParameters);
// n: the unit's own gather count, so a rank a whole forward ahead differs too -- and checked
// across ranks before it runs, whatever DTRAIN_CHECK_COLLECTIVES says (CallOptions::label and
// ::check): every rank fails at once, naming both sides' unit and call. The cost is the check's:
// nothing more on shared memory (its descriptors are compared anyway), one fingerprint exchange
// per gather on Gloo, a store round trip on NCCL.
//
// Note [Deferred all-gathers]
// step() steps the units last first and issues each unit's all-gather as soon as its step ends,
// so that it runs while the next units step; the first unit's, stepped last, has nothing left to
// hide behind and step() waits for it (with the ranks' skew: the slowest rank's optimizer step
// ends it). DDP has no such wait: its last collective ends with backward. With
// ZeroOptions::deferAllgatherWait, step() returns with those units Gathering, and the first
// reader of the parameters waits for them -- settleGathers(), from the DDP wrapper's next
// forward (ddp::GradientSync::beforeForward, before the buffers' broadcast and the module), the
// next step(), shardRecords(), loadShardState(), gatherFullParameters(), or a Checkpointer's
// save and restore -- so the tail runs while the program loads its next batch. The collectives
// are the same, in the same order, on every rank; only where a rank waits moves. A reader
// outside dtrain (an EMA copy, the module called without the wrapper) cannot be seen: it calls
// waitForParameters(), which is why it is off by default. Stage 3's marked units are unaffected
// (they are gathered at their use);
// its root units defer as stage 2's.
class ShardGroup {
 public:
  enum class Grads { Empty, Accumulating, Reducing, Reduced };
  enum class Params { Gathered, Stepped, Gathering, Free };

  // `unitGroup[k]`: the optimizer parameter group unit k belongs to. Stage 3: `units` ends with
  // the frozen units, laid out by `frozenLayout` (Note [Frozen units]).
  ShardGroup(std::shared_ptr<ProcessGroup> group, ShardLayout layout,
             std::vector<std::unique_ptr<ShardUnit>> units, std::vector<size_t> unitGroup,
             const ZeroOptions& options, ShardLayout frozenLayout = {});
  ~ShardGroup();
  ShardGroup(const ShardGroup&) = delete;
  ShardGroup& operator=(const ShardGroup&) = delete;

  ProcessGroup& group() { return *group_; }
  const ShardLayout& layout() const { return layout_; }
  const ZeroOptions& options() const { return options_; }
  int stage() const { return options_.stage; }
  // The trained units (the gradient side's, the optimizers'); the frozen ones follow them.
  size_t size() const { return layout_.units.size(); }
  size_t unitCount() const { return units_.size(); }
  // Stage 3, Note [Frozen units]: their layout; its unit u is unit size() + u.
  const ShardLayout& frozenLayout() const { return frozenLayout_; }
  ShardUnit& unit(size_t k) { return *units_[k]; }
  size_t groupOf(size_t k) const { return unitGroup_[k]; }
  Grads gradState(size_t k) const { return grads_[k]; }

  // --- gradient side (the backward's hooks, under their lock) ---
  // Stage 1: see Note [Accumulating into the shard]. No-op at stage 2.
  void openAccumulation();
  // Writes parameter j's gradient of this pass (undefined: zeros) into unit k's full gradients,
  // divided by N for 16-bit units; `poison`: the nan-grad fault to write into it.
  // A unit whose gradients are reduced in a wider dtype than its parameters' keeps them in the
  // parameters' .grad until its last one is in (Note [Gradients wider than the parameters]), and
  // so does a stage-3 unit on the CPU (Note [Buckets back before the next prefetch]).
  void fill(size_t k, size_t j, const fault::Fault* poison);
  // The backward's hooks, once unit k's last gradient of a synchronising pass is in (after
  // gradientsComplete()): what fill() left in .grad goes into the unit's bucket.
  void fillDeferred(size_t k);
  void launchReduce(size_t k);
  // Waits for unit k's reduce-scatter; returns how long.
  std::chrono::nanoseconds finishReduce(size_t k);
  // The gradient the optimizer sees of unit k (for the nan-grad fault after the collective).
  at::Tensor shardGrad(size_t k) { return units_[k]->shardGrad(); }
  // A noSync() backward accumulated since the last synchronising one: a step now would use
  // gradients no rank has averaged.
  void setLocalGradients(bool pending) { localGradients_ = pending; }
  // Note [Zeroed gradients] (gradient_sync.cpp): stage 1's open accumulation is dropped
  // unreduced (Accumulating -> Reduced); the next backward opens a new one.
  void abandonAccumulation();
  // Parameter j's part of unit k's shard gradient is zeroed: the program zeroed its gradient.
  void dropShardGradient(size_t k, size_t j);

  // --- parameter side (ShardedOptimizer::step) ---
  // Throws when any unit's gradients are not ready to step (see Note [Unit states]).
  void checkSteppable() const;
  void stepUnit(size_t k);  // the real optimizer's step; master weights rounded into the block
  // The unit's shard was written by other means (a loaded state): its parameters' block follows
  // the master weights, and the unit is to be gathered.
  void shardWritten(size_t k);
  void launchGather(size_t k);
  std::chrono::nanoseconds finishGather(size_t k);
  // Waits for every all-gather a step left running (Note [Deferred all-gathers]), last unit
  // first, the order they were issued in; adds the time to deferredWait().
  void settleGathers();
  std::chrono::nanoseconds deferredWait() const { return deferredWait_; }
  void resetDeferredWait() { deferredWait_ = {}; }

  // --- stage 3 (Note [ZeRO-3 unit lifecycle]) ---
  Params paramState(size_t k) const { return params_[k]; }
  enum class Why { Forward, Backward, Full };
  // Gathers unit k (Free or prefetched -> Gathered); true when this call did (the caller frees
  // it), false when it was gathered already. `why` and `module` label the gather (Note [Which
  // unit is gathered]); `why` also says which order to record and prefetch in (Note
  // [Prefetching units]). Collective, synchronous.
  bool unshard(size_t k, Why why, const std::string& module);
  void reshard(size_t k);  // Gathered -> Free
  // A converted unit (ZeroOptions::paramDtype): every rank's master block, all-gathered into a
  // tensor of the unit's padded size in the dtype its parameters were given in. Collective.
  at::Tensor gatherMaster(size_t k);
  // The backward's hooks: unit k's last gradient of this pass is in.
  void gradientsComplete(size_t k);
  // Note [Frozen units]: the frozen units of one marked module, freed in backward once the
  // gradients of its forwards' inputs and of the trained units inside it are in. Returns its id.
  size_t addFrozenRelease(std::vector<size_t> frozen, std::vector<size_t> trained);
  void frozenInputForward(size_t release);   // a forward whose input needs a gradient
  void frozenInputBackward(size_t release);  // the gradient of such an input is in
  void armFrozenRelease(size_t release);     // the module's gather for backward
  // The backward's end (synchronising or noSync()): the first one ends the recording of the
  // backward order; a unit gathered and not freed (a prefetch control flow did not use) is.
  void backwardEnded();
  // The unit gathers since the last call, and how long they were waited for; resets them.
  struct GatherCounts {
    size_t gathers = 0;
    size_t prefetched = 0;
    std::chrono::nanoseconds waited{0};
  };
  GatherCounts takeGatherCounts();
  size_t gatheredNow() const { return gatheredNow_; }
  size_t gatheredPeak() const { return gatheredPeak_; }

  size_t bucketBytes() const { return pool_.capacityBytes(); }
  size_t gatheredBytes() const { return paramPool_.capacityBytes(); }
  // Once per step: what the pools and the communicator's cache kept idle for a whole step goes
  // (Note [Communication buffers of a step] in collectives.h).
  void trimPools();

 private:
  void lease(size_t k);
  // See Note [Buckets back before the next prefetch]: finishes the reduce-scatters issued before
  // unit k's all-gather (over once it is, on such a communicator).
  void finishReducesBefore(size_t k);
  // Whether that Note applies: host buffers, given back to the communicator, and collectives run
  // in issue order (a CPU communicator).
  bool buffersBackInOrder() const { return group_->device().is_cpu(); }
  // Writes parameter j's gradient into unit k's bucket (leased at the unit's first): fill()'s
  // work, done at once or by fillDeferred().
  void copyIn(size_t k, size_t j, const fault::Fault* poison);
  // Note [Gradients wider than the parameters]; Note [Buckets back before the next prefetch].
  bool defersFill(size_t k) const;
  // Stages 2 and 3, a unit whose shard holds a gradient already: the bucket's own block, which
  // its reduce-scatter then writes and finishReduce() adds to the shard's gradient (Note
  // [Accumulating into the shard]); undefined otherwise.
  at::Tensor addedLater(size_t k);
  comm::CallOptions call() const;
  // Stage 3: unit k's all-gather into a pooled buffer, labelled, not waited for (Free ->
  // Gathering); and the wait for it, with the error of a failed one said in the unit's terms.
  void issueUnitGather(size_t k, Why why, bool prefetch);
  void waitUnitGather(size_t k, Why why);
  // Runs `step` of unit k's gather; its dtrain errors come out as gatherFailed's.
  template <typename Step>
  void inUnitTerms(size_t k, Why why, Step&& step);
  // Rethrows a failed gather of unit k as the same type, saying which gather and what to do.
  template <typename E>
  [[noreturn]] void gatherFailed(const E& error, size_t k, Why why) const;

  // Frees the release's frozen units when nothing it waits for is left (Note [Frozen units]).
  void tryFrozenRelease(size_t release);

  struct FrozenRelease {
    std::vector<size_t> frozen;
    std::vector<size_t> trained;  // the trained units inside the module
    size_t inputs = 0;            // forwards whose input's gradient has not arrived yet
    size_t trainedLeft = 0;       // while armed: trained units not complete in this pass
    bool armed = false;
  };

  std::shared_ptr<ProcessGroup> group_;
  comm::Communicator& comm_;
  const ShardLayout layout_;
  const ShardLayout frozenLayout_;
  std::vector<std::unique_ptr<ShardUnit>> units_;
  const std::vector<size_t> unitGroup_;
  const ZeroOptions options_;
  std::vector<Grads> grads_;
  std::vector<Params> params_;
  std::vector<std::shared_ptr<comm::Work>> reduceWork_;
  std::vector<at::Tensor> reduceInto_;  // per unit: addedLater() of its running reduce-scatter
  std::vector<std::shared_ptr<comm::Work>> gatherWork_;
  std::deque<size_t> reducing_;  // units whose reduce-scatter runs, in launch order
  // See Note [Buckets back before the next prefetch]: the order each unit's last reduce-scatter and
  // stage-3 all-gather were issued in, one count for both.
  uint64_t issued_ = 0;
  std::vector<uint64_t> reduceIssued_;
  std::vector<uint64_t> gatherIssued_;
  size_t prefetched_ = UnitOrder::kNone;  // the unit backward prefetched last
  // The nan-grad fault of a pass, for a gradient fill() left in .grad: its unit and slot.
  const fault::Fault* deferredPoison_ = nullptr;
  size_t poisonUnit_ = 0;
  size_t poisonSlot_ = 0;
  bool localGradients_ = false;
  GradientPool pool_;
  GradientPool paramPool_;  // stage 3: the full parameters of gathered units
  // Stage 3.
  std::vector<uint64_t> gathers_;     // per unit, gathers so far (Note [Which unit is gathered])
  std::vector<std::string> modules_;  // per unit, the marked module's name
  UnitOrder forwardOrder_;            // Note [Prefetching units]
  UnitOrder backwardOrder_;
  bool inBackward_ = false;  // between a pass's first gather for backward and backwardEnded()
  std::vector<FrozenRelease> releases_;
  std::vector<std::vector<size_t>> releasesOf_;  // per trained unit, the releases waiting on it
  GatherCounts counts_;
  std::chrono::nanoseconds deferredWait_{0};
  size_t gatheredNow_ = 0;
  size_t gatheredPeak_ = 0;
};

}  // namespace dtrain::zero
