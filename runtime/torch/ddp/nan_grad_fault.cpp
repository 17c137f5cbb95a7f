#include "nan_grad_fault.h"

#include <limits>
#include <vector>

#include <ATen/ATen.h>

namespace dtrain::ddp {

const fault::Fault* nanGradFault(int rank, uint64_t pass, bool after) {
  if (fault::activeFaults().empty()) return nullptr;
  for (const auto& f : fault::activeFaults()) {
    if (f.kind == fault::Kind::NanGrad && f.after == after &&
        f.matches(rank, static_cast<int64_t>(pass), fault::currentAttempt())) {
      return &f;
    }
  }
  return nullptr;
}

void poison(at::Tensor& t, const fault::Fault& f) {
  double value = f.arg == 1 ? std::numeric_limits<double>::infinity()
                            : std::numeric_limits<double>::quiet_NaN();
  if (t.dim() == 0) {
    t.fill_(value);
  } else {
    t.index_put_(std::vector<at::indexing::TensorIndex>(t.dim(), 0), value);
  }
}

}  // namespace dtrain::ddp
