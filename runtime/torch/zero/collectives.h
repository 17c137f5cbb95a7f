#pragma once
// The collectives of ZeRO's units and the memory they need: a unit's reduce-scatter (its full
// gradients into every rank's block) and all-gather (every rank's block into the full
// parameters, in place), the gradient norm over every rank's shards, and stage 2's pool of
// full-size gradient buckets.

#include <algorithm>
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
// pages is slow (~14 us per 4 KiB page on the CPU), cudaMalloc and cudaFree synchronise. A step
// holds what it has in flight at once, as PyTorch FSDP2 holds its all-gather outputs and
// reduce-scatter inputs in tensors it frees when done; what it does with a buffer it is done
// with depends on where the memory lives:
//   - host memory (a CPU communicator: Gloo's pool, the shared-memory arena): given back to the
//     communicator at once. Its cache keeps the buffer, pages touched, for the next request it
//     fits (Note [Host buffer reuse] in runtime/comm/host_buffer_pool.h), from either pool: a
//     gathered unit's buffer serves the next gradient bucket as the allocator's free lists
//     serve FSDP2's next tensor. So a buffer is in use exactly while a collective or a unit
//     needs it, and none is held idle by a pool while the step's activations peak (the start
//     of backward, before any gradient is ready);
//   - device memory (NCCL, whose buffers are freed when released): kept in the pool, free, for
//     the next request; a new buffer first releases the free ones too small for it, so the pool
//     holds what the units in flight need, not their history.
// Either way a buffer is the request's size as the communicator rounds it (a page), and units of
// one layout are near-equal, so a step reuses what the last one left, never a doubled size
// class. trim(), once per step (ShardGroup::trimPools, from ShardedOptimizer::step), releases
// the free buffers that lay idle since before the last trim -- a one-off full gather
// (gatherFullParameters), more buckets than a steady step leases -- and then the communicator's
// own cache (Communicator::trimBuffers) gives back what it kept idle as long, such as the
// buffers the units were bound through when built whole. What every step uses is never released
// to the system, so no page is touched twice in a steady state.
class GradientPool {
 public:
  // keepFree: the pool keeps the buffers given back (device memory); otherwise the communicator
  // does.
  GradientPool(comm::Communicator& comm, bool keepFree) : comm_(comm), keepFree_(keepFree) {}

  // A free bucket of at least `bytes` (the smallest such) kept here, or null when none is.
  std::shared_ptr<comm::Buffer> takeFree(size_t bytes);
  // A new bucket of at least `bytes`; free buckets too small for it are released first.
  std::shared_ptr<comm::Buffer> allocate(size_t bytes);
  void give(std::shared_ptr<comm::Buffer> bucket);
  // Releases the free buckets given back before the previous trim() and not taken since.
  void trim();

  size_t leased() const { return leased_; }
  // What the pool's buffers take: those leased and those kept free here; for a pool that keeps
  // none, the most leased at once over the cycle before the last trim() or since (what a step
  // takes of the communicator's memory, cached between steps).
  size_t capacityBytes() const {
    return keepFree_ ? capacity_ : std::max(leasedPeak_, lastLeasedPeak_);
  }

 private:
  struct Free {
    std::shared_ptr<comm::Buffer> bucket;
    uint64_t generation;  // trims done when it was given back
  };
  comm::Communicator& comm_;
  bool keepFree_;
  std::vector<Free> free_;
  size_t leased_ = 0;
  size_t capacity_ = 0;     // leased and free bytes
  size_t leasedBytes_ = 0;  // leased bytes now
  size_t leasedPeak_ = 0;   // the most leasedBytes_ since the last trim()
  size_t lastLeasedPeak_ = 0;
  uint64_t generation_ = 0;
};

}  // namespace dtrain::zero
