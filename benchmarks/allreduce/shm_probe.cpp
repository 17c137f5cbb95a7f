// shm_probe: the bare probe of the shared-memory allreduce, allreduce_bench's ceiling. Started by
// the benchmark (peer_process.h protocol) as `shm_probe DIR WORLD MAXBYTES`; forks WORLD workers
// that share one anonymous mapping and run the same algorithm as dtrain's shared-memory path --
// reduce-scatter (rank r sums slice r of every rank's buffer), then allgather -- with nothing
// else: plain loops, spin barriers (they yield the CPU only when the ranks outnumber the cores),
// no chunking, no checks, no failure handling, float32 sums only.
//
// Modes: "owned": each rank's buffer lives in the shared mapping (two barriers per call); "copy":
// each rank's buffer is private and is copied in, reduced, and gathered back out (three barriers:
// the copy in must not overwrite what a slower peer is still gathering).
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/stats.h"

namespace {

struct alignas(64) Counter {
  std::atomic<uint64_t> phase{0};
  char pad[56];
};

struct Probe {
  int rank = 0;
  int world = 1;
  bool yield = false;
  uint64_t phase = 0;
  Counter* counters = nullptr;
  float* segment = nullptr;  // world buffers of `capacity` floats
  size_t capacity = 0;

  float* bufferOf(int r) const { return segment + static_cast<size_t>(r) * capacity; }

  void barrier() {
    ++phase;
    counters[rank].phase.store(phase, std::memory_order_release);
    for (int j = 0; j < world; ++j) {
      while (counters[j].phase.load(std::memory_order_acquire) < phase) {
        if (yield) sched_yield();
#if defined(__x86_64__)
        else __builtin_ia32_pause();
#endif
      }
    }
  }

  size_t sliceBegin(int j, size_t count) const {
    const size_t q = ((count + world - 1) / world + 15) / 16 * 16;
    return std::min(count, q * static_cast<size_t>(j));
  }

  // out[i] = sum over ranks of their buffer's [b, e).
  __attribute__((target("avx2"))) void reduce(float* out, size_t b, size_t e) const {
    if (world == 2) {
      const float* x = bufferOf(0);
      const float* y = bufferOf(1);
#pragma GCC ivdep
      for (size_t i = b; i < e; ++i) out[i] = x[i] + y[i];
      return;
    }
    for (size_t base = b; base < e; base += 2048) {
      const size_t end = std::min(e, base + 2048);
      float acc[2048];
      const float* x = bufferOf(0);
      for (size_t i = base; i < end; ++i) acc[i - base] = x[i];
      for (int k = 1; k < world; ++k) {
        const float* y = bufferOf(k);
#pragma GCC ivdep
        for (size_t i = base; i < end; ++i) acc[i - base] += y[i];
      }
      std::memcpy(out + base, acc, (end - base) * sizeof(float));
    }
  }

  void allreduceOwned(size_t count) {
    barrier();
    const size_t b = sliceBegin(rank, count), e = sliceBegin(rank + 1, count);
    float* mine = bufferOf(rank);
    reduce(mine, b, e);
    barrier();
    for (int j = 0; j < world; ++j) {
      if (j == rank) continue;
      const size_t bj = sliceBegin(j, count), ej = sliceBegin(j + 1, count);
      std::memcpy(mine + bj, bufferOf(j) + bj, (ej - bj) * sizeof(float));
    }
  }

  void allreduceCopy(float* user, size_t count) {
    barrier();
    std::memcpy(bufferOf(rank), user, count * sizeof(float));
    barrier();
    const size_t b = sliceBegin(rank, count), e = sliceBegin(rank + 1, count);
    reduce(bufferOf(rank), b, e);
    barrier();
    for (int j = 0; j < world; ++j) {
      const size_t bj = sliceBegin(j, count), ej = sliceBegin(j + 1, count);
      std::memcpy(user + bj, bufferOf(j) + bj, (ej - bj) * sizeof(float));
    }
  }
};

int worker(Probe probe, const std::string& dir) {
  FILE* commands = std::fopen((dir + "/commands." + std::to_string(probe.rank)).c_str(), "r");
  FILE* results = probe.rank == 0 ? std::fopen((dir + "/results").c_str(), "w") : nullptr;
  if (!commands || (probe.rank == 0 && !results)) return 1;
  std::vector<float> user(probe.capacity, 0.0f);  // touched here, not in the timed loop
  char line[256];
  while (std::fgets(line, sizeof(line), commands)) {
    size_t bytes = 0;
    int warmup = 0, iters = 0;
    char mode[32] = {0};
    if (std::sscanf(line, "run %zu %d %d %31s", &bytes, &warmup, &iters, mode) < 3) break;
    const bool owned = std::string(mode) != "copy";
    const size_t count = std::min(bytes / sizeof(float), probe.capacity);
    float* data = owned ? probe.bufferOf(probe.rank) : user.data();
    for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>(probe.rank + i % 5);
    auto once = [&] {
      if (owned) probe.allreduceOwned(count);
      else probe.allreduceCopy(data, count);
    };
    once();
    long wrong = 0;
    const int n = probe.world;
    for (size_t i = 0; i < count; ++i) {
      if (data[i] != static_cast<float>(n * (n - 1) / 2 + n * static_cast<int>(i % 5))) ++wrong;
    }
    for (int i = 0; i < warmup; ++i) once();
    probe.barrier();
    std::vector<double> times;
    for (int i = 0; i < iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      once();
      times.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    if (results) {
      std::fprintf(results, "%zu %.3f %ld\n", bytes, dtrain::bench::median(times), wrong);
      std::fflush(results);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: shm_probe DIR WORLD MAXBYTES\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int world = std::atoi(argv[2]);
  const size_t capacity = std::strtoull(argv[3], nullptr, 10) / sizeof(float) + 16;
  const size_t control = 4096;
  const size_t bytes = control + static_cast<size_t>(world) * capacity * sizeof(float);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return 1;
  std::memset(p, 0, bytes);  // every page touched before any measurement
  Probe base;
  base.world = world;
  base.yield = static_cast<unsigned>(world) > std::max(1u, std::thread::hardware_concurrency());
  base.counters = static_cast<Counter*>(p);
  base.segment = reinterpret_cast<float*>(static_cast<char*>(p) + control);
  base.capacity = capacity;
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::fflush(nullptr);
    pid_t pid = fork();
    if (pid == 0) {
      Probe mine = base;
      mine.rank = r;
      _exit(worker(mine, dir));
    }
    pids.push_back(pid);
  }
  int worst = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    worst = std::max(worst, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return worst;
}
