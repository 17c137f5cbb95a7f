#include "host_buffer_pool.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "dtrain/base/error.h"

namespace dtrain::comm {

namespace {
constexpr size_t kPage = 4096;
size_t roundToPage(size_t bytes) { return bytes == 0 ? kPage : (bytes + kPage - 1) / kPage * kPage; }
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
  for (auto& [capacity, data] : free_) std::free(data);
}

std::shared_ptr<Buffer> HostBufferPool::allocate(size_t bytes) {
  const size_t capacity = roundToPage(bytes);
  void* data = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(capacity);
    if (it != free_.end()) {
      data = it->second;
      free_.erase(it);
      cachedBytes_ -= capacity;
    }
  }
  if (data == nullptr) {
    data = std::aligned_alloc(kPage, capacity);
    DTRAIN_CHECK(data != nullptr, "allocate({} bytes): out of memory", bytes);
    std::memset(data, 0, capacity);  // first touch here, not inside a collective
  }
  return std::make_shared<PooledHostBuffer>(weak_from_this(), data, bytes, capacity);
}

void HostBufferPool::release(void* data, size_t capacity) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_.emplace(capacity, data);
  cachedBytes_ += capacity;
}

size_t HostBufferPool::cachedBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cachedBytes_;
}

}  // namespace dtrain::comm
