#pragma once
// The CUDA runtime behind BasicDeviceGuard (device_guard.h): DeviceGuard for the NCCL backend.

#include "device_guard.h"

namespace dtrain::comm {

// True when `device` has an active primary context, so making it current creates nothing.
// Before CUDA 12 cudaSetDevice creates no context, so the answer is always true; with CUDA 12+
// the driver is asked (cuDevicePrimaryCtxGetState through the runtime's driver entry point), and
// when it cannot be asked the answer is false (never create a context to restore a device).
bool primaryContextActive(int device) noexcept;

struct CudaDeviceApi {
  static int current() noexcept;
  static void set(int device);  // throws dtrain::Error naming CUDA's message
  static void restore(int device) noexcept;
  static bool hasContext(int device) noexcept { return primaryContextActive(device); }
};

// See Note [Device guards and GPU 0] in device_guard.h.
using DeviceGuard = BasicDeviceGuard<CudaDeviceApi>;

}  // namespace dtrain::comm
