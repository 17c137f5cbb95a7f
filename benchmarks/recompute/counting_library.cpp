// librecompute_counting.so: the counting CPU allocator of the tests (testing/counting_allocator.h)
// as a library of its own, so that a benchmark's two sides count CPU tensor storage bytes the
// same way. Two ways in:
//   - ctypes, after `import torch` (the same libc10 as this build's): recompute_peer.py,
//     zero_peer.py and gpt_peer.py call the functions at the end of this file.
//   - DTRAIN_COUNTING_PEAK_FILE=PREFIX in the environment: the library installs the allocator as
//     it is loaded and, when the process exits, writes the whole run's peak to PREFIX.<RANK>. See
//     Note [Counting a whole program] and Note [Communicator buffers].
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "counting_allocator.h"
#include "dtrain/comm/communicator.h"  // Buffer (its virtual functions only: nothing is linked)

// Note [Counting a whole program]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// gpt_bench counts train_gpt's tensor bytes without a line of train_gpt changed: it starts it with
// LD_PRELOAD=librecompute_counting.so and DTRAIN_COUNTING_PEAK_FILE=PREFIX. The dynamic loader
// runs libc10's initializers (which register the default CPU allocator) before this library's,
// and this library's before main(), so the counting allocator is in place before the program's
// first tensor. Installed at priority 100, it stays in front: dtrain::init() enables its host
// memory cache only over libtorch's default allocator, so the counted run allocates with plain
// posix_memalign, as the peer (gpt_peer.py --counting-lib, which loads this library right after
// `import torch`) does. The peak is the whole run's, start-up included, as an OOM kill sees it.
// Written when the process exits normally (main returns, or it calls exit; not a crash), by the
// process that loaded the library only (a forked child inherits the handler, not the file); a
// process that leaves by _exit(), skipping the handlers, calls dtrain_counting_write_peak()
// first (gpt_peer.py skips the interpreter's teardown so).
// PREFIX.<RANK> holds one JSON object: peak_bytes (tensor storage and communicator buffers
// together, at one moment), tensor_peak_bytes (libtorch's allocator alone) and buffer_peak_bytes
// (the buffers alone); RANK is the variable launch and torchrun set (0 without it). Written to
// PREFIX.<RANK>.tmp and renamed, so a reader sees all or nothing.

// Note [Communicator buffers]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// dtrain keeps some tensors' storage in its communicator's memory, which libtorch's allocator
// never sees: DDP's gradient buckets (the gradients are views of them), ZeRO-3's gathered units and
// gradient buckets, the units of a model built whole (docs/design.md, "Communication buffers").
// PyTorch's DDP and FSDP2 hold the same in tensors, so a count without them is ours short. Over
// Gloo this memory comes from HostBufferPool (runtime/comm/host_buffer_pool.h), whose allocate()
// and release() libdtrain_comm.so calls through its PLT: preloaded, this library defines both
// ahead of it, forwards each call to the next definition (dlsym RTLD_NEXT) and counts the bytes
// handed out and not released yet. The peak of the two together is exact (but for another
// thread's allocation in the instant between peak() and resetPeak()): at every buffer event the
// tensor peak since the previous event is added to the buffer bytes live over that interval, and
// the allocator's peak starts again. Not counted: the pool's cache of released buffers (resident,
// in no tensor), and the shared-memory backend's arena (gpt_bench's memory pass runs dtrain over
// Gloo).
// A process that never calls the pool (a Python peer) writes its tensor peak alone, and
// buffer_peak_bytes 0. For train_gpt a 0 would say that these functions were never reached
// (renamed, or bound inside libdtrain_comm.so): gpt_bench stops there.

