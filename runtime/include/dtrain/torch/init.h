#pragma once
// dtrain::init(): the first call of a training program.
//
//   auto pg = dtrain::init();          // rank, world, store and backend from the environment
//   pg->allreduce(tensor);             // in place, summed over all ranks
//
// Under `launch` everything comes from the environment it sets (docs/design.md#init); under srun
// or mpirun rank 0 hosts the store at MASTER_ADDR:MASTER_PORT; tests pass rank, world size and a
// shared store explicitly. NCCL on CUDA devices (cuda:LOCAL_RANK among CUDA_VISIBLE_DEVICES), Gloo
// on the CPU; DTRAIN_BACKEND or InitOptions::backend overrides.
// See dtrain/comm/world.h for the rules
// and docs/training.md, "Init", for the variables.

#include <memory>

#include "dtrain/comm/world.h"
#include "dtrain/torch/process_group.h"

namespace dtrain {

struct InitOptions : comm::WorldOptions {
  // The host memory cache (dtrain/torch/host_memory.h) for a rank on the CPU, which init()
  // installs with its default options (docs/training.md, "Host memory cache"); false, or
  // DTRAIN_HOST_MEMORY_CACHE=0 in the environment, leaves libtorch's allocator. A rank on a CUDA
  // device goes without: its tensors are the CUDA caching allocator's. An allocator installed
  // before at a higher priority (or the cache with options of the program's own) stays.
  bool hostMemoryCache = true;
};

// Throws InvalidArgument naming a missing or malformed variable (and saying that `launch` sets
// it), TimeoutError / NetworkError when the store or the other ranks cannot be reached.
std::shared_ptr<ProcessGroup> init(const InitOptions& options = {});

}  // namespace dtrain
