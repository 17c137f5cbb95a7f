#pragma once
// Models and helpers of the activation-recompute tests (threads and processes, both in
// tests/torch/recompute): a stack of Linear -> BatchNorm -> ReLU -> Dropout blocks, run plainly or
// through dtrain::recompute, and bitwise comparison of tensors. Header-only.

#include <cstring>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "dtrain/torch/recompute.h"

namespace dtrain::testing {

// True when both are undefined, or have the same dtype, shape and bytes.
inline bool bitwiseEqual(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  torch::Tensor x = a.detach().cpu().contiguous(), y = b.detach().cpu().contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

// The first name whose tensors differ (parameters, then buffers), or "".
inline std::string firstDifference(const torch::nn::Module& a, const torch::nn::Module& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  for (const auto& p : pa) {
    if (!bitwiseEqual(p.value(), pb[p.key()])) return p.key();
  }
  auto ba = a.named_buffers(), bb = b.named_buffers();
  for (const auto& buffer : ba) {
    if (!bitwiseEqual(buffer.value(), bb[buffer.key()])) return buffer.key();
  }
  return "";
}

struct DropBnBlockImpl : torch::nn::Module {
  DropBnBlockImpl(int64_t in, int64_t out, double dropout) {
    fc = register_module("fc", torch::nn::Linear(in, out));
    bn = register_module("bn", torch::nn::BatchNorm1d(out));
    drop = register_module("drop", torch::nn::Dropout(dropout));
  }
  torch::Tensor forward(const torch::Tensor& x) { return drop(torch::relu(bn(fc(x)))); }
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(DropBnBlock);

// `blocks` Linear -> BatchNorm1d -> ReLU -> Dropout blocks of `width` features, then a Linear
// head to `classes` outputs, as one Sequential; the same seed gives the same parameters.
inline torch::nn::Sequential dropBnNet(uint64_t seed, int64_t blocks = 4, int64_t width = 16,
                                       int64_t classes = 5, double dropout = 0.3) {
  torch::manual_seed(seed);
  torch::nn::Sequential net;
  for (int64_t b = 0; b < blocks; ++b) net->push_back(DropBnBlock(width, width, dropout));
  net->push_back(torch::nn::Linear(width, classes));
  return net;
}

// `net` run plainly or through RecomputeSequential(net, segments), under the same parameter
// names, so that a DDP wrapper of either has the same parameters.
struct EitherNetImpl : torch::nn::Module {
  EitherNetImpl(torch::nn::Sequential n, bool withRecompute, int64_t segments = 3)
      : net(std::move(n)) {
    if (withRecompute) {
      recomputed = register_module("net", RecomputeSequential(net, segments));
    } else {
      register_module("net", net);
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return recomputed ? recomputed(x) : net->forward(x);
  }
  torch::nn::Sequential net;
  RecomputeSequential recomputed{nullptr};
};
TORCH_MODULE(EitherNet);

}  // namespace dtrain::testing
