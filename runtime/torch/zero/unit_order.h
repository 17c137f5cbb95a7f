#pragma once
// UnitOrder: the order in which ZeRO-3's marked units are needed in one direction (forward or
// backward), recorded in the first step, and the unit to prefetch after each. See Note
// [Prefetching units].

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dtrain::zero {

// Note [Prefetching units]
// A unit's all-gather issued only when the unit is needed leaves the compute waiting for it every
// time. libtorch has no module hooks to learn the order from ahead of time, so ShardGroup learns
// it: the first forward records the order in which the marked units are first gathered, the
// first backward the order in which their boundaries ask for them (GatherForBackward). From the
// second step on, gathering unit k (or finding it gathered) in backward also issues the
// all-gather of the unit recorded after k, into a buffer of the pool, and returns at once; that
// unit's own gather then only waits for it. So backward holds at most the unit computing, the one
// arriving and those whose gradients are not all in. The same in forward when
// ZeroOptions::forwardPrefetch is set (off by default: Note [Which unit is gathered]). Every
// rank records the same order because the same graph runs on every rank; a rank whose graph
// differs issues other gathers, which the units' labels catch. A prefetched unit that is not
// used after all (control flow that changed) is waited for and freed at the end of backward.
// Gathers during a recompute in backward (dtrain/torch/recompute.h) are forward gathers inside
// backward: they neither record nor prefetch in forward order.
class UnitOrder {
 public:
  static constexpr size_t kNone = SIZE_MAX;
  explicit UnitOrder(size_t units) : next_(units, kNone), seen_(units, 0) {}

  // Unit k is needed. While recording: appended when new, and nothing to prefetch yet. Once
  // recorded: the unit to prefetch after k, or kNone.
  size_t needed(size_t k);
  // The first pass is over: the order is what was recorded.
  void finishRecording() { recording_ = false; }
  bool recording() const { return recording_; }

 private:
  std::vector<size_t> next_;
  std::vector<char> seen_;
  size_t last_ = kNone;
  bool recording_ = true;
};

}  // namespace dtrain::zero
