#pragma once
// Tensors over memory a Communicator owns (Communicator::allocate): DDP's buckets, ZeRO's flat
// parameters and gradients.

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

#include "dtrain/comm/communicator.h"

namespace dtrain::ddp {

// A tensor of `sizes` over `buffer` starting at element `offset` (of the dtype in `options`),
// keeping the buffer alive. Not an autograd view of anything: optimizers may detach_() a .grad
// that is one, and set_data() may make a parameter one.
at::Tensor tensorOver(const std::shared_ptr<comm::Buffer>& buffer, int64_t offset,
                      at::IntArrayRef sizes, const at::TensorOptions& options);

// A plain tensor (no autograd view) of `sizes`, contiguous, at element `offset` of `storage`:
// tensors that share one storage, whose data pointer ZeRO-3 swaps (Note [Sharded memory]).
at::Tensor tensorIn(const at::Storage& storage, int64_t offset, at::IntArrayRef sizes,
                    const at::TensorOptions& options);

}  // namespace dtrain::ddp
