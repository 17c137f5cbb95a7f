#include "buffer_tensor.h"

#include <ATen/ATen.h>

namespace dtrain::ddp {

at::Tensor tensorOver(const std::shared_ptr<comm::Buffer>& buffer, int64_t offset,
                      at::IntArrayRef sizes, const at::TensorOptions& options) {
  const auto elem = static_cast<int64_t>(c10::elementSize(c10::typeMetaToScalarType(options.dtype())));
  auto* base = static_cast<char*>(buffer->data()) + offset * elem;
  return at::from_blob(
      base, sizes, [keep = buffer](void*) mutable { keep.reset(); }, options);
}

}  // namespace dtrain::ddp
