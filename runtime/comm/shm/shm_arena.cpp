#include "shm_arena.h"

#include <sys/mman.h>

#include <algorithm>

#include "byte_layout.h"
#include "dtrain/base/error.h"

namespace dtrain::comm::shm {

namespace {
constexpr size_t kPage = 4096;
constexpr size_t kHuge = size_t{2} << 20;
}  // namespace

class ArenaBuffer final : public Buffer {
 public:
  ArenaBuffer(std::shared_ptr<Arena> arena, size_t offset, size_t bytes, size_t length)
      : arena_(std::move(arena)), offset_(offset), bytes_(bytes), length_(length) {}
  ~ArenaBuffer() override { arena_->release(offset_, length_); }
  void* data() override { return arena_->segment_->arena(arena_->segment_->rank()) + offset_; }
  size_t bytes() const override { return bytes_; }

 private:
  std::shared_ptr<Arena> arena_;
  size_t offset_;
  size_t bytes_;
  size_t length_;
};

std::shared_ptr<Arena> Arena::create(std::shared_ptr<Segment> segment) {
  return std::shared_ptr<Arena>(new Arena(std::move(segment)));
}

std::shared_ptr<Buffer> Arena::allocate(size_t bytes) {
  const size_t align = bytes >= kHuge ? kHuge : kPage;
  const size_t length = roundUp(std::max<size_t>(bytes, 1), kPage);
  size_t offset = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    bool found = false;
    // First fit among the freed pieces (already touched).
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      const size_t start = roundUp(it->first, align);
      const size_t end = it->first + it->second;
      if (start + length > end) continue;
      const size_t pieceStart = it->first;
      free_.erase(it);
      if (start > pieceStart) free_[pieceStart] = start - pieceStart;
      if (end > start + length) free_[start + length] = end - (start + length);
      offset = start;
      found = true;
      break;
    }
    if (!found) {
      const size_t start = roundUp(top_, align);
      if (start + length > segment_->arenaBytes()) return nullptr;
      if (start > top_) free_[top_] = start - top_;
      offset = start;
      top_ = start + length;
      if (top_ > touched_) {
        char* base = segment_->arena(segment_->rank());
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
        // First touch now, not inside a collective.
        if (::madvise(base + touched_, top_ - touched_, MADV_POPULATE_WRITE) != 0) {
          for (size_t i = touched_; i < top_; i += kPage) base[i] = 0;
        }
        touched_ = top_;
      }
    }
    inUse_ += length;
    peakInUse_ = std::max(peakInUse_, inUse_);
  }
  return std::make_shared<ArenaBuffer>(shared_from_this(), offset, bytes, length);
}

void Arena::release(size_t offset, size_t length) {
  std::lock_guard<std::mutex> lock(mutex_);
  inUse_ -= length;
  auto it = free_.emplace(offset, length).first;
  auto next = std::next(it);
  if (next != free_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_.erase(it);
    }
  }
}

size_t Arena::inUseBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return inUse_;
}

size_t Arena::peakInUseBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peakInUse_;
}

void Arena::resetPeak() {
  std::lock_guard<std::mutex> lock(mutex_);
  peakInUse_ = inUse_;
}

size_t Arena::touchedBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return touched_;
}

}  // namespace dtrain::comm::shm
