// librecompute_counting.so: the counting CPU allocator of the tests (testing/counting_allocator.h)
// as a library of its own, so that a benchmark's two sides count CPU tensor storage bytes the
// same way. Two ways in:
//   - ctypes, after `import torch` (the same libc10 as this build's): recompute_peer.py and
//     zero_peer.py call the functions below.
//   - DTRAIN_COUNTING_PEAK_FILE=PREFIX in the environment: the library installs the allocator as
//     it is loaded and, when the process exits, writes the whole run's peak to PREFIX.<RANK>. See
//     Note [Counting a whole program].
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "counting_allocator.h"

// Note [Counting a whole program]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// gpt_bench counts train_gpt's tensor bytes without a line of train_gpt changed: it starts it with
// LD_PRELOAD=librecompute_counting.so and DTRAIN_COUNTING_PEAK_FILE=PREFIX. The dynamic loader
// runs libc10's initializers (which register the default CPU allocator) before this library's, and
// this library's before main(), so the counting allocator is in place before the program's first
// tensor. Installed at priority 100, it stays in front: dtrain::init() enables its host
// memory cache only over libtorch's default allocator, so the counted run allocates with plain
// posix_memalign, as the peer (gpt_peer.py --counting-lib, which loads this library right after
// `import torch`) does. The peak is the whole run's, start-up included, as an OOM kill sees it.
// Written at exit (a `return` from main() or exit(); not a crash or _exit), by the process that
// loaded the library only (a forked child inherits the handler, not the file). PREFIX.<RANK> holds
// the peak in bytes as a decimal integer and a newline; RANK is the variable launch and torchrun
// set (0 without it). Written to PREFIX.<RANK>.tmp and renamed, so a reader sees all or nothing.

namespace {

constexpr const char* kPeakFileVariable = "DTRAIN_COUNTING_PEAK_FILE";

struct PeakFile {
  std::string path;
  pid_t pid = 0;
};

PeakFile& peakFile() {
  static PeakFile* file = new PeakFile();  // never destroyed: read by the exit handler
  return *file;
}

void writePeak() {
  const PeakFile& file = peakFile();
  if (file.path.empty() || ::getpid() != file.pid) return;
  const long long peak = dtrain::testing::CountingCpuAllocator::install().peak();
  const std::string tmp = file.path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "librecompute_counting: cannot write %s (%s); the peak was %lld bytes\n",
                 tmp.c_str(), kPeakFileVariable, peak);
    return;
  }
  const bool written = std::fprintf(f, "%lld\n", peak) > 0;
  if (std::fclose(f) != 0 || !written || std::rename(tmp.c_str(), file.path.c_str()) != 0) {
    std::fprintf(stderr, "librecompute_counting: cannot write %s (%s); the peak was %lld bytes\n",
                 file.path.c_str(), kPeakFileVariable, peak);
  }
}

__attribute__((constructor)) void installFromEnvironment() {
  const char* prefix = std::getenv(kPeakFileVariable);
  if (prefix == nullptr || *prefix == '\0') return;
  const char* rank = std::getenv("RANK");  // launch's and torchrun's
  dtrain::testing::CountingCpuAllocator::install();
  peakFile().path = std::string(prefix) + "." + (rank != nullptr && *rank ? rank : "0");
  peakFile().pid = ::getpid();
  std::atexit(writePeak);
}

}  // namespace

extern "C" {

void dtrain_counting_install() { dtrain::testing::CountingCpuAllocator::install(); }
int64_t dtrain_counting_live() { return dtrain::testing::CountingCpuAllocator::install().live(); }
int64_t dtrain_counting_peak() { return dtrain::testing::CountingCpuAllocator::install().peak(); }
void dtrain_counting_reset_peak() { dtrain::testing::CountingCpuAllocator::install().resetPeak(); }
}
