#pragma once
// The collectives of ZeRO's units and the memory they need: a unit's reduce-scatter (its full
// gradients into every rank's block) and all-gather (every rank's block into the full
// parameters, in place), the gradient norm over every rank's shards, and stage 2's pool of
// full-size gradient buckets.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dtrain/comm/communicator.h"
#include "shard_unit.h"

namespace dtrain::zero {

// Note [Averaging in the reduce-scatter]
// As DDP's buckets (Note [Averaging]): float32 and float64 units are averaged by the collective
// itself (ReduceOp::Avg: one division, after the sum, on the way); 16-bit units are divided by N
// before, where the gradients are written, so their sum cannot overflow, and summed.
bool averagedByCollective(at::ScalarType dtype);

// Starts unit `unit`'s reduce-scatter: fullGrads -> reduced (stage 1: in place), or -> `out` (a
// shard-sized tensor) when given.
std::shared_ptr<comm::Work> reduceScatterUnit(comm::Communicator& comm, ShardUnit& unit,
                                              const comm::CallOptions& call,
                                              const at::Tensor& out = {});
// Starts unit `unit`'s all-gather, in place: block `rank` of fullParams -> all of fullParams.
std::shared_ptr<comm::Work> allgatherUnit(comm::Communicator& comm, ShardUnit& unit,
                                          const comm::CallOptions& call);

// The norm of every rank's `grads` together: sum of |g|^p (max for infinity) over this rank's,
// one allreduce. Collective. `grads` on `device`, any floating dtypes (summed in float64).
double globalNorm(comm::Communicator& comm, const std::vector<at::Tensor>& grads, double normType,
                  const c10::Device& device, comm::Millis timeout);

// Note [Communication buffers of a step]
// Stage 2's full-size gradient buckets and stage 3's gathered units come from
// Communicator::allocate (shared-memory arena pages, pre-touched Gloo memory, device memory) and
// are reused from one step to the next, through a GradientPool each: the first touch of fresh
// pages is slow (~14 us per 4 KiB page on the CPU), cudaMalloc and cudaFree synchronise. What a
// pool holds between steps should be what the step has in flight at once, as PyTorch FSDP2's
// caching allocator holds its all-gather outputs and reduce-scatter inputs:
//   - a buffer is the request's size, as the communicator rounds it (a page), not more: units of
//     one layout are near-equal, and a larger free buffer serves a smaller unit (the smallest
//     that fits), so a step reuses what the last one left, never a doubled size class;
//   - a new buffer first releases the free ones too small for it, so the pool holds what the
//     units in flight need, not their history;
//   - trim(), once per step (ShardGroup::trimPools, from ShardedOptimizer::step), releases the
//     free buffers that lay idle since before the last trim -- a one-off full gather
//     (gatherFullParameters), more buckets than a steady step leases -- and then the
//     communicator's own cache (Communicator::trimBuffers, Note [Host buffer reuse] in
//     runtime/comm/host_buffer_pool.h) gives back what it kept idle as long, such as the buffers
//     the units were bound through when built whole. What every step uses is never released, so
//     no page is touched twice in a steady state.
class GradientPool {
 public:
  explicit GradientPool(comm::Communicator& comm) : comm_(comm) {}

  // A free bucket of at least `bytes` (the smallest such), or null when none is free.
  std::shared_ptr<comm::Buffer> takeFree(size_t bytes);
  // A new bucket of at least `bytes`; free buckets too small for it are released first.
  std::shared_ptr<comm::Buffer> allocate(size_t bytes);
  void give(std::shared_ptr<comm::Buffer> bucket);
  // Releases the free buckets given back before the previous trim() and not taken since.
  void trim();

  size_t leased() const { return leased_; }
  size_t capacityBytes() const { return capacity_; }

 private:
  struct Free {
    std::shared_ptr<comm::Buffer> bucket;
    uint64_t generation;  // trims done when it was given back
  };
  comm::Communicator& comm_;
  std::vector<Free> free_;
  size_t leased_ = 0;
  size_t capacity_ = 0;
  uint64_t generation_ = 0;
};

}  // namespace dtrain::zero
