#pragma once
// A caching allocator for libtorch's CPU tensors: freed blocks of 1 MiB and more are kept and
// handed out again instead of going back to the system.
//
//   dtrain::enableHostMemoryCache();  // first thing in main(), before the model is built
//
// Why (docs/training.md "Host memory cache"): libtorch's CPU allocator is malloc, and glibc serves
// every block above its mmap threshold (at most 32 MiB) with a fresh mmap and gives it back with
// munmap when the tensor dies. A training step allocates its activations and gradients anew every
// step, so every step touches fresh pages again: a page fault per 4 KiB. Recompute doubles it (the
// recomputed activations are allocated a second time), which is most of what recompute costs beyond
// its extra forward (benchmarks/README.md, recompute_bench). The CUDA side has had a caching
// allocator in libtorch all along; this is its counterpart for host memory.
//
// What it changes: freed blocks stay mapped for the next allocation that fits in them (a larger
// block is split; neighbours merge again when freed), so the process's resident memory stays
// near its peak of live tensor bytes instead of going down between steps and coming back with
// fresh pages. Freed memory goes back to the system past maxCachedBytes, when an allocation finds
// nothing large enough while much is free (varying shapes), and after idleSeconds unused.
// emptyHostMemoryCache() gives every freed block back. Safe across fork() (a data loader's
// workers): the child's cache is usable.

#include <cstddef>
#include <cstdint>

namespace dtrain {

struct HostMemoryCacheOptions {
  // Smaller allocations go to the allocator that was in place before (malloc keeps and reuses
  // those itself).
  size_t minBytes = size_t{1} << 20;
  // At most this many bytes of freed blocks are kept; past it the largest go back to the system.
  // 0: a quarter of the memory this process may use (the machine's, or its cgroup's memory.max
  // when lower), divided among the ranks of its node (LOCAL_WORLD_SIZE).
  size_t maxCachedBytes = 0;
  // Freed blocks unused this long go back to the system (checked at most once a second, when
  // the cache is used); 0: never.
  double idleSeconds = 60;
};

struct HostMemoryCacheStats {
  size_t allocatedBytes = 0;      // blocks held by tensors now (their rounded sizes)
  size_t peakAllocatedBytes = 0;  // the most allocatedBytes at once
  size_t cachedBytes = 0;         // freed bytes kept for reuse with their pages
  size_t reservedBytes = 0;       // mapped by the cache: allocated, cached, and freed pages given
                                  // back inside a mapping still in use
  size_t peakReservedBytes = 0;   // the most reservedBytes at once
  uint64_t hits = 0;              // allocations served from freed memory
  uint64_t misses = 0;            // allocations that mapped new memory
  uint64_t released = 0;          // freed blocks whose pages went back to the system
};

// Installs the cache as libtorch's CPU allocator for this process, in front of the allocator in
// place (which keeps serving the small allocations); storage allocated before stays with the
// allocator that made it. Once per process: a second call changes nothing and returns false, as
// does a call when an allocator of higher priority was installed before (then nothing is
// cached). Returns true when it was installed.
bool enableHostMemoryCache(const HostMemoryCacheOptions& options = {});
bool hostMemoryCacheEnabled();
HostMemoryCacheStats hostMemoryCacheStats();
// Gives every freed block back to the system (the blocks in use stay).
void emptyHostMemoryCache();
// Sets the peaks of hostMemoryCacheStats() to the values of now (to measure a step's).
void resetHostMemoryCachePeaks();
// The cache's maxCachedBytes (its default resolved); 0 when it is not installed.
size_t hostMemoryCacheLimit();

}  // namespace dtrain
