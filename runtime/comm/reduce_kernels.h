#pragma once
// Element-wise reduction kernels on raw buffers, for every DataType and ReduceOp: what the CPU
// backends combine received data with. Pure functions; reductions are done in a fixed order by the
// callers so every rank computes bitwise-identical results.

#include <cstddef>

#include "dtrain/comm/communicator.h"

namespace dtrain::comm {

// out[i] = a[i] op b[i] for i < count. `out` may alias `a` or `b`. Avg reduces as Sum (the
// division by the world size is applied once at the end, see finishAverage()).
using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t count);

ReduceFn reduceFunction(DataType dtype, ReduceOp op);

// data[i] /= divisor, in the element type (integers truncate toward zero, like torch's
// division of integer tensors by an integer with rounding_mode="trunc").
void divideInPlace(void* data, size_t count, DataType dtype, int divisor);

// Applies the Avg division after a Sum when `op` is Avg; no-op otherwise.
inline void finishAverage(void* data, size_t count, DataType dtype, ReduceOp op, int worldSize) {
  if (op == ReduceOp::Avg && worldSize > 1) divideInPlace(data, count, dtype, worldSize);
}

}  // namespace dtrain::comm
