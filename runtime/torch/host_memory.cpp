#include "dtrain/torch/host_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "host_memory_limit.h"
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
// And the blocks glibc does keep (below the grown threshold) fragment its heap: resident memory
// then exceeds the live tensor bytes by far.
//
// The cache: allocations of at least minBytes are rounded up to 1/16 of their power of two (at
// least 64 KiB) and served from segments the cache maps itself (mmap, so that giving one back
// returns its memory at once), as the CUDA caching allocator does for device memory:
//   - An allocation takes the smallest free block of at least its size (a resident one before a
//     trimmed one of the same size) and splits off the rest as a free block of its own when that
//     is minBytes or more; so shapes that vary (sequence lengths, an epoch's last batch) reuse
//     the memory of larger ones. With no free block large enough it maps a segment of its size.
//   - A freed block merges with the free blocks beside it in its segment.
//   - Freed memory goes back to the system in three cases, largest blocks first: past
//     maxCachedBytes; on a miss, past a slack of a quarter of the bytes in tensors plus 16 MiB
//     (the free blocks were all too small for that allocation, and would otherwise add to the
//     resident memory of the new segment); and blocks unused for idleSeconds. A free block that
//     is a whole segment is unmapped; one inside a segment is trimmed (madvise(MADV_DONTNEED)):
//     its pages go, its addresses stay for a later allocation, which faults them in again.
//   - A failed mmap unmaps every free segment and trims the rest, and tries once more.
// Training allocates the same shapes step after step, so after the first steps nearly every
// allocation is a hit on a resident block and nothing goes back. Smaller allocations go to the
// allocator that was in place: glibc keeps and reuses those in its heap already.
//
// Each DataPtr's context is its data pointer and its deleter takes only that (raw_deleter()), as
// with libtorch's default allocator: oneDNN allocates through raw_allocate() and frees through
// the current allocator's raw deleter, so a pointer the cache never gave out (a small block, or
// one allocated before the cache was installed) goes to the previous allocator's deleter.
//
// fork(): a child gets a copy of the cache's state as the parent's threads left it, with the
// mutex held if another thread was inside the cache, and would block on its first large tensor
// (data-loader workers fork). pthread_atfork handlers hold the mutex across the fork, so the
// state the child copies is consistent and its mutex free.

namespace dtrain {
namespace {

constexpr size_t kMinGranule = size_t{64} << 10;
constexpr size_t kMissSlack = size_t{16} << 20;

size_t roundedSize(size_t n) {
  size_t power = 1;
  while (power <= n / 2) power <<= 1;  // the largest power of two <= n
  const size_t granule = std::max(kMinGranule, power / 16);
  return (n + granule - 1) / granule * granule;
}

using Clock = std::chrono::steady_clock;

// A piece of a segment: in use by one tensor, or free. Blocks of a segment are linked in address
// order; a segment is one mmap.
struct Block {
  char* data = nullptr;
  size_t size = 0;
  bool free = false;
  // Of a free block: the bytes whose pages may be resident (all of a freed block; none of a
  // trimmed one; a split gives them to the part in front first).
  size_t resident = 0;
  bool wholeSegment() const { return prev == nullptr && next == nullptr; }
  Block* prev = nullptr;
  Block* next = nullptr;
  Clock::time_point freedAt{};
};

// Free blocks, smallest first; at one size, the most resident first, then by address.
struct BySize {
  bool operator()(const Block* a, const Block* b) const {
    if (a->size != b->size) return a->size < b->size;
    if (a->resident != b->resident) return a->resident > b->resident;
    return a->data < b->data;
  }
};

class HostMemoryCache final : public c10::Allocator {
 public:
  HostMemoryCache(c10::Allocator* previous, const HostMemoryCacheOptions& options)
      : previous_(previous), options_(options) {
    if (options_.maxCachedBytes == 0)
      options_.maxCachedBytes = host_memory::defaultMaxCachedBytes();
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
    releaseAll();
  }

  void resetPeaks() const {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peakAllocatedBytes = stats_.allocatedBytes;
    stats_.peakReservedBytes = stats_.reservedBytes;
  }

  const HostMemoryCacheOptions& options() const { return options_; }

