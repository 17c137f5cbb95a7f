#pragma once
// Arena: Communicator::allocate() for the shared-memory backend. Hands out pieces of this rank's
// arena in the segment, so peers can read a buffer in place and an allreduce of it needs no copy
// in or out (DDP's buckets live here). Pages are touched once, when the arena first grows over
// them (never inside a collective); released pieces are reused, adjacent free pieces merge.

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

#include "dtrain/comm/communicator.h"
#include "shm_segment.h"

namespace dtrain::comm::shm {

class Arena : public std::enable_shared_from_this<Arena> {
 public:
  static std::shared_ptr<Arena> create(std::shared_ptr<Segment> segment);

  // Page-aligned (2 MiB-aligned from 2 MiB up); null when the arena has no room left.
  std::shared_ptr<Buffer> allocate(size_t bytes);

  size_t inUseBytes() const;
  size_t peakInUseBytes() const;  // the most inUseBytes at once since resetPeak()
  void resetPeak();
  size_t touchedBytes() const;

 private:
  explicit Arena(std::shared_ptr<Segment> segment) : segment_(std::move(segment)) {}
  void release(size_t offset, size_t length);

  std::shared_ptr<Segment> segment_;  // keeps the mapping alive while buffers exist
  mutable std::mutex mutex_;
  std::map<size_t, size_t> free_;  // guarded by mutex_: offset -> length, below top_, merged
  size_t top_ = 0;                 // guarded by mutex_: everything above is untouched and free
  size_t touched_ = 0;             // guarded by mutex_: bytes from the arena start ever touched
  size_t inUse_ = 0;               // guarded by mutex_
  size_t peakInUse_ = 0;           // guarded by mutex_

  friend class ArenaBuffer;
};

}  // namespace dtrain::comm::shm
