#pragma once
// Reductions over several ranks' inputs at once, for the shared-memory backend: one pass that
// reads every input and writes the result, instead of n - 1 pairwise passes. Vectorised (AVX2 +
// F16C where the CPU has them, chosen at run time; plain loops the compiler vectorises
// otherwise). float16 and bfloat16 accumulate in float32 and round once at the end.

#include <cstddef>

#include "dtrain/comm/communicator.h"

namespace dtrain::comm::shm {

// out[i] = in[0][i] op in[1][i] op ... op in[n-1][i], inputs combined in index order, so every
// rank that reduces the same inputs gets bitwise the same result. Avg divides the sum by n (integer
// types truncate). `out` may be one of the inputs (exactly, not a shifted overlap).
void reduceInputs(void* out, const void* const* in, int n, size_t count, DataType dtype,
                  ReduceOp op);

// Whether the vectorised (AVX2) kernels are in use on this CPU.
bool vectorKernels();

}  // namespace dtrain::comm::shm
