// librecompute_counting.so: the counting CPU allocator of the tests, for recompute_peer.py, which
// loads it with ctypes after importing torch (the same libc10 as this build's), so that both
// sides of recompute_bench count tensor bytes the same way.
#include <cstdint>

#include "counting_allocator.h"

extern "C" {

void dtrain_counting_install() { dtrain::testing::CountingCpuAllocator::install(); }
int64_t dtrain_counting_live() { return dtrain::testing::CountingCpuAllocator::install().live(); }
int64_t dtrain_counting_peak() { return dtrain::testing::CountingCpuAllocator::install().peak(); }
void dtrain_counting_reset_peak() { dtrain::testing::CountingCpuAllocator::install().resetPeak(); }
}
