// recomputeSequential and RecomputeSequential: a Sequential in recomputed segments.
#include <memory>

#include "dtrain/base/error.h"
#include "dtrain/torch/recompute.h"

namespace dtrain {

at::Tensor recomputeSequential(const torch::nn::Sequential& sequential, int64_t segments,
                               const at::Tensor& x, const RecomputeOptions& options) {
  const auto size = static_cast<int64_t>(sequential->size());
  DTRAIN_CHECK_ARG(segments >= 1 && segments <= size,
                   "recomputeSequential: {} segments of a Sequential of {} modules; it takes "
                   "1 to {}",
                   segments, size, size);
  // checkpoint_sequential's split: segments - 1 of size / segments children, the rest last.
  const int64_t per = size / segments;
  std::shared_ptr<torch::nn::SequentialImpl> modules = sequential.ptr();
  at::Tensor out = x;
  for (int64_t s = 0; s < segments; ++s) {
    const int64_t begin = s * per;
    const int64_t end = s + 1 == segments ? size : begin + per;
    RecomputeSegment segment;
    segment.options = options;
    for (int64_t i = begin; i < end; ++i) segment.add(*modules->ptr(static_cast<size_t>(i)));
    out = recompute(
        segment,
        [modules, begin, end](const at::Tensor& input) {
          at::Tensor h = input;
          for (int64_t i = begin; i < end; ++i) {
            h = (modules->begin() + i)->forward(h);
          }
          return h;
        },
        out);
  }
  return out;
}

RecomputeSequentialImpl::RecomputeSequentialImpl(torch::nn::Sequential sequential, int64_t segments,
                                                 RecomputeOptions options)
    : sequential_(std::move(sequential)), segments_(segments), options_(options) {
  DTRAIN_CHECK_ARG(sequential_, "RecomputeSequential: the Sequential is empty (null)");
  const auto size = static_cast<int64_t>(sequential_->size());
  DTRAIN_CHECK_ARG(segments >= 1 && segments <= size,
                   "RecomputeSequential: {} segments of a Sequential of {} modules; it takes 1 "
                   "to {}",
                   segments, size, size);
  for (const auto& child : sequential_->named_children()) {
    register_module(child.key(), child.value());
  }
}

at::Tensor RecomputeSequentialImpl::forward(const at::Tensor& x) {
  return recomputeSequential(sequential_, segments_, x, options_);
}

}  // namespace dtrain
