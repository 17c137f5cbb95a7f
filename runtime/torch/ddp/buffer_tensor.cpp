#include "buffer_tensor.h"

#include <ATen/ATen.h>
#include <c10/util/strides.h>

namespace dtrain::ddp {

at::Tensor tensorOver(const std::shared_ptr<comm::Buffer>& buffer, int64_t offset,
                      at::IntArrayRef sizes, const at::TensorOptions& options) {
  const auto elem = static_cast<int64_t>(
      c10::elementSize(c10::typeMetaToScalarType(options.dtype())));
  auto* base = static_cast<char*>(buffer->data()) + offset * elem;
  return at::from_blob(
      base, sizes, [keep = buffer](void*) mutable { keep.reset(); }, options);
}

at::Tensor tensorIn(const at::Storage& storage, int64_t offset, at::IntArrayRef sizes,
                    const at::TensorOptions& options) {
  at::Tensor t = at::empty({0}, options);
  t.set_(storage, offset, sizes, c10::contiguous_strides(sizes));
  return t;
}

}  // namespace dtrain::ddp
