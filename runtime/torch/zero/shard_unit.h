#pragma once
// ShardUnit: one unit of Note [Shard layout] -- the sharded parameter of this design, as a
// FlatParameter is PyTorch FSDP's. Its parameters live in one flat buffer (each is a view of it,
// through set_data), this rank owns one contiguous block of it, and the real optimizer steps that
// block (or its float32 master copy). Memory and views only: when what happens is ShardGroup's
// (shard_group.h). See Note [Sharded memory].

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "dtrain/comm/communicator.h"
#include "dtrain/torch/detail/shard_layout.h"

namespace torch::optim {
class Optimizer;
}

namespace dtrain::zero {

// The dtypes of a unit's memory.
struct UnitDtypes {
  // The parameters' and the all-gather's: their own, or ZeroOptions::paramDtype for a marked
  // unit's float32 parameters (converted when the unit is built).
  at::ScalarType param = at::kFloat;
  // What the optimizer steps: float32 master weights, or `param` for none. A converted unit's
  // master holds the parameters' values as they were given.
  at::ScalarType master = at::kFloat;
  // The full gradients' and what the reduce-scatter lands in (ZeroOptions::reduceDtype; stages
  // 2 and 3 only): `param` when it is the same.
  at::ScalarType grad = at::kFloat;
};

struct UnitParam {
  std::string name;
  at::Tensor param;  // the module's parameter; a view of the unit's flat buffer once bound
};

// Note [Sharded memory]
// Per unit (S = the block a rank owns, P = N S the padded unit):
//   fullParams   P elements of the parameters' dtype, from Communicator::allocate (so the
//                all-gather is in place; peers read it directly with shared memory). Every
//                parameter is set_data() onto its range; the padding stays zero.
//   fullGrads    P elements. Stage 1: allocated once, and each parameter's .grad is a tensor over
//                its range (as DDP's gradientAsBucketView), so backward accumulates in place and
//                the reduce-scatter reads the gradients where autograd left them. Stage 2: a
//                bucket leased from the GradientPool for one backward, the gradients copied in.
//   reduced      S elements: where the reduce-scatter lands. Stage 1: block `rank` of fullGrads
//                (the reduce-scatter runs in place). Stage 2: memory of its own. Stages 2 and 3
//                with ZeroOptions::reduceDtype: fullGrads and reduced are of that dtype (the
//                gradients converted as they are copied in), and reduced is added into the
//                master's gradient.
//   master       S float32 elements, for lower-precision parameters only, with a float32 .grad.
//                Offload (on an accelerator): in the host's pinned memory, for every dtype, with
//                a pinned buffer beside it that reduced crosses to the host in.
//   optimized    what the real optimizer steps: master, or block `rank` of fullParams. Its .grad
//                is the averaged gradient of the shard: reduced, or master's float32 gradient.
// Plain tensors over the buffers (not autograd views), so optimizers may detach_() them.
// Stage 3 (Note [ZeRO-3 unit lifecycle] in shard_group.h) differs in the parameters only:
//   ownedParams  S elements of memory of their own, the one copy that persists between uses;
//                none for a converted unit, whose master is that copy (rounded at each gather).
//   fullParams   P elements over ONE storage that every parameter shares (set_data onto a
//                tensor at::Tensor::set_() over it, not a from_blob per parameter), so that
//                swapping that storage's data pointer (holdFull / releaseFull) gathers or frees
//                the whole unit at once, and autograd's saved tensors -- which share the
//                storage -- see the values gathered again for backward, no version bumped.
class ShardUnit {
 public:
  // Allocates the unit's memory through `comm`, copies the parameters' values in and binds them
  // to it (stage 1: their gradients too), in `types.param` (see UnitDtypes).
  // `ownedAsBuilt` (stage 3, a resharded unit whose parameters were sharded when built in this
  // very layout): this rank's block as fullyShard kept it, taken as the owned block; the
  // parameters have no memory and nothing is gathered. `offload` (ZeroOptions'): on an
  // accelerator, the master block (float32 parameters get one too) and its gradient in the
  // host's pinned memory, where the optimizer steps them. `frozen` (stage 3, resharded): the
  // parameters need no gradient -- Note [Frozen units] in shard_group.h: the unit has its
  // parameters' memory only, no gradients, master or optimizer.
  ShardUnit(size_t index, const UnitLayout& layout, std::vector<UnitParam> params, int rank,
            int ranks, int stage, UnitDtypes types, comm::Communicator& comm,
            const c10::Device& device, bool resharded = false, bool offload = false,
            at::Tensor ownedAsBuilt = {}, bool frozen = false);
  ~ShardUnit();
  ShardUnit(const ShardUnit&) = delete;
  ShardUnit& operator=(const ShardUnit&) = delete;

  size_t index() const { return index_; }
  const UnitLayout& layout() const { return layout_; }
  const std::vector<UnitParam>& params() const { return params_; }
  int64_t shardNumel() const { return layout_.shardNumel; }
  int64_t paddedNumel() const { return layout_.shardNumel * ranks_; }
  at::ScalarType dtype() const { return dtype_; }
  // The dtype the parameters were given in: dtype(), or float32 where ZeroOptions::paramDtype
  // converted them (their values are then the master's).
  at::ScalarType givenType() const { return givenType_; }
  // Before the unit is built again for another world (ShardedOptimizer::reformUnits): a
  // resharded unit's parameters become tensors of their dtype as given, without memory, as a
  // unit sharded when built has them.
  void releaseForRebuild();
  bool converted() const { return givenType_ != dtype_; }
  at::ScalarType gradType() const { return gradType_; }  // of fullGrads and reduced
  bool hasMaster() const { return master_.defined(); }
  // The master block and what the optimizer holds are in the host's memory (offload).
  bool offloaded() const { return hostReduced_.defined(); }
  // Where this unit's first parameter was registered among the module's: what error messages
  // and names go by.
  std::string describe() const;

