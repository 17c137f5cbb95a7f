#pragma once
// Error construction for the NCCL backend: every message names the rank, the device, the
// operation and NCCL's own words (ncclGetErrorString plus ncclGetLastError when available).

#include <cuda_runtime.h>

#include <exception>
#include <string>

#include "collective.h"
#include "flight_recorder.h"
#include "nccl_compat.h"

namespace dtrain::comm {

class NcclCommunicator;

// Throws dtrain::Error naming `what` and CUDA's message unless `rc` is cudaSuccess.
void checkCuda(cudaError_t rc, const std::string& what);

// Throws unless `rc` is ncclSuccess (InvalidArgument for usage errors, NetworkError for remote
// and system errors, Error otherwise).
void checkNccl(ncclResult_t rc, ncclComm_t comm, const std::string& who, const std::string& what);
std::exception_ptr ncclError(ncclResult_t rc, ncclComm_t comm, const std::string& who,
                             const std::string& what);

// `error` (same type) with "Other ranks: <summary>" added before its HINT, if any.
std::exception_ptr withOtherRanks(std::exception_ptr error, const std::string& summary);

// The TimeoutError of a collective that outlived its deadline (the communicator is aborted).
std::exception_ptr timeoutError(const NcclCommunicator& comm, const CollectiveInfo& info,
                                const FlightRecorder& recorder);

}  // namespace dtrain::comm
