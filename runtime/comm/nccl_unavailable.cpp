// Built instead of the NCCL backend when NCCL or the CUDA toolkit was not found.
#include "dtrain/base/error.h"
#include "dtrain/comm/nccl_communicator.h"

namespace dtrain::comm {

bool ncclAvailable() { return false; }

int cudaDeviceCount() { return 0; }

std::shared_ptr<Communicator> createNcclCommunicator(const NcclOptions&) {
  DTRAIN_THROW(InvalidArgument,
               "dtrain was built without NCCL, so there is no GPU backend. HINT: build on a "
               "machine with the CUDA toolkit and NCCL (NCCL_ROOT, CUDAToolkit_ROOT)");
}

std::shared_ptr<Buffer> allocateCudaBuffer(int, size_t) {
  DTRAIN_THROW(InvalidArgument,
               "dtrain was built without NCCL, so there is no device memory to "
               "allocate. HINT: build on a machine with the CUDA toolkit and NCCL");
}

}  // namespace dtrain::comm
