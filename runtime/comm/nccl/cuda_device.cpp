#include "cuda_device.h"

#include <cuda_runtime.h>

#include <fmt/format.h>

#include "nccl_errors.h"

namespace dtrain::comm {

namespace {

#if CUDART_VERSION >= 12000
// A driver function through the runtime, so that nothing links libcuda directly (the toolkit's
// libcuda is a stub; the driver's is found at run time). Null when the driver lacks it.
void* driverFunction(const char* symbol) noexcept {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  cudaError_t rc = cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &status);
#else
  cudaError_t rc = cudaGetDriverEntryPoint(symbol, &fn, cudaEnableDefault, &status);
#endif
  if (rc != cudaSuccess || status != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return fn;
}
#endif

}  // namespace

bool primaryContextActive(int device) noexcept {
#if CUDART_VERSION < 12000
  (void)device;
  return true;
#else
  // CUresult (int) cuDeviceGet(CUdevice*, int ordinal), cuDevicePrimaryCtxGetState(CUdevice,
  // unsigned int* flags, int* active); CUdevice is an int.
  using DeviceGet = int (*)(int*, int);
  using PrimaryCtxGetState = int (*)(int, unsigned int*, int*);
  static const auto deviceGet = reinterpret_cast<DeviceGet>(driverFunction("cuDeviceGet"));
  static const auto getState = reinterpret_cast<PrimaryCtxGetState>(
      driverFunction("cuDevicePrimaryCtxGetState"));
  if (deviceGet == nullptr || getState == nullptr) return false;
  int handle = 0;
  unsigned int flags = 0;
  int active = 0;
  if (deviceGet(&handle, device) != 0 || getState(handle, &flags, &active) != 0) return false;
  return active != 0;
#endif
}

int CudaDeviceApi::current() noexcept {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();  // no driver or device: nothing to restore
    return -1;
  }
  return device;
}

void CudaDeviceApi::set(int device) {
  checkCuda(cudaSetDevice(device), fmt::format("cudaSetDevice({})", device));
}

void CudaDeviceApi::restore(int device) noexcept {
  if (cudaSetDevice(device) != cudaSuccess) cudaGetLastError();
}

}  // namespace dtrain::comm
