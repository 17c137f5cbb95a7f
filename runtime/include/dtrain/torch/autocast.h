#pragma once
// AutocastGuard: mixed-precision forward passes, as Python's `with torch.autocast(device):`.
// While a guard lives, eligible operations on `device` (matrix multiplications, convolutions, ...)
// run in lower precision and the rest stay in float32: float16 on CUDA (use it with a
// GradScaler), bfloat16 on the CPU (whose range needs no loss
// scaling). Wrap the forward and the loss, not backward(), as in PyTorch:
//
//   {
//     dtrain::AutocastGuard autocast(device, /*enabled=*/amp);
//     loss = torch::nn::functional::cross_entropy(ddp(images), labels);
//   }
//   scaler.scale(loss).backward();
//
// Guards nest; each restores what it found. Per thread, like PyTorch's autocast state.

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace dtrain {

class AutocastGuard {
 public:
  // Disabled: does nothing. Throws InvalidArgument for a device type autocast does not support.
  explicit AutocastGuard(c10::Device device, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

  // The dtype autocast lowers to on `device`'s type: float16 on CUDA, bfloat16 on the CPU.
  static c10::ScalarType lowerPrecision(c10::Device device);

 private:
  bool active_ = false;
  c10::DeviceType type_ = c10::DeviceType::CPU;
  bool previousEnabled_ = false;
  c10::ScalarType previousDtype_ = c10::ScalarType::Float;
};

}  // namespace dtrain
