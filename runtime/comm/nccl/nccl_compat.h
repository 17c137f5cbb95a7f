#pragma once
// Every difference between NCCL versions dtrain builds against, in one place.
// Minimum supported: NCCL 2.7 (ncclCommAbort, ncclCommGetAsyncError).

#include <nccl.h>

#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < 2700
#error "dtrain needs NCCL >= 2.7 (ncclCommAbort, ncclCommGetAsyncError)"
#endif

// ncclAvg and ncclBfloat16 arrived in 2.10 (bfloat16 also needs CUDA >= 11).
#define DTRAIN_NCCL_HAS_AVG (NCCL_VERSION_CODE >= 21000)
#if NCCL_VERSION_CODE >= 21000 && defined(__CUDA_BF16_TYPES_EXIST__)
#define DTRAIN_NCCL_HAS_BF16 1
#elif NCCL_VERSION_CODE >= 21000 && defined(CUDART_VERSION) && CUDART_VERSION >= 11000
#define DTRAIN_NCCL_HAS_BF16 1
#else
#define DTRAIN_NCCL_HAS_BF16 0
#endif
// ncclGetLastError (a detailed message for the last failure) arrived in 2.13.
#define DTRAIN_NCCL_HAS_LAST_ERROR (NCCL_VERSION_CODE >= 21300)
// ncclCommFinalize (flush, then destroy without blocking on peers) arrived in 2.14.
#define DTRAIN_NCCL_HAS_FINALIZE (NCCL_VERSION_CODE >= 21400)

namespace dtrain::comm::nccl_compat {

inline const char* lastError(ncclComm_t comm) {
#if DTRAIN_NCCL_HAS_LAST_ERROR
  const char* text = comm ? ncclGetLastError(comm) : nullptr;
  return text ? text : "";
#else
  (void)comm;
  return "";
#endif
}

}  // namespace dtrain::comm::nccl_compat
