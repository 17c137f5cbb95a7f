#include "dtrain/torch/autocast.h"

#include <ATen/autocast_mode.h>

#include "dtrain/base/error.h"
#include "torch_compat.h"

namespace dtrain {

c10::ScalarType AutocastGuard::lowerPrecision(c10::Device device) {
  return device.is_cuda() ? c10::ScalarType::Half : c10::ScalarType::BFloat16;
}

AutocastGuard::AutocastGuard(c10::Device device, bool enabled) {
  if (!enabled) return;
  DTRAIN_CHECK_ARG(device.is_cpu() || device.is_cuda(),
                   "autocast supports cpu and cuda devices, not {}", device.str());
  type_ = device.type();
  previousEnabled_ = compat::autocastEnabled(type_);
  previousDtype_ = compat::autocastDtype(type_);
  compat::setAutocastEnabled(type_, true);
  compat::setAutocastDtype(type_, lowerPrecision(device));
  at::autocast::increment_nesting();
  active_ = true;
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // Leaving the outermost autocast region drops the cached lower-precision copies of the
  // weights, as Python's autocast.__exit__ does.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::setAutocastEnabled(type_, previousEnabled_);
  compat::setAutocastDtype(type_, previousDtype_);
}

}  // namespace dtrain
