#include "resnet.h"

#include <torch/nn/functional/pooling.h>
#include <torch/nn/init.h>

#include <dtrain/base/error.h>
#include <dtrain/torch/fully_shard.h>
#include <dtrain/torch/recompute.h>

namespace examples {
namespace {

namespace F = torch::nn::functional;

torch::nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

// torchvision's `downsample`: a strided 1x1 convolution and a BatchNorm, so the shortcut matches
// the block's output shape. Null when the identity already does.
torch::nn::Sequential shortcut(int64_t in, int64_t out, int64_t stride) {
  if (stride == 1 && in == out) return torch::nn::Sequential(nullptr);
  return torch::nn::Sequential(conv(in, out, 1, stride), torch::nn::BatchNorm2d(out));
}

// torchvision's initialisation of `m` and everything in it: He-normal (fan out) convolutions,
// BatchNorm at weight 1 and bias 0; the Linear layer keeps libtorch's default, as torchvision's
// does. Applied to each part as soon as it is built (torchvision applies it once the whole model
// is), so that a block sharded as it is built (shardAsBuilt) is sharded with its final values.
void initialise(torch::nn::Module& m) {
  for (auto& module : m.modules(/*include_self=*/true)) {
    if (auto* c = module->as<torch::nn::Conv2d>()) {
      torch::nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
    } else if (auto* bn = module->as<torch::nn::BatchNorm2d>()) {
      torch::nn::init::ones_(bn->weight);
      torch::nn::init::zeros_(bn->bias);
    }
  }
}

struct Layout {
  bool bottleneck;
  std::vector<int64_t> blocks;  // per stage
};

Layout layoutOf(const std::string& arch) {
  if (arch == "resnet18") return {false, {2, 2, 2, 2}};
  if (arch == "resnet34") return {false, {3, 4, 6, 3}};
  if (arch == "resnet50") return {true, {3, 4, 6, 3}};
  if (arch == "resnet101") return {true, {3, 4, 23, 3}};
  DTRAIN_THROW(dtrain::InvalidArgument, "unknown architecture '{}'; known: {}", arch,
               fmt::join(resnetArchs(), ", "));
}

}  // namespace

// Modules are registered in torchvision's order, which is the order of parameters() and of
// state_dict (and so of DDP's buckets).
BasicBlockImpl::BasicBlockImpl(int64_t inChannels, int64_t channels, int64_t stride) {
  conv1 = register_module("conv1", conv(inChannels, channels, 3, stride));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(channels));
  conv2 = register_module("conv2", conv(channels, channels, 3, 1));
  bn2 = register_module("bn2", torch::nn::BatchNorm2d(channels));
  downsample = shortcut(inChannels, channels * kExpansion, stride);
  if (downsample) register_module("downsample", downsample);
}

// In-place ReLU and residual addition, as torchvision's blocks: a convolution's fresh output is
// the only user of what they overwrite, and every tensor not allocated is memory not touched.
torch::Tensor BasicBlockImpl::forward(torch::Tensor x) {
  torch::Tensor out = bn1(conv1(x)).relu_();
  out = bn2(conv2(out));
  out += downsample ? downsample->forward(x) : x;
  return out.relu_();
}

BottleneckImpl::BottleneckImpl(int64_t inChannels, int64_t channels, int64_t stride) {
  conv1 = register_module("conv1", conv(inChannels, channels, 1, 1));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(channels));
  conv2 = register_module("conv2", conv(channels, channels, 3, stride));
  bn2 = register_module("bn2", torch::nn::BatchNorm2d(channels));
  conv3 = register_module("conv3", conv(channels, channels * kExpansion, 1, 1));
  bn3 = register_module("bn3", torch::nn::BatchNorm2d(channels * kExpansion));
  downsample = shortcut(inChannels, channels * kExpansion, stride);
  if (downsample) register_module("downsample", downsample);
}

torch::Tensor BottleneckImpl::forward(torch::Tensor x) {
  torch::Tensor out = bn1(conv1(x)).relu_();
  out = bn2(conv2(out)).relu_();
  out = bn3(conv3(out));
  out += downsample ? downsample->forward(x) : x;
  return out.relu_();
}

const std::vector<std::string>& resnetArchs() {
  static const std::vector<std::string> kArchs = {"resnet18", "resnet34", "resnet50", "resnet101"};
  return kArchs;
}

