#include "dtrain/torch/init.h"

#include <cstdlib>
#include <cstring>

#include <c10/core/CPUAllocator.h>

#include "dtrain/base/error.h"
#include "dtrain/config.h"
#include "dtrain/torch/host_memory.h"

#if DTRAIN_WITH_TORCH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace dtrain {

std::shared_ptr<ProcessGroup> init(const InitOptions& options) {
  // NCCL needs CUDA tensors: only a CUDA build of libtorch with a device can use it.
  bool cudaUsable = false;
#if DTRAIN_WITH_TORCH_CUDA
  cudaUsable = c10::cuda::device_count() > 0;
#endif
  comm::World world = comm::connectWorld(options, cudaUsable);
  c10::Device device(c10::kCPU);
  if (world.device >= 0) {  // a CUDA backend of the table
#if DTRAIN_WITH_TORCH_CUDA
    device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(world.device));
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(world.device));
#endif
  }
  if (device.is_cpu() && options.hostMemoryCache) {
    const char* env = std::getenv("DTRAIN_HOST_MEMORY_CACHE");
    // Quietly not over an allocator of higher priority (a test's counting allocator): only a
    // program's own enableHostMemoryCache() call says so.
    if ((env == nullptr || std::strcmp(env, "0") != 0) &&
        c10::GetCPUAllocator() == c10::GetDefaultCPUAllocator()) {
      enableHostMemoryCache();
    }
  }
  return std::make_shared<ProcessGroup>(std::move(world), device);
}

}  // namespace dtrain
