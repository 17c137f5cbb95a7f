// dtrain/torch/host_memory.h: freed CPU tensor blocks are handed out again without new page
// faults, small ones stay with libtorch's allocator, the cache is bounded and can be emptied, and
// raw allocations and frees from other threads go where they belong. Every test enables the cache
// with the same options (the first call in a process installs it), and reads differences of its
// counters, so the tests hold in one process as in one process each.
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

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

TEST(HostMemoryCache, NearSizesShareABlockAndFarOnesDoNot) {
  enable();
  emptyHostMemoryCache();
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  faultsOfATouchedTensor(8 * kMiB, &a);
  faultsOfATouchedTensor(8 * kMiB - 4096, &b);  // rounds to the same block size
  EXPECT_EQ(a, b);
  faultsOfATouchedTensor(4 * kMiB, &c);  // would waste half of the 8 MiB block
  EXPECT_NE(a, c);
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
  EXPECT_EQ(hostMemoryCacheStats().cachedBytes, 2 * kMiB);
  // A small raw block is the previous allocator's, and goes back to it.
  void* small = allocator->raw_allocate(4096);
  allocator->raw_deallocate(small);
  EXPECT_EQ(hostMemoryCacheStats().cachedBytes, 2 * kMiB);
  // A tensor freed on another thread (a data loader's batch) returns to the cache.
  torch::Tensor t = torch::empty({static_cast<int64_t>(4 * kMiB / sizeof(float))});
  std::thread([t = std::move(t)]() mutable { t = torch::Tensor(); }).join();
  EXPECT_EQ(hostMemoryCacheStats().cachedBytes, 6 * kMiB);
  EXPECT_EQ(hostMemoryCacheStats().allocatedBytes, start.allocatedBytes);
}

// The process's address space, for RLIMIT_AS below.
size_t mappedBytes() {
  std::ifstream in("/proc/self/statm");
  size_t pages = 0;
  in >> pages;
  return pages * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
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
  tight.rlim_cur = mappedBytes() + 64 * kMiB;
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

}  // namespace
}  // namespace dtrain::host_memory_test