  // pthread_atfork: the mutex is held across fork() (see the Note).
  void lockForFork() const { mutex_.lock(); }
  void unlockAfterFork() const { mutex_.unlock(); }

  static std::atomic<HostMemoryCache*> instance;

 private:
  static void release(void* data) {
    HostMemoryCache* cache = instance.load(std::memory_order_acquire);
    if (cache == nullptr || !cache->give(data)) {
      // Not a block of the cache: the previous allocator's (see the Note).
      c10::DeleterFnPtr deleter = cache ? cache->previous_->raw_deleter() : nullptr;
      if (deleter == nullptr) {
        DTRAIN_LOG(Error, "host memory cache: asked to free {} that no allocator can free", data);
        std::abort();
      }
      deleter(data);
    }
  }

  void* take(size_t bytes) const {
    const size_t size = roundedSize(bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    const Clock::time_point now = Clock::now();
    releaseIdle(now);
    Block probe;
    probe.size = size;
    probe.resident = ~size_t{0};
    auto it = free_.lower_bound(&probe);
    if (it != free_.end()) {
      Block* block = *it;
      free_.erase(it);
      stats_.cachedBytes -= block->resident;
      ++stats_.hits;
      if (block->size - size >= options_.minBytes) split(block, size);
      return use(block);
    }
    // A miss: what is free is too small for this allocation.
    shrinkCachedTo(std::min(options_.maxCachedBytes, stats_.allocatedBytes / 4 + kMissSlack));
    void* data = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED && !free_.empty()) {
      releaseAll();
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
    stats_.reservedBytes += size;
    auto* block = new Block;
    block->data = static_cast<char*>(data);
    block->size = size;
    return use(block);
  }

  // Hands out `block` (not in free_, not counted in cachedBytes).
  void* use(Block* block) const {
    block->free = false;
    block->resident = 0;
    stats_.allocatedBytes += block->size;
    stats_.peakAllocatedBytes = std::max(stats_.peakAllocatedBytes, stats_.allocatedBytes);
    stats_.peakReservedBytes = std::max(stats_.peakReservedBytes, stats_.reservedBytes);
    inUse_.emplace(block->data, block);
    return block->data;
  }

  // Cuts `block` (not in free_, not counted) to `size`; the rest becomes a free block after it.
  void split(Block* block, size_t size) const {
    auto* rest = new Block;
    rest->data = block->data + size;
    rest->size = block->size - size;
    rest->free = true;
    rest->resident = block->resident > size ? block->resident - size : 0;
    rest->freedAt = block->freedAt;
    rest->prev = block;
    rest->next = block->next;
    if (block->next) block->next->prev = rest;
    block->next = rest;
    block->size = size;
    stats_.cachedBytes += rest->resident;
    free_.insert(rest);
  }

  // Takes `data` back as a free block, merged with its free neighbours; false when the cache did
  // not give it out.
  bool give(void* data) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = inUse_.find(data);
    if (it == inUse_.end()) return false;
    Block* block = it->second;
    inUse_.erase(it);
    stats_.allocatedBytes -= block->size;
    block->free = true;
    block->resident = block->size;
    block->freedAt = Clock::now();
    if (block->prev && block->prev->free) block = merge(block->prev, block);
    if (block->next && block->next->free) block = merge(block, block->next);
    stats_.cachedBytes += block->resident;
    free_.insert(block);
    shrinkCachedTo(options_.maxCachedBytes);
    return true;
  }

  // Joins free `b` into `a` (its predecessor) and returns `a`, out of free_ and not counted in
  // cachedBytes (as the block just freed, one of the two, is).
  Block* merge(Block* a, Block* b) const {
    for (Block* x : {a, b}) {
      if (free_.erase(x) != 0) stats_.cachedBytes -= x->resident;
    }
    a->size += b->size;
    a->resident += b->resident;
    a->next = b->next;
    if (b->next) b->next->prev = a;
    a->freedAt = std::max(a->freedAt, b->freedAt);
    delete b;
    return a;
  }

  // Gives back the pages of free `block`: unmaps it when it is a whole segment, else trims it
  // (madvise: its pages go, its addresses stay).
  void giveBack(Block* block) const {
    free_.erase(block);
    stats_.cachedBytes -= block->resident;
    ++stats_.released;
    if (block->wholeSegment()) {
      ::munmap(block->data, block->size);
      stats_.reservedBytes -= block->size;
      delete block;
      return;
    }
    ::madvise(block->data, block->size, MADV_DONTNEED);
    block->resident = 0;
    free_.insert(block);
  }

