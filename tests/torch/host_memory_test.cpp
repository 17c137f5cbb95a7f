// dtrain/torch/host_memory.h: freed CPU tensor blocks are handed out again without new page
// faults, small ones stay with libtorch's allocator, the cache is bounded and can be emptied, and
// raw allocations and frees from other threads go where they belong; larger free blocks serve
// smaller shapes and merge again, resident memory stays near the live bytes when shapes vary,
// idle blocks go back, the default limit follows the cgroup and the node's ranks, and fork() is
// safe. Every test enables the cache
// with the same options (the first call in a process installs it), and reads differences of its
// counters, so the tests hold in one process as in one process each.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../../runtime/torch/host_memory_limit.h"
#include "dtrain/torch/host_memory.h"

namespace dtrain::host_memory_test {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kLimit = 96 * kMiB;

void enable() {
  HostMemoryCacheOptions options;
  options.minBytes = kMiB;
  options.maxCachedBytes = kLimit;
  enableHostMemoryCache(options);
  ASSERT_TRUE(hostMemoryCacheEnabled());
}

long minorFaults() {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Page faults of allocating a float tensor of `bytes` and writing every element.
long faultsOfATouchedTensor(size_t bytes, void** data = nullptr) {
  const long before = minorFaults();
  torch::Tensor t = torch::empty({static_cast<int64_t>(bytes / sizeof(float))});
  t.fill_(1.0f);
  if (data != nullptr) *data = t.data_ptr();
  return minorFaults() - before;
}

// Transparent huge pages for every mapping would fault once per 2 MiB, fresh or not.
bool hugePagesAlways() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text.find("[always]") != std::string::npos;
}

TEST(HostMemoryCache, AFreedBlockIsHandedOutAgainWithoutPageFaults) {
  if (hugePagesAlways()) GTEST_SKIP() << "transparent huge pages are on for every mapping";
  const size_t bytes = 48 * kMiB;  // above glibc's largest mmap threshold (32 MiB)
  const long pages = static_cast<long>(bytes / 4096);
  // libtorch's own allocator, for contrast: the block is unmapped when freed and mapped afresh.
  {
    c10::Allocator* plain = c10::GetDefaultCPUAllocator();
    for (int i = 0; i < 2; ++i) {
      const long before = minorFaults();
      c10::DataPtr block = plain->allocate(bytes);
      std::memset(block.get(), 1, bytes);
      EXPECT_GT(minorFaults() - before, pages / 2) << "malloc kept the block: no contrast here";
    }
  }
  enable();
  const HostMemoryCacheStats start = hostMemoryCacheStats();
  void* first = nullptr;
  void* second = nullptr;
  EXPECT_GT(faultsOfATouchedTensor(bytes, &first), pages / 2) << "a new block is mapped";
  const long again = faultsOfATouchedTensor(bytes, &second);
  EXPECT_LT(again, pages / 20) << "the freed block came back with its pages";
  EXPECT_EQ(first, second);
  const HostMemoryCacheStats end = hostMemoryCacheStats();
  EXPECT_EQ(end.misses - start.misses, 1u);
  EXPECT_EQ(end.hits - start.hits, 1u);
  EXPECT_GE(end.cachedBytes, bytes);
  EXPECT_GE(end.peakReservedBytes, bytes);
}

TEST(HostMemoryCache, SmallAllocationsStayWithThePreviousAllocator) {
  enable();
  const HostMemoryCacheStats start = hostMemoryCacheStats();
  { torch::Tensor t = torch::ones({1000}); }
  { torch::Tensor t = torch::ones({static_cast<int64_t>(kMiB / sizeof(float)) - 1}); }
  const HostMemoryCacheStats end = hostMemoryCacheStats();
  EXPECT_EQ(end.hits, start.hits);
  EXPECT_EQ(end.misses, start.misses);
  EXPECT_EQ(end.allocatedBytes, start.allocatedBytes);
}

TEST(HostMemoryCache, FreedBlocksBeyondTheLimitGoBackAndEmptyingReturnsTheRest) {
  enable();
  emptyHostMemoryCache();
  const HostMemoryCacheStats start = hostMemoryCacheStats();
  {
    auto make = [](size_t bytes) {
      return torch::empty({static_cast<int64_t>(bytes / sizeof(float))});
    };
    torch::Tensor a = make(64 * kMiB), b = make(40 * kMiB), c = make(8 * kMiB);
    EXPECT_GE(hostMemoryCacheStats().allocatedBytes - start.allocatedBytes, 112 * kMiB);
  }  // 112 MiB freed into a cache of at most 96 MiB
  HostMemoryCacheStats s = hostMemoryCacheStats();
  EXPECT_LE(s.cachedBytes, kLimit);
  EXPECT_GE(s.released - start.released, 1u);
  EXPECT_GT(s.cachedBytes, 0u);
  emptyHostMemoryCache();
  s = hostMemoryCacheStats();
  EXPECT_EQ(s.cachedBytes, 0u);
  EXPECT_EQ(s.allocatedBytes, start.allocatedBytes);
}

TEST(HostMemoryCache, RawAllocationsAndFreesFromAnotherThreadComeBack) {
  enable();
  emptyHostMemoryCache();
  c10::Allocator* allocator = c10::GetCPUAllocator();
  // raw_allocate / raw_deallocate, as oneDNN uses them.
  const HostMemoryCacheStats start = hostMemoryCacheStats();
  void* raw = allocator->raw_allocate(2 * kMiB);
  EXPECT_EQ(hostMemoryCacheStats().allocatedBytes - start.allocatedBytes, 2 * kMiB);
  allocator->raw_deallocate(raw);
  EXPECT_EQ(hostMemoryCacheStats().allocatedBytes, start.allocatedBytes);
  EXPECT_GE(hostMemoryCacheStats().cachedBytes, 2 * kMiB);
  // A small raw block is the previous allocator's, and goes back to it.
  const size_t cached = hostMemoryCacheStats().cachedBytes;
  void* small = allocator->raw_allocate(4096);
  allocator->raw_deallocate(small);
  EXPECT_EQ(hostMemoryCacheStats().cachedBytes, cached);
  // A tensor freed on another thread (a data loader's batch) returns to the cache.
  torch::Tensor t = torch::empty({static_cast<int64_t>(4 * kMiB / sizeof(float))});
  EXPECT_EQ(hostMemoryCacheStats().allocatedBytes - start.allocatedBytes, 4 * kMiB);
  std::thread([t = std::move(t)]() mutable { t = torch::Tensor(); }).join();
  EXPECT_GE(hostMemoryCacheStats().cachedBytes, 4 * kMiB);
  EXPECT_EQ(hostMemoryCacheStats().allocatedBytes, start.allocatedBytes);
}

// The process's address space (for RLIMIT_AS below) and its resident set, from /proc/self/statm.
struct Statm {
  size_t mapped = 0;
  size_t resident = 0;
};
Statm statm() {
  std::ifstream in("/proc/self/statm");
  Statm pages;
  in >> pages.mapped >> pages.resident;
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return {pages.mapped * page, pages.resident * page};
}

// A limit on the address space makes mmap fail as a full machine does: the cache gives its free
// blocks back and tries again, and when even that cannot fit, the error says what and what to do.
TEST(HostMemoryCache, AnAllocationThatDoesNotFitEmptiesTheCacheThenFailsClearly) {
  enable();
  emptyHostMemoryCache();
  auto make = [](size_t bytes) {
    return torch::empty({static_cast<int64_t>(bytes / sizeof(float))});
  };
  { torch::Tensor a = make(40 * kMiB), b = make(40 * kMiB); }  // 80 MiB cached
  ASSERT_EQ(hostMemoryCacheStats().cachedBytes, 80 * kMiB);
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_AS, &old), 0);
  struct rlimit tight = old;
  tight.rlim_cur = statm().mapped + 64 * kMiB;
  ASSERT_EQ(::setrlimit(RLIMIT_AS, &tight), 0);
  std::string message;
  size_t cachedAfterRetry = 1;
  try {
    // 96 MiB fits only once the 80 cached MiB are gone.
    { torch::Tensor big = make(96 * kMiB); }
    cachedAfterRetry = hostMemoryCacheStats().cachedBytes;
    emptyHostMemoryCache();
    torch::Tensor tooBig = make(512 * kMiB);
  } catch (const std::exception& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_AS, &old);
  EXPECT_EQ(cachedAfterRetry, 96 * kMiB) << "the 96 MiB block, freed; the 80 MiB given back";
  EXPECT_NE(message.find("host memory cache: cannot map"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT"), std::string::npos) << message;
}

TEST(HostMemoryCache, TrainingGivesTheSameNumbersWithAndWithoutIt) {
  // The same seeded steps of a small MLP, before and after the cache is on in this process
  // (another test may have enabled it already: then both runs use it, and agree too).
  auto run = [] {
    torch::manual_seed(7);
    torch::nn::Sequential model(torch::nn::Linear(512, 1024), torch::nn::ReLU(),
                                torch::nn::Linear(1024, 256));
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    torch::Tensor x = torch::randn({512, 512});
    for (int step = 0; step < 3; ++step) {
      sgd.zero_grad();
      model->forward(x).pow(2).mean().backward();
      sgd.step();
    }
    std::vector<torch::Tensor> out;
    for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
    return out;
  };
  const auto before = run();
  enable();
  const auto after = run();
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(torch::equal(before[i], after[i])) << i;
}

// The suites below install the cache with options of their own: ctest runs each suite in a
// process of its own; in a process where another suite installed it first they skip, saying so.
#define DTRAIN_ENABLE_OR_SKIP(options)                        \
  if (!enableHostMemoryCache(options))                        \
  GTEST_SKIP() << "the cache was installed by another suite " \
                  "of this process: run this suite alone"

// A block of `bytes` from the installed CPU allocator, every page written.
c10::DataPtr touched(size_t bytes) {
  c10::DataPtr block = c10::GetCPUAllocator()->allocate(bytes);
  std::memset(block.get(), 1, bytes);
  return block;
}

// A smaller allocation takes the front of a larger free block and leaves the rest free for the
// next; freed, the two merge into the block they came from, which a request of its whole size
// gets back with its pages.
TEST(HostMemoryCacheBlocks, ASmallerAllocationSplitsAFreeBlockAndFreedNeighboursMerge) {
  HostMemoryCacheOptions options;
  options.maxCachedBytes = 256 * kMiB;
  DTRAIN_ENABLE_OR_SKIP(options);
  char* whole = nullptr;
  {
    c10::DataPtr a = touched(8 * kMiB);
    whole = static_cast<char*>(a.get());
  }
  const HostMemoryCacheStats start = hostMemoryCacheStats();
  {
    c10::DataPtr front = touched(3 * kMiB);
    c10::DataPtr back = touched(5 * kMiB);
    EXPECT_EQ(front.get(), whole);
    EXPECT_EQ(back.get(), whole + 3 * kMiB);
    EXPECT_EQ(hostMemoryCacheStats().reservedBytes, start.reservedBytes) << "nothing mapped";
  }
  const long before = minorFaults();
  c10::DataPtr again = touched(8 * kMiB);
  EXPECT_LT(minorFaults() - before, 8 * 256 / 20) << "the merged block came back with its pages";
  EXPECT_EQ(again.get(), whole);
  const HostMemoryCacheStats end = hostMemoryCacheStats();
  EXPECT_EQ(end.misses, start.misses);
  EXPECT_EQ(end.hits - start.hits, 3u);
}

// Shapes that vary (sequence lengths, an epoch's last batch): eight tensors alive at a time, each
// step one replaced by another of a random size in [0.5, 1] x the largest. Resident memory stays
// within 1.5 x the most bytes alive at once + 64 MiB: freed memory is reused by smaller shapes and
// what no allocation fits goes back.
TEST(HostMemoryCacheVaryingShapes, ResidentMemoryStaysNearTheLiveBytes) {
  HostMemoryCacheOptions options;
  options.maxCachedBytes = size_t{4} << 30;  // far above: the varying shapes alone must bound it
  DTRAIN_ENABLE_OR_SKIP(options);
  const size_t largest = 32 * kMiB;
  std::mt19937_64 random(42);
  std::uniform_int_distribution<size_t> size(largest / 2, largest);
  std::uniform_int_distribution<size_t> which(0, 7);
  const size_t baseline = statm().resident;
  std::vector<std::pair<c10::DataPtr, size_t>> live;
  size_t liveBytes = 0, peakLive = 0, peakResident = 0;
  for (int step = 0; step < 300; ++step) {
    if (live.size() == 8) {
      const size_t k = which(random);
      liveBytes -= live[k].second;
      live.erase(live.begin() + static_cast<long>(k));
    }
    const size_t bytes = size(random) / 4096 * 4096;
    live.emplace_back(touched(bytes), bytes);
    liveBytes += bytes;
    peakLive = std::max(peakLive, liveBytes);
    const size_t resident = statm().resident;
    peakResident = std::max(peakResident, resident > baseline ? resident - baseline : 0);
  }
  const HostMemoryCacheStats stats = hostMemoryCacheStats();
  std::cout << "varying shapes: peak live " << peakLive / kMiB << " MiB, peak resident added "
            << peakResident / kMiB << " MiB, reserved peak " << stats.peakReservedBytes / kMiB
            << " MiB, hits " << stats.hits << ", misses " << stats.misses << ", released "
            << stats.released << "\n";
  EXPECT_LE(peakResident, peakLive * 3 / 2 + 64 * kMiB);
  EXPECT_GT(stats.hits, stats.misses) << "freed memory is reused";
}

// Freed blocks unused for idleSeconds go back at the cache's next use.
TEST(HostMemoryCacheIdle, BlocksUnusedForIdleSecondsGoBack) {
  HostMemoryCacheOptions options;
  options.maxCachedBytes = 256 * kMiB;
  options.idleSeconds = 0.5;
  DTRAIN_ENABLE_OR_SKIP(options);
  { c10::DataPtr a = touched(16 * kMiB); }
  { c10::DataPtr b = touched(2 * kMiB); }  // served from the free 16 MiB: not idle yet
  EXPECT_EQ(hostMemoryCacheStats().cachedBytes, 16 * kMiB);
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  const HostMemoryCacheStats before = hostMemoryCacheStats();
  { c10::DataPtr c = touched(2 * kMiB); }  // the next use finds the 16 MiB idle
  const HostMemoryCacheStats after = hostMemoryCacheStats();
  EXPECT_GE(after.released - before.released, 1u);
  EXPECT_EQ(after.reservedBytes, 2 * kMiB) << "the idle segment unmapped; c's block mapped anew";
  EXPECT_EQ(after.cachedBytes, 2 * kMiB);
}

// The default limit: a quarter of the memory the process may use -- the machine's, or a cgroup
// v2 memory.max on the way up from its cgroup when lower -- divided among the node's ranks.
TEST(HostMemoryCacheLimit, TheCgroupsLimitSharedAmongTheLocalRanks) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("dtrain_cgroup_" + std::to_string(::getpid()));
  fs::create_directories(root / "job" / "rank");
  auto write = [](const fs::path& file, const std::string& text) { std::ofstream(file) << text; };
  const size_t gib = size_t{1} << 30;
  using host_memory::memoryLimit;
  EXPECT_EQ(memoryLimit("0::/job/rank\n", root.string(), 64 * gib), 64 * gib) << "no files";
  write(root / "job" / "rank" / "memory.max", "max\n");
  write(root / "job" / "memory.max", "8589934592\n");
  EXPECT_EQ(memoryLimit("0::/job/rank\n", root.string(), 64 * gib), 8 * gib) << "a parent's";
  write(root / "job" / "rank" / "memory.max", "2147483648\n");
  EXPECT_EQ(memoryLimit("0::/job/rank\n", root.string(), 64 * gib), 2 * gib) << "its own";
  EXPECT_EQ(memoryLimit("0::/job/rank\n", root.string(), gib), gib) << "the machine's, lower";
  EXPECT_EQ(memoryLimit("12:memory:/job/rank\n", root.string(), 64 * gib), 64 * gib)
      << "cgroup v1 lines are not read";
  EXPECT_EQ(host_memory::defaultMaxCachedBytes(8 * gib, 4), gib / 2);
  EXPECT_EQ(host_memory::defaultMaxCachedBytes(8 * gib, 0), 2 * gib);
  fs::remove_all(root);

  // This process: LOCAL_WORLD_SIZE=4, as launch sets it for four ranks on a node.
  ::setenv("LOCAL_WORLD_SIZE", "4", 1);
  DTRAIN_ENABLE_OR_SKIP(HostMemoryCacheOptions{});
  ::unsetenv("LOCAL_WORLD_SIZE");
  std::ifstream in("/proc/self/cgroup");
  const std::string cgroups((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t machine = static_cast<size_t>(::sysconf(_SC_PHYS_PAGES)) *
                         static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  EXPECT_EQ(hostMemoryCacheLimit(), memoryLimit(cgroups, "/sys/fs/cgroup", machine) / 16);
  EXPECT_LE(hostMemoryCacheLimit(), machine / 16);
}

// fork() while another thread is inside the cache (a data loader forking its workers): every
// child gets a usable cache -- it allocates a large block and exits -- none blocks on a mutex
// the other thread held.
TEST(HostMemoryCacheFork, AChildForkedWhileAnotherThreadAllocatesCanAllocate) {
  HostMemoryCacheOptions options;
  options.maxCachedBytes = 64 * kMiB;
  DTRAIN_ENABLE_OR_SKIP(options);
  std::atomic<bool> stop{false};
  std::thread allocating([&] {
    for (size_t i = 0; !stop.load(); ++i) {
      c10::DataPtr block = c10::GetCPUAllocator()->allocate((1 + i % 7) * kMiB);
    }
  });
  int hung = 0, failed = 0;
  for (int i = 0; i < 30 && hung < 2; ++i) {  // two hung children say enough
    const pid_t child = ::fork();
    if (child == 0) {
      c10::DataPtr block = c10::GetCPUAllocator()->allocate(4 * kMiB);
      std::memset(block.get(), 1, 4 * kMiB);
      block.clear();
      ::_exit(0);
    }
    ASSERT_GT(child, 0);
    int status = 0;
    pid_t done = 0;
    for (int waited = 0; waited < 500 && done == 0; ++waited) {  // up to 5 s
      done = ::waitpid(child, &status, WNOHANG);
      if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (done == 0) {
      ++hung;
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failed;
    }
  }
  stop = true;
  allocating.join();
  EXPECT_EQ(hung, 0) << "children blocked on their first large allocation";
  EXPECT_EQ(failed, 0);
}

}  // namespace
}  // namespace dtrain::host_memory_test
