#include "nccl_types.h"

#include "dtrain/base/error.h"

namespace dtrain::comm {

ncclDataType_t toNcclDataType(DataType dtype) {
  switch (dtype) {
    case DataType::Float32: return ncclFloat32;
    case DataType::Float64: return ncclFloat64;
    case DataType::Float16: return ncclFloat16;
    case DataType::BFloat16:
#if DTRAIN_NCCL_HAS_BF16
      return ncclBfloat16;
#else
      DTRAIN_THROW(InvalidArgument, "bfloat16 collectives need NCCL built with CUDA >= 11");
#endif
    case DataType::Int32: return ncclInt32;
    case DataType::Int64: return ncclInt64;
    case DataType::UInt8: return ncclUint8;
    case DataType::Int8: return ncclInt8;
  }
  DTRAIN_THROW(InvalidArgument, "nccl: no NCCL type for data type {}", static_cast<int>(dtype));
}

ncclRedOp_t toNcclRedOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Avg: return ncclAvg;
  }
  DTRAIN_THROW(InvalidArgument, "nccl: no NCCL reduction for op {}", static_cast<int>(op));
}

}  // namespace dtrain::comm
