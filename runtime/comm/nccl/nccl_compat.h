#pragma once
// Every difference between NCCL versions dtrain builds against, in one place.
//
// Minimum: NCCL 2.14 (2022; what PyTorch 1.13 and later ship). The backend needs ncclRemoteError
// (2.13: a peer failed), ncclInProgress (2.14: the state of a communicator still connecting),
// ncclGetLastError (2.13), ncclCommFinalize (2.14) and, older, ncclCommAbort,
// ncclCommGetAsyncError, ncclAvg and ncclBfloat16 (2.10). CMake checks the version of the nccl.h
// it finds against DTRAIN_NCCL_MINIMUM_VERSION (cmake/dependencies.cmake) and builds no NCCL
// backend below it; this check catches a build that reached an older nccl.h anyway.

#include <nccl.h>

#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < 21400
#error "dtrain needs NCCL >= 2.14 (for ncclInProgress and ncclCommFinalize); see docs/building.md"
#endif

// ncclBfloat16 needs CUDA >= 11's bfloat16 types (some NCCL headers declare it only with them).
#if defined(__CUDA_BF16_TYPES_EXIST__) || (defined(CUDART_VERSION) && CUDART_VERSION >= 11000)
#define DTRAIN_NCCL_HAS_BF16 1
#else
#define DTRAIN_NCCL_HAS_BF16 0
#endif

namespace dtrain::comm::nccl_compat {

// NCCL's detailed message for the last failure ("" when it has none).
inline const char* lastError(ncclComm_t comm) {
  const char* text = comm ? ncclGetLastError(comm) : nullptr;
  return text ? text : "";
}

}  // namespace dtrain::comm::nccl_compat
