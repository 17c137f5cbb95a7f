#pragma once
// HostBufferPool: the memory behind Communicator::allocate() for CPU backends. Page-aligned,
// touched once when first allocated, and recycled: a released buffer goes back to the pool and
// the next allocation of the same rounded size reuses it, so DDP's buckets never pay first-touch
// page faults twice. A later shared-memory path will place these in a segment shared by the ranks
// of a node.

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

#include "dtrain/comm/communicator.h"

namespace dtrain::comm {

class HostBufferPool : public std::enable_shared_from_this<HostBufferPool> {
 public:
  static std::shared_ptr<HostBufferPool> create();
  ~HostBufferPool();

  // At least `bytes` usable (0 allowed); the buffer returns to the pool when released.
  std::shared_ptr<Buffer> allocate(size_t bytes);

  size_t cachedBytes() const;

 private:
  HostBufferPool() = default;
  void release(void* data, size_t capacity);

  mutable std::mutex mutex_;
  std::multimap<size_t, void*> free_;  // guarded by mutex_: capacity -> memory
  size_t cachedBytes_ = 0;             // guarded by mutex_

  friend class PooledHostBuffer;
};

}  // namespace dtrain::comm
