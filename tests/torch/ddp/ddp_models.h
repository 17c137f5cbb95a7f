#pragma once
// Small models for DDP's tests (threads and real processes): an MLP, a CNN without and one with
// batch statistics, and a network whose forward can skip a layer (unused parameters). Header-only,
// shared by tests/torch and the integration worker.

#include <torch/torch.h>

namespace dtrain::testing {

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(int64_t in = 8, int64_t hidden = 16, int64_t out = 4) {
    fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, hidden));
    fc3 = register_module("fc3", torch::nn::Linear(hidden, out));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3(torch::tanh(fc2(torch::tanh(fc1(x)))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Mlp);

// Input 3x8x8, 5 classes.
struct CnnImpl : torch::nn::Module {
  CnnImpl() {
    conv1 = register_module("conv1",
                            torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).padding(1)));
    conv2 = register_module(
        "conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 8, 3).stride(2).padding(1)));
    fc = register_module("fc", torch::nn::Linear(8 * 4 * 4, 5));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(conv2(torch::relu(conv1(x))));
    return fc(h.flatten(1));
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Cnn);

// Input 3x8x8, 5 classes; BatchNorm keeps per-rank running statistics.
struct BnCnnImpl : torch::nn::Module {
  BnCnnImpl() {
    conv1 = register_module("conv1",
                            torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).padding(1)));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(4));
    conv2 = register_module(
        "conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 8, 3).stride(2).padding(1)));
    bn2 = register_module("bn2", torch::nn::BatchNorm2d(8));
    fc = register_module("fc", torch::nn::Linear(8, 5));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(bn1(conv1(x)));
    h = torch::relu(bn2(conv2(h)));
    return fc(h.mean({2, 3}));
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(BnCnn);

// fc1 -> [fc2, skipped when `skip`] -> head: fc2 is unused in iterations that skip it.
struct BranchNetImpl : torch::nn::Module {
  BranchNetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 8));
    head = register_module("head", torch::nn::Linear(8, 3));
  }
  torch::Tensor forward(const torch::Tensor& x, bool skip) {
    auto h = torch::tanh(fc1(x));
    if (!skip) h = torch::tanh(fc2(h));
    return head(h);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, head{nullptr};
};
TORCH_MODULE(BranchNet);

// Copies every parameter and buffer of `from` into `to` (same architecture).
inline void copyState(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard noGrad;
  auto src = from.named_parameters();
  for (auto& p : to.named_parameters()) p.value().copy_(src[p.key()]);
  auto srcBuffers = from.named_buffers();
  for (auto& b : to.named_buffers()) b.value().copy_(srcBuffers[b.key()]);
}

// max |a - b| / max |b|: relative error over a whole tensor, robust to entries near zero.
inline double relativeError(const torch::Tensor& a, const torch::Tensor& b) {
  double scale = b.abs().max().item<double>();
  double diff = (a - b).abs().max().item<double>();
  return scale == 0 ? diff : diff / scale;
}

}  // namespace dtrain::testing
