#include "dtrain/torch/host_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "torch_compat.h"

// Note [Host memory cache]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// libtorch's CPU allocator is posix_memalign. glibc serves a block above its mmap threshold
// (which grows with the blocks freed, up to 32 MiB) by mmap and frees it by munmap, and trims the
// top of its heap when more than twice that is free there; ResNet-50's activations at batch 16 are
// 3-51 MB each. So a training step gets fresh pages for most of its activations and gradients,
// every step, and the kernel zero-fills and maps each on first touch: ~380,000 page faults per
// ResNet-50 step at batch 16 (1.4 us each on the development VM, about 0.5 s of a 3 s step).
// Recompute allocates the recomputed activations a second time and more than doubles the faults
// (measured: 1.5 M over four plain steps, 4.0 M with recompute), which made its backward 0.9 s
// longer than the plain backward plus one forward; with the blocks kept, it is within 1 % of it.
//
// The cache: blocks of at least minBytes are mapped by the cache itself (mmap, so that giving
// one back returns its memory at once), in sizes rounded up to 1/16 of their power of two (at
// least 64 KiB), and kept in a size-ordered free list when their tensor dies. An allocation
// takes the smallest free block of at least its rounded size and at most 1/8 more; otherwise it
// maps a new one. Training allocates the same shapes step after step, so after the first step
// nearly every allocation is a hit. Freed blocks beyond maxCachedBytes go back to the system,
// largest first, and a failed mmap empties the cache and tries once more. Smaller allocations go
// to the allocator that was in place: glibc keeps and reuses those in its heap already.
//
// Each DataPtr's context is its data pointer and its deleter takes only that (raw_deleter()), as
// with libtorch's default allocator: oneDNN allocates through raw_allocate() and frees through
// the current allocator's raw deleter, so a pointer the cache never gave out (a small block, or
// one allocated before the cache was installed) goes to the previous allocator's deleter.

namespace dtrain {
namespace {

constexpr size_t kMinGranule = size_t{64} << 10;

size_t roundedSize(size_t n) {
  size_t power = 1;
  while (power <= n / 2) power <<= 1;  // the largest power of two <= n
  const size_t granule = std::max(kMinGranule, power / 16);
  return (n + granule - 1) / granule * granule;
}

size_t quarterOfMemory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long pageSize = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || pageSize <= 0) return size_t{1} << 30;
  return static_cast<size_t>(pages) * static_cast<size_t>(pageSize) / 4;
}

class HostMemoryCache final : public c10::Allocator {
 public:
  HostMemoryCache(c10::Allocator* previous, const HostMemoryCacheOptions& options)
      : previous_(previous), options_(options) {
    if (options_.maxCachedBytes == 0) options_.maxCachedBytes = quarterOfMemory();
  }

