#pragma once
// The collectives of ZeRO's units and the memory they need: a unit's reduce-scatter (its full
// gradients into every rank's block) and all-gather (every rank's block into the full
// parameters, in place), the gradient norm over every rank's shards, and stage 2's pool of
// full-size gradient buckets.

#include <cstddef>
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
double globalNorm(comm::Communicator& comm, const std::vector<at::Tensor>& grads,
                  double normType, const c10::Device& device, comm::Millis timeout);

// Stage 2's full-size gradient buckets, from Communicator::allocate (shared-memory arena pages,
// pre-touched Gloo memory, device memory), reused from one backward to the next: the first
// touch of fresh pages is slow, and glibc hands large blocks back to the kernel when freed.
class GradientPool {
 public:
  explicit GradientPool(comm::Communicator& comm) : comm_(comm) {}

  // A free bucket of at least `bytes` (the smallest such), or null when none is free.
  std::shared_ptr<comm::Buffer> takeFree(size_t bytes);
  // A new bucket of at least `bytes`: rounded up to kGranule (below kGranule: to the next power
  // of two, so that a small model's buckets stay its size), so that units of about the same size
  // (as units are, Note [Shard layout]) fit each other's buckets. Free buckets too small for it
  // are released first: the pool holds what the units in flight need, not their history.
  std::shared_ptr<comm::Buffer> allocate(size_t bytes);
  static constexpr size_t kGranule = size_t{4} << 20;
  void give(std::shared_ptr<comm::Buffer> bucket);

  size_t leased() const { return leased_; }
  size_t capacityBytes() const { return capacity_; }

 private:
  comm::Communicator& comm_;
  std::vector<std::shared_ptr<comm::Buffer>> free_;
  size_t leased_ = 0;
  size_t capacity_ = 0;
};

}  // namespace dtrain::zero
