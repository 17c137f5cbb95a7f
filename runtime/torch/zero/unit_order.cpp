#include "unit_order.h"

namespace dtrain::zero {

size_t UnitOrder::needed(size_t k) {
  if (!recording_) return next_[k];
  if (seen_[k]) return kNone;
  seen_[k] = 1;
  if (last_ != kNone) next_[last_] = k;
  last_ = k;
  return kNone;
}

}  // namespace dtrain::zero