  c10::DataPtr allocate(size_t bytes) override {
    if (bytes < options_.minBytes) return previous_->allocate(bytes);
    void* data = take(bytes);
    return {data, data, &HostMemoryCache::release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &HostMemoryCache::release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  HostMemoryCacheStats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void empty() const {
    std::lock_guard<std::mutex> lock(mutex_);
    releaseDownTo(0);
  }

  static std::atomic<HostMemoryCache*> instance;

 private:
  static void release(void* data) {
    HostMemoryCache* cache = instance.load(std::memory_order_acquire);
    if (cache == nullptr || !cache->give(data)) {
      // Not a block of the cache: the previous allocator's (see the Note).
      c10::DeleterFnPtr deleter = cache ? cache->previous_->raw_deleter() : nullptr;
      if (deleter == nullptr) {
        DTRAIN_LOG(Error, "host memory cache: asked to free {} that no allocator can free",
                   data);
        std::abort();
      }
      deleter(data);
    }
  }

  void* take(size_t bytes) const {
    const size_t size = roundedSize(bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.lower_bound(size);
    if (it != free_.end() && it->first <= size + size / 8) {
      void* data = it->second;
      const size_t blockSize = it->first;
      free_.erase(it);
      stats_.cachedBytes -= blockSize;
      stats_.allocatedBytes += blockSize;
      ++stats_.hits;
      inUse_.emplace(data, blockSize);
      return data;
    }
    void* data = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED && !free_.empty()) {
      releaseDownTo(0);
      data = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    if (data == MAP_FAILED) {
      const int err = errno;
      DTRAIN_THROW(Error,
                   "host memory cache: cannot map {} bytes for a CPU tensor of {} bytes: {} ({} "
                   "bytes in tensors, the cache emptied). HINT: the machine or the job's memory "
                   "limit is exhausted: a smaller batch, activation recompute or ZeRO sharding "
                   "needs less",
                   size, bytes, std::strerror(err), stats_.allocatedBytes);
    }
    ++stats_.misses;
    stats_.allocatedBytes += size;
    stats_.peakReservedBytes =
        std::max(stats_.peakReservedBytes, stats_.allocatedBytes + stats_.cachedBytes);
    inUse_.emplace(data, size);
    return data;
  }

  // Takes `data` back into the free list; false when the cache did not give it out.
  bool give(void* data) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = inUse_.find(data);
    if (it == inUse_.end()) return false;
    const size_t size = it->second;
    inUse_.erase(it);
    stats_.allocatedBytes -= size;
    stats_.cachedBytes += size;
    free_.emplace(size, data);
    releaseDownTo(options_.maxCachedBytes);
    return true;
  }

  // Unmaps free blocks, largest first, until at most `limit` bytes are cached. Holds mutex_.
  void releaseDownTo(size_t limit) const {
    while (stats_.cachedBytes > limit && !free_.empty()) {
      auto last = std::prev(free_.end());
      ::munmap(last->second, last->first);
      stats_.cachedBytes -= last->first;
      ++stats_.released;
      free_.erase(last);
    }
  }

  c10::Allocator* const previous_;
  HostMemoryCacheOptions options_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<void*, size_t> inUse_;  // guarded by mutex_: data -> block size
  mutable std::multimap<size_t, void*> free_;        // guarded by mutex_: block size -> data
  mutable HostMemoryCacheStats stats_;               // guarded by mutex_
};

std::atomic<HostMemoryCache*> HostMemoryCache::instance{nullptr};

std::mutex& installMutex() {
  static auto* const mutex = new std::mutex;  // never destroyed, as the cache
  return *mutex;
}

}  // namespace

bool enableHostMemoryCache(const HostMemoryCacheOptions& options) {
  DTRAIN_CHECK_ARG(options.minBytes > 0, "enableHostMemoryCache: minBytes must be positive");
  std::lock_guard<std::mutex> lock(installMutex());
  if (HostMemoryCache::instance.load() != nullptr) return false;
  c10::Allocator* previous = c10::GetCPUAllocator();
  // Never destroyed: tensors may die during the process's exit, after any destructor ran.
  auto* cache = new HostMemoryCache(previous, options);
  HostMemoryCache::instance.store(cache, std::memory_order_release);
  // Priority 1: above libtorch's default (0), so that nothing installed at the default
  // priority later replaces it; an allocator installed before at a higher priority stays.
  c10::SetCPUAllocator(cache, /*priority=*/1);
  if (c10::GetCPUAllocator() != cache) {
    DTRAIN_LOG(Warn, "host memory cache: another CPU allocator of higher priority is installed; "
               "CPU tensors are not cached");
    return false;
  }
  return true;
}

bool hostMemoryCacheEnabled() {
  HostMemoryCache* cache = HostMemoryCache::instance.load();
  return cache != nullptr && c10::GetCPUAllocator() == cache;
}

HostMemoryCacheStats hostMemoryCacheStats() {
  HostMemoryCache* cache = HostMemoryCache::instance.load();
  return cache ? cache->stats() : HostMemoryCacheStats{};
}

void emptyHostMemoryCache() {
  if (HostMemoryCache* cache = HostMemoryCache::instance.load()) cache->empty();
}

}  // namespace dtrain
