#pragma once
// DTRAIN_FAULT=nan-grad for the gradient paths: DDP's reducer and the sharded one
// (runtime/torch/zero/). See "Fault injection" in docs/design.md.

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "fault.h"

namespace dtrain::ddp {

// The nan-grad fault of this rank and synchronised backward `pass`, before (`after` false) or
// after the gradients' collective; null when none (the common case costs one empty() check).
const fault::Fault* nanGradFault(int rank, uint64_t pass, bool after);

// Writes the fault's NaN or +inf into the first element of `t`.
void poison(at::Tensor& t, const fault::Fault& f);

}  // namespace dtrain::ddp
