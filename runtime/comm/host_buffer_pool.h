#pragma once
// HostBufferPool: the memory behind Communicator::allocate() for CPU backends. Page-aligned,
// touched once when first allocated, and recycled: a released buffer goes back to the pool and
// a later allocation that fits it reuses it, so buffers made again and again (ZeRO's gathered
// units and gradient buckets, DDP's buckets when rebuilt) do not pay first-touch page faults
// twice. What it keeps and for how long is Note [Host buffer reuse].

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "dtrain/comm/communicator.h"

namespace dtrain::comm {

// Note [Host buffer reuse]
// First touch of fresh memory costs ~14 us per 4 KiB page (a 4 MiB buffer: ~15 ms), so a buffer
// released is kept, pages touched, for the next allocation it fits: the smallest cached one of at
// least the request's page-rounded size and at most a quarter larger (kMaxSlackDivisor), so that
// near-equal sizes (units of one layout, a bucket rebuilt a page longer) share memory while a
// large buffer is not spent on a small request. Kept until trim(), which gives back to the system
// every cached buffer that has lain idle since before the previous trim(): a caller with a cycle
// (ZeRO's training step, ShardGroup::trimPools) trims once per cycle, so what every cycle reuses
// stays touched -- no page is faulted again in a steady state -- and what a phase that does not
// recur left behind (the buffers a unit was bound through when the model was built whole, DDP's
// buckets that a ShardedOptimizer replaced, a one-off full gather) is gone after one cycle. A
// pool nobody trims keeps what it cached, as before. The stats say what is handed out now, the
// most at once, and what is cached: that last is resident memory no one uses.
class HostBufferPool : public std::enable_shared_from_this<HostBufferPool> {
 public:
  static std::shared_ptr<HostBufferPool> create();
  ~HostBufferPool();

  // At least `bytes` usable (0 allowed); the buffer returns to the pool when released.
  std::shared_ptr<Buffer> allocate(size_t bytes);
  // Frees the cached buffers released before the previous trim() and not taken since.
  void trim();

  BufferStats stats() const;
  void resetPeak();  // peakInUseBytes := inUseBytes

  // A cached buffer serves a request when at most 1/kMaxSlackDivisor larger than it.
  static constexpr size_t kMaxSlackDivisor = 4;

 private:
  HostBufferPool() = default;
  void release(void* data, size_t capacity);

  struct Cached {
    void* data;
    uint64_t generation;  // trims done when it was last handed out
  };

  mutable std::mutex mutex_;
  std::multimap<size_t, Cached> free_;  // guarded by mutex_: capacity -> memory
  uint64_t generation_ = 0;             // guarded by mutex_: trims so far
  BufferStats stats_;                   // guarded by mutex_

  friend class PooledHostBuffer;
};

}  // namespace dtrain::comm