namespace {

using dtrain::testing::CountingCpuAllocator;

constexpr const char* kPeakFileVariable = "DTRAIN_COUNTING_PEAK_FILE";

// What this process holds, tensors and communicator buffers together. Guarded by mutex.
struct Totals {
  std::mutex mutex;
  bool buffersCounted = false;   // set once, by the constructor below
  int64_t bufferBytes = 0;       // handed out by the pool, not released
  int64_t bufferPeak = 0;        // the most bufferBytes at once
  int64_t tensorPeak = 0;        // the allocator's peaks before its resets
  int64_t peak = 0;              // the most tensor + buffer bytes at once
  int64_t windowTensorPeak = 0;  // the same two since dtrain_counting_window_start
  int64_t windowPeak = 0;
  std::unordered_map<void*, int64_t> buffers;  // data -> bytes counted
  std::string path;                            // PREFIX.<RANK>
  pid_t pid = 0;                               // the process that writes it
};

// A function-local static: the constructor below runs before this file's namespace-scope objects
// are initialised. Never destroyed: the exit handler reads it.
Totals& totals() {
  static Totals* t = new Totals();
  return *t;
}

// Closes the interval since the last buffer event (the caller holds the mutex).
void closeInterval(Totals& t, CountingCpuAllocator& a) {
  const int64_t tensorPeak = a.peak();
  t.tensorPeak = std::max(t.tensorPeak, tensorPeak);
  t.peak = std::max(t.peak, tensorPeak + t.bufferBytes);
  t.windowTensorPeak = std::max(t.windowTensorPeak, tensorPeak);
  t.windowPeak = std::max(t.windowPeak, tensorPeak + t.bufferBytes);
  a.resetPeak();
}

void addBuffer(void* data, int64_t bytes) {
  Totals& t = totals();
  std::lock_guard<std::mutex> lock(t.mutex);
  if (!t.buffersCounted) return;
  closeInterval(t, CountingCpuAllocator::install());
  t.buffers[data] = bytes;
  t.bufferBytes += bytes;
  t.bufferPeak = std::max(t.bufferPeak, t.bufferBytes);
}

void removeBuffer(void* data) {
  Totals& t = totals();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.buffers.find(data);
  if (it == t.buffers.end()) return;
  closeInterval(t, CountingCpuAllocator::install());
  t.bufferBytes -= it->second;
  t.buffers.erase(it);
}

void* next(const char* symbol) {
  void* f = ::dlsym(RTLD_NEXT, symbol);
  if (f == nullptr) {
    std::fprintf(stderr,
                 "librecompute_counting: %s is called but no library after this one "
                 "defines it\n",
                 symbol);
    std::abort();
  }
  return f;
}

void writePeak() {
  Totals& t = totals();
  std::lock_guard<std::mutex> lock(t.mutex);
  if (t.path.empty() || ::getpid() != t.pid) return;
  closeInterval(t, CountingCpuAllocator::install());
  const std::string tmp = t.path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  const bool written = f != nullptr &&
                       std::fprintf(f,
                                    "{\"peak_bytes\": %lld, \"tensor_peak_bytes\": %lld, "
                                    "\"buffer_peak_bytes\": %lld}\n",
                                    static_cast<long long>(t.peak),
                                    static_cast<long long>(t.tensorPeak),
                                    static_cast<long long>(t.bufferPeak)) > 0;
  if (f == nullptr || std::fclose(f) != 0 || !written ||
      std::rename(tmp.c_str(), t.path.c_str()) != 0) {
    std::fprintf(stderr, "librecompute_counting: cannot write %s (%s); the peak was %lld bytes\n",
                 t.path.c_str(), kPeakFileVariable, static_cast<long long>(t.peak));
  }
}

__attribute__((constructor)) void installFromEnvironment() {
  const char* prefix = std::getenv(kPeakFileVariable);
  if (prefix == nullptr || *prefix == '\0') return;
  const char* rank = std::getenv("RANK");  // launch's and torchrun's
  CountingCpuAllocator::install();
  Totals& t = totals();
  t.path = std::string(prefix) + "." + (rank != nullptr && *rank ? rank : "0");
  t.pid = ::getpid();
  t.buffersCounted = true;
  std::atexit(writePeak);
}

}  // namespace

// HostBufferPool::allocate(size_t) and HostBufferPool::release(void*, size_t), by their symbols:
// as free functions taking the pool first they are called as the members are (the Itanium C++
// ABI passes `this` first, after a returned object's slot). See Note [Communicator buffers].
std::shared_ptr<dtrain::comm::Buffer> countedPoolAllocate(void* pool, size_t bytes) __asm__(
    "_ZN6dtrain4comm14HostBufferPool8allocateEm");
void countedPoolRelease(void* pool, void* data,
                        size_t capacity) __asm__("_ZN6dtrain4comm14HostBufferPool7releaseEPvm");

std::shared_ptr<dtrain::comm::Buffer> countedPoolAllocate(void* pool, size_t bytes) {
  using Allocate = std::shared_ptr<dtrain::comm::Buffer> (*)(void*, size_t);
  static const auto inner = reinterpret_cast<Allocate>(
      next("_ZN6dtrain4comm14HostBufferPool8allocateEm"));
  std::shared_ptr<dtrain::comm::Buffer> buffer = inner(pool, bytes);
  addBuffer(buffer->data(), static_cast<int64_t>(buffer->bytes()));
  return buffer;
}

void countedPoolRelease(void* pool, void* data, size_t capacity) {
  using Release = void (*)(void*, void*, size_t);
  static const auto inner = reinterpret_cast<Release>(
      next("_ZN6dtrain4comm14HostBufferPool7releaseEPvm"));
  removeBuffer(data);
  inner(pool, data, capacity);
}

extern "C" {

void dtrain_counting_install() { CountingCpuAllocator::install(); }
int64_t dtrain_counting_live() { return CountingCpuAllocator::install().live(); }
int64_t dtrain_counting_peak() {
  Totals& t = totals();
  std::lock_guard<std::mutex> lock(t.mutex);
  return std::max(t.tensorPeak, CountingCpuAllocator::install().peak());
}
// What the exit handler writes (DTRAIN_COUNTING_PEAK_FILE), now: for a process that leaves with
// _exit() and skips the handlers (a Python peer skipping the interpreter's teardown).
void dtrain_counting_write_peak() { writePeak(); }
// A window of a program that preloads this library with DTRAIN_COUNTING_PEAK_FILE set (so that
// buffers are counted): zero_bench's worker measures a training step so (Note [Peak in a step] in
// benchmarks/zero/zero_bench_worker.cpp). Start, then read the most tensor bytes alive at once
// and the most tensor and buffer bytes at one moment since; -1 for both where buffers are not
// counted. The whole run's figures are not touched.
void dtrain_counting_window_start() {
  Totals& t = totals();
  std::lock_guard<std::mutex> lock(t.mutex);
  CountingCpuAllocator& a = CountingCpuAllocator::install();
  closeInterval(t, a);
  t.windowTensorPeak = a.live();
  t.windowPeak = a.live() + t.bufferBytes;
}
void dtrain_counting_window_peaks(int64_t* tensorPeak, int64_t* peak) {
  Totals& t = totals();
  std::lock_guard<std::mutex> lock(t.mutex);
  if (!t.buffersCounted) {
    *tensorPeak = *peak = -1;
    return;
  }
  closeInterval(t, CountingCpuAllocator::install());
  *tensorPeak = t.windowTensorPeak;
  *peak = t.windowPeak;
}
void dtrain_counting_reset_peak() {
  Totals& t = totals();
  std::lock_guard<std::mutex> lock(t.mutex);
  CountingCpuAllocator::install().resetPeak();
  t.tensorPeak = 0;
}
}
