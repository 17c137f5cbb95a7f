#pragma once
// dtrain's element types and reductions as NCCL's. Pure functions, tested without a GPU
// (NcclMapping.*): at world size 1, the only one a single-GPU test can run, an allreduce is an
// identity whatever type or reduction NCCL was told, so no GPU test could see a wrong entry here.

#include "dtrain/comm/communicator.h"
#include "nccl_compat.h"

namespace dtrain::comm {

// Throws InvalidArgument for a value outside the enum, and for bfloat16 when NCCL lacks it.
ncclDataType_t toNcclDataType(DataType dtype);
ncclRedOp_t toNcclRedOp(ReduceOp op);

}  // namespace dtrain::comm