  at::Tensor& fullParams() { return fullParams_; }
  // Undefined for a converted unit (ZeroOptions::paramDtype): its block is the master's.
  at::Tensor& ownedParams() { return ownedParams_; }
  // What this rank sends of the unit to an all-gather: ownedParams(), or for a converted unit
  // the master rounded into its own place of fullParams() (held: the all-gather runs in place).
  at::Tensor sendBlock();
  // Undefined while a stage-2 unit holds no bucket.
  at::Tensor& fullGrads() { return fullGrads_; }
  // Parameter j's range of fullGrads, shaped as the parameter.
  at::Tensor& gradView(size_t j) { return gradViews_[j]; }
  at::Tensor& reduced() { return reduced_; }
  at::Tensor& master() { return master_; }
  at::Tensor& optimized() { return optimized_; }
  // The optimizer's gradient of optimized() -- reduced(), or the master's float32 gradient --
  // while the unit holds it or optimized() has it; else undefined.
  at::Tensor shardGrad() const;
  // Whether shardGrad() is reduced() (stages 2 and 3 without master weights, or with a
  // reduce-scatter in the master's dtype): the reduce-scatter writes the optimizer's gradient.
  bool gradInReduced() const { return gradInReduced_; }
  // Stages 2 and 3, not offloaded: between reduce-scatters the unit keeps no reference to the
  // shard's gradient, optimized().grad() alone holds it, so that zero_grad() (either, set_to_none)
  // frees it at once, as FSDP2's sharded gradients are freed (docs/design.md "Sharding").
  // ensureReduced() before a reduce-scatter takes it back or makes a new one; letGoOfGradient()
  // once the reduce-scatter's result is in it.
  void ensureReduced();
  void letGoOfGradient();

  // Whether optimized().grad() is still the gradient this unit attached (the same memory):
  // libtorch 2.x's zero_grad() unsets it.
  bool shardGradAttached() const;
  void attachShardGrad();
  // Master weights: the reduce-scatter's result (reduced()) into the master's gradient, added,
  // or copied when the optimizer had unset it; through the pinned host buffer when offloaded.
  // After the reduce-scatter was waited for on the current stream.
  void takeReduced();

  // Stage 2: fullGrads over `bucket` (at least paddedNumel() elements), its padding zeroed; and
  // back. The stage's only full-size gradient memory.
  void leaseGrads(std::shared_ptr<comm::Buffer> bucket);
  std::shared_ptr<comm::Buffer> returnGrads();
  bool holdsGrads() const { return fullGrads_.defined(); }

  // Stage 3: whether the full parameters are freed between uses (a marked module's unit), or
  // kept as at stage 2 (the root's).
  bool resharded() const { return resharded_; }
  // Stage 3: the full parameters' storage over `buffer` (at least paddedNumel() elements; its
  // bytes are the all-gather's to write), or over nothing. Accessing a parameter whose unit
  // holds nothing reads a null storage.
  void holdFull(std::shared_ptr<comm::Buffer> buffer);
  std::shared_ptr<comm::Buffer> releaseFull();
  bool holdsFull() const { return paramMemory_ != nullptr; }
  // Stage 3: a marked module's parameters that need no gradient (Note [Frozen units]).
  bool frozen() const { return frozen_; }

  // Bytes of the unit's own persistent memory, by kind (see ZeroMemory).
  size_t parameterBytes() const;
  size_t gradientBytes() const;
  size_t masterBytes() const;
  size_t offloadedBytes() const;  // master, its gradient, the host buffer (offload only)

  // The real optimizer over optimized(), built by ShardGroup.
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  void setOptimizer(std::unique_ptr<torch::optim::Optimizer> optimizer);

 private:
  void bindParameters(comm::Communicator& comm, const c10::Device& device);
  void bindOverStorage(comm::Communicator& comm, const c10::Device& device, at::Tensor asBuilt);
  // This rank's block of the parameters' values as given, before they are bound.
  at::Tensor givenBlock(const c10::Device& device) const;
  void makeGradViews(const std::shared_ptr<comm::Buffer>& memory);

  const size_t index_;
  const UnitLayout layout_;
  std::vector<UnitParam> params_;
  const int rank_;
  const int ranks_;
  const int stage_;
  const at::ScalarType dtype_;
  const at::ScalarType givenType_;
  const at::ScalarType gradType_;
  const bool resharded_;
  const bool frozen_;
  const c10::Device device_;
  bool gradInReduced_ = false;
  const void* attached_ = nullptr;             // the data of the gradient attached to optimized_
  std::shared_ptr<comm::Buffer> paramMemory_;  // stage 3: what fullStorage_ holds now, if any
  at::Storage fullStorage_;                    // stage 3
  std::shared_ptr<comm::Buffer> gradMemory_;   // stage 1: owned; stage 2: the leased bucket
  at::Tensor fullParams_, ownedParams_;
  at::Tensor fullGrads_;
  std::vector<at::Tensor> gradViews_;
  at::Tensor reduced_;
  at::Tensor master_;
  at::Tensor optimized_;
  at::Tensor shardGrad_;
  at::Tensor hostReduced_;  // offload: pinned, where reduced_ crosses to the host
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

}  // namespace dtrain::zero
