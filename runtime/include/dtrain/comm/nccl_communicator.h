#pragma once
// The NCCL backend: collectives on CUDA device memory. Rank 0 creates the ncclUniqueId and shares
// it through the store; every collective runs on the communicator's own CUDA stream, ordered after
// the caller's stream (CallOptions::stream) by an event, and the caller's stream after it when
// the Work is waited on. A watchdog thread polls each collective's completion and NCCL's
// asynchronous errors; a collective that does not finish within its timeout aborts the
// communicator (ncclCommAbort) and fails with an error naming rank and operation, so a hung peer
// never hangs this rank. Compiled whenever NCCL and the CUDA toolkit are found; runs where a GPU
// is.

#include <functional>
#include <memory>
#include <string>

#include "dtrain/base/store.h"
#include "dtrain/comm/communicator.h"

namespace dtrain::comm {

constexpr Millis kDefaultWatchdogInterval{20};

struct NcclOptions {
  int rank = 0;
  int size = 1;
  std::shared_ptr<store::Store> store;  // shared by all ranks; keys under "<name>/"
  std::string name = "nccl";
  int device = 0;  // CUDA device index: cuda:LOCAL_RANK
  // Zero: the default (Note [Zero timeouts] in dtrain/base/timeout.h).
  Millis timeout = kDefaultCollectiveTimeout;
  // Waiting for rank 0's ncclUniqueId, then for NCCL's init of the communicator (each at most
  // this long; a late init is aborted: docs/design.md "Communicator").
  Millis connectTimeout = kDefaultConnectTimeout;
  // Work::wait() blocks the host until the GPU has finished the collective (or its timeout
  // passed) instead of only ordering the caller's stream after it.
  bool blockingWait = false;
  Millis watchdogInterval = kDefaultWatchdogInterval;
  // The watchdog's own watchdog (docs/design.md "Communicator"): when the watchdog thread has been
  // stuck this long (in a CUDA or NCCL call that never returns), the process ends with a message,
  // so launch can stop and restart the job. Zero: 8 minutes, c10d's default;
  // TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC overrides it and TORCH_NCCL_ENABLE_MONITORING=0 turns it off
  // (heartbeatFromEnv).
  Millis heartbeatTimeout = Millis::zero();
  bool heartbeatFromEnv = true;
  // Compare every collective's type and shape across ranks through the store before running it
  // and fail at once naming both sides (a few store round trips per collective: for debugging).
  // Rank 0's value applies to all ranks. Default: DTRAIN_CHECK_COLLECTIVES=1.
  bool checkCollectives = false;
  bool checkCollectivesFromEnv = true;
};

// True when dtrain was built with NCCL.
bool ncclAvailable();

// CUDA devices this process can use; 0 without a GPU, a driver, or NCCL support in this build.
int cudaDeviceCount();

// Throws InvalidArgument naming the variable when an NCCL_* (or TORCH_NCCL_*) variable has a value
// NCCL would reject or silently misread (docs/reliability.md P7). Torch- and CUDA-free; `env`
// looks a variable up (nullptr when unset), std::getenv by default.
void validateNcclEnvironment(const std::function<const char*(const char*)>& env = {});

std::shared_ptr<Communicator> createNcclCommunicator(const NcclOptions& options);

// `bytes` of device memory on cuda:`device`, as NcclCommunicator::allocate gives them, without a
// communicator (a rank not admitted yet); freed when released. Throws InvalidArgument in a build
// without NCCL.
std::shared_ptr<Buffer> allocateCudaBuffer(int device, size_t bytes);

}  // namespace dtrain::comm
