#pragma once
// The benchmark's models, built identically by benchmarks/ddp/ddp_step_peer.py for PyTorch:
// an MLP of ~25M float32 parameters and ResNet-18 in its CIFAR form for 3x32x32 inputs (a 3x3
// stride-1 stem without max-pooling, then torchvision's four stages of two basic blocks; 10
// classes, 11.2M parameters).

#include <torch/torch.h>

namespace dtrain::bench {

// 1024 -> 4096 -> 4096 -> 1024 with ReLU: 25.18M parameters.
struct BenchMlpImpl : torch::nn::Module {
  explicit BenchMlpImpl(int64_t width = 4096, int64_t io = 1024) {
    fc1 = register_module("fc1", torch::nn::Linear(io, width));
    fc2 = register_module("fc2", torch::nn::Linear(width, width));
    fc3 = register_module("fc3", torch::nn::Linear(width, io));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3(torch::relu(fc2(torch::relu(fc1(x)))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(BenchMlp);

inline torch::nn::Conv2dOptions conv(int64_t in, int64_t out, int64_t k, int64_t stride,
                                     int64_t pad) {
  return torch::nn::Conv2dOptions(in, out, k).stride(stride).padding(pad).bias(false);
}

struct BasicBlockImpl : torch::nn::Module {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride) {
    conv1 = register_module("conv1", torch::nn::Conv2d(conv(in, out, 3, stride, 1)));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(out));
    conv2 = register_module("conv2", torch::nn::Conv2d(conv(out, out, 3, 1, 1)));
    bn2 = register_module("bn2", torch::nn::BatchNorm2d(out));
    if (stride != 1 || in != out) {
      downsample = register_module(
          "downsample", torch::nn::Sequential(torch::nn::Conv2d(conv(in, out, 1, stride, 0)),
                                              torch::nn::BatchNorm2d(out)));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto out = torch::relu(bn1(conv1(x)));
    out = bn2(conv2(out));
    return torch::relu(out + (downsample ? downsample->forward(x) : x));
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::Sequential downsample{nullptr};
};
TORCH_MODULE(BasicBlock);

// `width` 64 is ResNet-18; smaller widths give the same layout, cheaper (--smoke).
struct ResNet18Impl : torch::nn::Module {
  explicit ResNet18Impl(int64_t classes = 10, int64_t width = 64) {
    conv1 = register_module("conv1", torch::nn::Conv2d(conv(3, width, 3, 1, 1)));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(width));
    int64_t in = width;
    const int64_t widths[] = {width, 2 * width, 4 * width, 8 * width};
    for (int stage = 0; stage < 4; ++stage) {
      torch::nn::Sequential layer;
      for (int block = 0; block < 2; ++block) {
        int64_t stride = (stage > 0 && block == 0) ? 2 : 1;
        layer->push_back(BasicBlock(in, widths[stage], stride));
        in = widths[stage];
      }
      layers.push_back(register_module("layer" + std::to_string(stage + 1), layer));
    }
    fc = register_module("fc", torch::nn::Linear(8 * width, classes));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(bn1(conv1(x)));
    for (auto& layer : layers) h = layer->forward(h);
    h = torch::adaptive_avg_pool2d(h, {1, 1}).flatten(1);
    return fc(h);
  }
  torch::nn::Conv2d conv1{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr};
  std::vector<torch::nn::Sequential> layers;
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet18);

}  // namespace dtrain::bench
