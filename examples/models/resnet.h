#pragma once
// ResNet-18/34/50/101 as torch::nn modules, with torchvision's layout: the same modules in the
// same order under the same names (conv1, bn1, layer1.0.conv1, layer1.0.downsample.0, ..., fc),
// the same shapes, the same initialisation (Kaiming-normal, fan-out convolutions; BatchNorm weight
// 1, bias 0), and so the same parameter counts — 11,689,512 / 21,797,672 / 25,557,032 / 44,549,160
// at 1000 classes. Bottleneck blocks stride in their 3x3 convolution ("ResNet v1.5"), as
// torchvision's do. A state_dict of torchvision's model therefore has exactly our parameter and
// buffer names and shapes.
//
// Options torchvision does not have:
//   - cifarStem: the first layer is a 3x3 stride-1 convolution without the max-pool, for 32x32
//     images (the usual CIFAR variant; a 7x7/2 stem and a pool would leave 8x8 after the stem);
//   - width: channels of the first stage (64 in torchvision; the stages have width, 2w, 4w, 8w
//     channels, times 4 at the end of Bottleneck blocks). A narrower net trains a demo on two CPU
//     cores in a minute;
//   - recompute: the stem and every residual block run through dtrain::recompute, so that forward
//     keeps only their inputs and backward runs each again (about one more forward per step for
//     a fraction of the activation memory; docs/design.md#recompute). Parameters, their names and
//     the results are the same.
//   - shardBlocks: every residual block is a dtrain::ShardedUnit (ZeRO-3, dtrain/torch/
//     fully_shard.h): under a stage-3 ShardedOptimizer its parameters are gathered only while it
//     runs. The stem, its BatchNorm and fc stay the root's. Parameter names are unchanged (the
//     unit takes the block's), so checkpoints and exports keep torchvision's names; unbound (any
//     other optimizer) the units are the plain blocks. With shardAsBuilt each block is sharded
//     the moment it is built (dtrain::fullyShard), so no rank holds the blocks whole: the same
//     values, for a stage-3 ShardedOptimizer only.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <dtrain/torch/fully_shard.h>

namespace examples {

// Two 3x3 convolutions (ResNet-18/34).
struct BasicBlockImpl : torch::nn::Module {
  static constexpr int64_t kExpansion = 1;
  BasicBlockImpl(int64_t inChannels, int64_t channels, int64_t stride);
  torch::Tensor forward(torch::Tensor x);

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::Sequential downsample{nullptr};  // 1x1 convolution + BatchNorm when the shape changes
};
TORCH_MODULE(BasicBlock);

// 1x1 down, 3x3 (strided), 1x1 up to 4x the channels (ResNet-50/101).
struct BottleneckImpl : torch::nn::Module {
  static constexpr int64_t kExpansion = 4;
  BottleneckImpl(int64_t inChannels, int64_t channels, int64_t stride);
  torch::Tensor forward(torch::Tensor x);

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, bn3{nullptr};
  torch::nn::Sequential downsample{nullptr};
};
TORCH_MODULE(Bottleneck);

struct ResNetOptions {
  std::string arch = "resnet18";  // resnet18 | resnet34 | resnet50 | resnet101
  int64_t numClasses = 1000;
  bool cifarStem = false;
  int64_t width = 64;
  bool recompute = false;
  bool shardBlocks = false;
  std::optional<dtrain::ShardPlacement> shardAsBuilt;  // with shardBlocks: where (the group)
};

struct ResNetImpl : torch::nn::Module {
  explicit ResNetImpl(const ResNetOptions& options);
  // [N, 3, H, W] float -> [N, numClasses] logits.
  torch::Tensor forward(torch::Tensor x);
  // conv1, bn1, ReLU and (ImageNet stem) the max-pool.
  torch::Tensor stem(const torch::Tensor& x);

  ResNetOptions options;
  torch::nn::Conv2d conv1{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr};
  torch::nn::Sequential layer1{nullptr}, layer2{nullptr}, layer3{nullptr}, layer4{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet);

// The architectures ResNetOptions::arch accepts, in order of size.
const std::vector<std::string>& resnetArchs();

// Throws dtrain::InvalidArgument naming the arch and the accepted ones.
ResNet makeResNet(const ResNetOptions& options);

// Number of parameter elements (not buffers).
int64_t parameterCount(const torch::nn::Module& module);

// FNV-1a over the hashes of every parameter and buffer, in order, each FNV-1a over its bytes:
// equal fingerprints on two ranks mean bitwise-equal models (up to a 2^-64 chance). A tensor's
// hash needs only that tensor, so a sharded model can be hashed one gathered unit at a time.
uint64_t fingerprint(const torch::nn::Module& module);
// The same over `tensors`, in order.
uint64_t fingerprint(const std::vector<torch::Tensor>& tensors);
// Its parts: one tensor's hash, and the fingerprint of a sequence of them.
uint64_t tensorHash(const torch::Tensor& tensor);
uint64_t combineHashes(const std::vector<uint64_t>& hashes);

}  // namespace examples