  // Gives back free blocks with resident pages, largest first, until at most `limit` bytes are
  // cached.
  void shrinkCachedTo(size_t limit) const {
    while (stats_.cachedBytes > limit) {
      Block* largest = nullptr;
      for (auto it = free_.rbegin(); it != free_.rend() && largest == nullptr; ++it) {
        if ((*it)->resident > 0) largest = *it;
      }
      if (largest == nullptr) break;
      giveBack(largest);
    }
  }

  // Gives back the resident free blocks nothing used for idleSeconds; looks at most once a
  // second.
  void releaseIdle(Clock::time_point now) const {
    if (options_.idleSeconds <= 0 || now - lastIdleScan_ < std::chrono::seconds(1)) return;
    lastIdleScan_ = now;
    const auto idle = std::chrono::duration<double>(options_.idleSeconds);
    std::vector<Block*> old;
    for (Block* b : free_) {
      if (b->resident > 0 && now - b->freedAt >= idle) old.push_back(b);
    }
    for (Block* b : old) giveBack(b);
  }

  // Unmaps every free segment and trims every other free block.
  void releaseAll() const {
    std::vector<Block*> all(free_.begin(), free_.end());
    for (Block* b : all) {
      if (b->wholeSegment() || b->resident > 0) giveBack(b);
    }
  }

  c10::Allocator* const previous_;
  HostMemoryCacheOptions options_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<void*, Block*> inUse_;  // guarded by mutex_: data -> its block
  mutable std::set<Block*, BySize> free_;            // guarded by mutex_
  mutable HostMemoryCacheStats stats_;               // guarded by mutex_
  mutable Clock::time_point lastIdleScan_{};         // guarded by mutex_
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
  ::pthread_atfork([] { HostMemoryCache::instance.load()->lockForFork(); },
                   [] { HostMemoryCache::instance.load()->unlockAfterFork(); },
                   [] { HostMemoryCache::instance.load()->unlockAfterFork(); });
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

void resetHostMemoryCachePeaks() {
  if (HostMemoryCache* cache = HostMemoryCache::instance.load()) cache->resetPeaks();
}

size_t hostMemoryCacheLimit() {
  HostMemoryCache* cache = HostMemoryCache::instance.load();
  return cache ? cache->options().maxCachedBytes : 0;
}

namespace host_memory {

namespace {
std::string readFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}
}  // namespace

size_t memoryLimit(const std::string& procSelfCgroup, const std::string& cgroupRoot,
                   size_t physicalBytes) {
  size_t limit = physicalBytes;
  std::istringstream lines(procSelfCgroup);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("0::", 0) != 0) continue;  // cgroup v2's one hierarchy
    std::string path = line.substr(3);
    while (true) {
      const std::string value = readFirstLine(cgroupRoot + path + "/memory.max");
      if (!value.empty() && value != "max") {
        char* end = nullptr;
        const unsigned long long bytes = std::strtoull(value.c_str(), &end, 10);
        if (end != value.c_str() && bytes > 0) limit = std::min<size_t>(limit, bytes);
      }
      if (path.empty() || path == "/") break;
      const auto slash = path.find_last_of('/');
      path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
    }
  }
  return limit;
}

size_t defaultMaxCachedBytes(size_t limitBytes, int localRanks) {
  return limitBytes / 4 / static_cast<size_t>(std::max(1, localRanks));
}

size_t defaultMaxCachedBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long pageSize = ::sysconf(_SC_PAGESIZE);
  const size_t physical = pages > 0 && pageSize > 0
                              ? static_cast<size_t>(pages) * static_cast<size_t>(pageSize)
                              : size_t{4} << 30;
  std::ifstream in("/proc/self/cgroup");
  const std::string cgroups((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  int localRanks = 1;
  if (const char* v = std::getenv("LOCAL_WORLD_SIZE")) localRanks = std::atoi(v);
  return defaultMaxCachedBytes(memoryLimit(cgroups, "/sys/fs/cgroup", physical), localRanks);
}

}  // namespace host_memory

}  // namespace dtrain
