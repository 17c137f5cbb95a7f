#include "host_buffer_pool.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "dtrain/base/error.h"

namespace dtrain::comm {

namespace {
constexpr size_t kPage = 4096;
size_t roundToPage(size_t bytes) {
  return bytes == 0 ? kPage : (bytes + kPage - 1) / kPage * kPage;
}
}  // namespace

class PooledHostBuffer final : public Buffer {
 public:
  PooledHostBuffer(std::weak_ptr<HostBufferPool> pool, void* data, size_t bytes, size_t capacity)
      : pool_(std::move(pool)), data_(data), bytes_(bytes), capacity_(capacity) {}
  ~PooledHostBuffer() override {
    if (auto pool = pool_.lock()) {
      pool->release(data_, capacity_);
    } else {
      std::free(data_);
    }
  }
  void* data() override { return data_; }
  size_t bytes() const override { return bytes_; }

 private:
  std::weak_ptr<HostBufferPool> pool_;
  void* data_;
  size_t bytes_;
  size_t capacity_;
};

std::shared_ptr<HostBufferPool> HostBufferPool::create() {
  return std::shared_ptr<HostBufferPool>(new HostBufferPool());
}

HostBufferPool::~HostBufferPool() {
  for (auto& [capacity, cached] : free_) std::free(cached.data);
}

std::shared_ptr<Buffer> HostBufferPool::allocate(size_t bytes) {
  const size_t need = roundToPage(bytes);
  void* data = nullptr;
  size_t capacity = need;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // See Note [Host buffer reuse]: the smallest cached buffer that fits, if not much larger.
    auto it = free_.lower_bound(need);
    if (it != free_.end() && it->first <= need + need / kMaxSlackDivisor) {
      capacity = it->first;
      data = it->second.data;
      free_.erase(it);
      stats_.cachedBytes -= capacity;
      ++stats_.hits;
    } else {
      ++stats_.misses;
    }
    // Counted before the memory is taken, so that the peak covers the fresh one too.
    stats_.inUseBytes += capacity;
    stats_.peakInUseBytes = std::max(stats_.peakInUseBytes, stats_.inUseBytes);
  }
  if (data == nullptr) {
    data = std::aligned_alloc(kPage, capacity);
    if (data == nullptr) {
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.inUseBytes -= capacity;
    }
    DTRAIN_CHECK(data != nullptr, "allocate({} bytes): out of memory", bytes);
    std::memset(data, 0, capacity);  // first touch here, not inside a collective
  }
  return std::make_shared<PooledHostBuffer>(weak_from_this(), data, bytes, capacity);
}

void HostBufferPool::release(void* data, size_t capacity) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Its generation says when it was last handed out: now, as far as trim() is concerned.
  free_.emplace(capacity, Cached{data, generation_});
  stats_.inUseBytes -= capacity;
  stats_.cachedBytes += capacity;
}

void HostBufferPool::trim() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = free_.begin(); it != free_.end();) {
    if (it->second.generation < generation_) {
      std::free(it->second.data);
      stats_.cachedBytes -= it->first;
      ++stats_.freed;
      it = free_.erase(it);
    } else {
      ++it;
    }
  }
  ++generation_;
}

BufferStats HostBufferPool::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void HostBufferPool::resetPeak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peakInUseBytes = stats_.inUseBytes;
}

}  // namespace dtrain::comm