ResNetImpl::ResNetImpl(const ResNetOptions& opts) : options(opts) {
  Layout layout = layoutOf(options.arch);
  DTRAIN_CHECK_ARG(options.numClasses > 0, "numClasses must be positive, got {}",
                   options.numClasses);
  DTRAIN_CHECK_ARG(options.width > 0, "width must be positive, got {}", options.width);
  const int64_t expansion = layout.bottleneck ? BottleneckImpl::kExpansion
                                              : BasicBlockImpl::kExpansion;

  conv1 = register_module("conv1", options.cifarStem ? conv(3, options.width, 3, 1)
                                                     : conv(3, options.width, 7, 2));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(options.width));
  initialise(*conv1);
  initialise(*bn1);

  // Stage s has width * 2^s channels (times the expansion at its output); every stage but the
  // first halves the resolution in its first block.
  int64_t in = options.width;
  torch::nn::Sequential* stages[] = {&layer1, &layer2, &layer3, &layer4};
  for (size_t s = 0; s < 4; ++s) {
    int64_t channels = options.width << s;
    torch::nn::Sequential stage;
    for (int64_t b = 0; b < layout.blocks[s]; ++b) {
      int64_t stride = (s > 0 && b == 0) ? 2 : 1;
      torch::nn::AnyModule block = layout.bottleneck
                                       ? torch::nn::AnyModule(Bottleneck(in, channels, stride))
                                       : torch::nn::AnyModule(BasicBlock(in, channels, stride));
      initialise(*block.ptr());
      if (options.shardBlocks && options.shardAsBuilt) {
        stage->push_back(dtrain::fullyShard(block, *options.shardAsBuilt));  // 1/N kept from here
      } else {
        stage->push_back(block);
      }
      in = channels * expansion;
    }
    if (options.shardBlocks && !options.shardAsBuilt) {
      stage = dtrain::shardEveryChild(stage);  // names unchanged
    }
    *stages[s] = register_module("layer" + std::to_string(s + 1), stage);
  }
  fc = register_module("fc", torch::nn::Linear(in, options.numClasses));
}

torch::Tensor ResNetImpl::stem(const torch::Tensor& x) {
  torch::Tensor out = bn1(conv1(x)).relu_();
  if (options.cifarStem) return out;
  return F::max_pool2d(out, F::MaxPool2dFuncOptions(3).stride(2).padding(1));
}

torch::Tensor ResNetImpl::forward(torch::Tensor x) {
  torch::nn::Sequential* stages[] = {&layer1, &layer2, &layer3, &layer4};
  if (options.recompute) {
    // Each block is a segment of its own (recomputeSequential with one segment per child).
    x = dtrain::recompute(
        dtrain::RecomputeSegment(*conv1).add(*bn1),
        [this](const torch::Tensor& in) { return stem(in); }, x);
    for (auto* stage : stages) {
      x = dtrain::recomputeSequential(*stage, static_cast<int64_t>((*stage)->size()), x);
    }
  } else {
    x = stem(x);
    for (auto* stage : stages) x = (*stage)->forward(x);
  }
  x = F::adaptive_avg_pool2d(x, F::AdaptiveAvgPool2dFuncOptions(1)).flatten(1);
  return fc(x);
}

ResNet makeResNet(const ResNetOptions& options) { return ResNet(options); }

int64_t parameterCount(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) n += p.numel();
  return n;
}

namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL;
constexpr uint64_t kFnvPrime = 0x100000001b3ULL;

uint64_t fnv1a(uint64_t hash, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) hash = (hash ^ p[i]) * kFnvPrime;
  return hash;
}

}  // namespace

uint64_t tensorHash(const torch::Tensor& tensor) {
  torch::Tensor c = tensor.detach().cpu().contiguous();
  return fnv1a(kFnvOffset, static_cast<const uint8_t*>(c.data_ptr()), c.numel() * c.element_size());
}

uint64_t combineHashes(const std::vector<uint64_t>& hashes) {
  uint64_t hash = kFnvOffset;
  for (uint64_t h : hashes) hash = fnv1a(hash, reinterpret_cast<const uint8_t*>(&h), sizeof h);
  return hash;
}

uint64_t fingerprint(const std::vector<torch::Tensor>& tensors) {
  std::vector<uint64_t> hashes;
  hashes.reserve(tensors.size());
  for (const auto& t : tensors) hashes.push_back(tensorHash(t));
  return combineHashes(hashes);
}

uint64_t fingerprint(const torch::nn::Module& module) {
  std::vector<torch::Tensor> tensors = module.parameters();
  for (const auto& b : module.buffers()) tensors.push_back(b);
  return fingerprint(tensors);
}

}  // namespace examples
