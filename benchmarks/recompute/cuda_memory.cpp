// recompute_bench --gpu: cuda:0's allocated bytes, from the caching allocator's statistics.
#include "dtrain/config.h"
#include "recompute_bench.h"

#if DTRAIN_WITH_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace dtrain::bench {

#if DTRAIN_WITH_TORCH_CUDA
namespace allocator = c10::cuda::CUDACachingAllocator;

void resetCudaPeak() { allocator::resetPeakStats(0); }
// allocated_bytes[0]: the aggregate over pool types (StatType::AGGREGATE).
int64_t cudaPeakBytes() { return allocator::getDeviceStats(0).allocated_bytes[0].peak; }
int64_t cudaLiveBytes() { return allocator::getDeviceStats(0).allocated_bytes[0].current; }
#else
void resetCudaPeak() {}
int64_t cudaPeakBytes() { return 0; }
int64_t cudaLiveBytes() { return 0; }
#endif

}  // namespace dtrain::bench
