#pragma once
// dtrain::init(): the first call of a training program.
//
//   auto pg = dtrain::init();          // rank, world, store and backend from the environment
//   pg->allreduce(tensor);             // in place, summed over all ranks
//
// Under `launch` everything comes from the environment it sets (docs/design.md#init); under srun
// or mpirun rank 0 hosts the store at MASTER_ADDR:MASTER_PORT; tests pass rank, world size and a
// shared store explicitly. NCCL on CUDA devices (cuda:LOCAL_RANK among CUDA_VISIBLE_DEVICES), Gloo
// on the CPU; DTRAIN_BACKEND or InitOptions::backend overrides. See dtrain/comm/world.h for the rules
// and docs/training.md, "Init", for the variables.

#include <memory>

#include "dtrain/comm/world.h"
#include "dtrain/torch/process_group.h"

namespace dtrain {

using InitOptions = comm::WorldOptions;

// Throws InvalidArgument naming a missing or malformed variable (and saying that `launch` sets
// it), TimeoutError / NetworkError when the store or the other ranks cannot be reached.
std::shared_ptr<ProcessGroup> init(const InitOptions& options = {});

}  // namespace dtrain
