#include "models/gpt.h"

#include <cmath>

#include <ATen/ATen.h>
#include <torch/nn/functional.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/container/sequential.h>

#include <dtrain/torch/recompute.h>

namespace examples {

namespace F = torch::nn::functional;

std::optional<GptOptions> gptPreset(const std::string& name) {
  GptOptions o;
  if (name == "nano") return o;  // the defaults
  if (name == "small") {
    o.context = 256;
    o.layers = 6;
    o.heads = 6;
    o.dim = 384;
    return o;
  }
  if (name == "gpt2") {
    o.context = 1024;
    o.layers = 12;
    o.heads = 12;
    o.dim = 768;
    return o;
  }
  return std::nullopt;
}

const std::vector<std::string>& gptPresetNames() {
  static const std::vector<std::string> names = {"nano", "small", "gpt2"};
  return names;
}

LoraLinearImpl::LoraLinearImpl(int64_t in, int64_t out, int64_t rank, double alpha) {
  torch::NoGradGuard noGrad;
  weight = register_parameter("weight", torch::empty({out, in}).normal_(0, 0.02));
  bias = register_parameter("bias", torch::zeros({out}));
  if (rank > 0) {
    // PEFT's initialisation: A as a Linear layer's default, B zero, so the adapted model starts
    // as the base model. The base is frozen.
    loraA = register_parameter("lora_a", torch::empty({rank, in}));
    torch::nn::init::kaiming_uniform_(loraA, std::sqrt(5.0));
    loraB = register_parameter("lora_b", torch::zeros({out, rank}));
    weight.set_requires_grad(false);
    bias.set_requires_grad(false);
    scale = alpha / static_cast<double>(rank);
  }
}

torch::Tensor LoraLinearImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = F::linear(x, weight, bias);
  if (!loraA.defined()) return y;
  return y + F::linear(F::linear(x, loraA), loraB) * scale;
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptOptions& o)
    : heads(o.heads), dropout(o.dropout) {
  qkv = register_module("qkv", LoraLinear(o.dim, 3 * o.dim, o.lora, o.loraAlpha));
  proj = register_module("proj", LoraLinear(o.dim, o.dim, o.lora, o.loraAlpha));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
  // [B, T, 3C] -> q, k, v of [B, heads, T, C / heads].
  std::vector<torch::Tensor> qkvs = qkv(x).split(c, 2);
  for (auto& part : qkvs) part = part.view({b, t, heads, c / heads}).transpose(1, 2);
  torch::Tensor y = at::scaled_dot_product_attention(qkvs[0], qkvs[1], qkvs[2], /*attn_mask=*/{},
                                                     is_training() ? dropout : 0.0,
                                                     /*is_causal=*/true);
  y = y.transpose(1, 2).contiguous().view({b, t, c});
  return F::dropout(proj(y), F::DropoutFuncOptions().p(dropout).training(is_training()));
}

MlpImpl::MlpImpl(const GptOptions& o) : dropout(o.dropout) {
  fc = register_module("fc", LoraLinear(o.dim, 4 * o.dim, o.lora, o.loraAlpha));
  proj = register_module("proj", LoraLinear(4 * o.dim, o.dim, o.lora, o.loraAlpha));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  // Two statements, not one: a temporary lives to the end of its full expression, so fc's output
  // (4 x the width) would outlast gelu into proj. Where nothing saved it for backward -- an
  // evaluation, a sample, recompute's first forward -- it is freed before proj allocates, as in
  // PyTorch, whose F.gelu lets go of its argument when it returns.
  const torch::Tensor hidden = F::gelu(fc(x));
  return F::dropout(proj(hidden), F::DropoutFuncOptions().p(dropout).training(is_training()));
}

GptBlockImpl::GptBlockImpl(const GptOptions& o) {
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.dim})));
  attn = register_module("attn", CausalSelfAttention(o));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.dim})));
  mlp = register_module("mlp", Mlp(o));
  // GPT-2: the projections into the residual stream scaled by 1/sqrt(2 x layers), one per
  // sublayer, so the stream's variance does not grow with depth.
  torch::NoGradGuard noGrad;
  const double scale = 1.0 / std::sqrt(2.0 * static_cast<double>(o.layers));
  attn->proj->weight.mul_(scale);
  mlp->proj->weight.mul_(scale);
  if (o.lora > 0) {
    for (auto& p : ln1->parameters()) p.set_requires_grad(false);
    for (auto& p : ln2->parameters()) p.set_requires_grad(false);
  }
}

torch::Tensor GptBlockImpl::forward(const torch::Tensor& x) {
  torch::Tensor h = x + attn(ln1(x));
  return h + mlp(ln2(h));
}

GptImpl::GptImpl(const GptOptions& o) : options(o) {
  TORCH_CHECK(o.dim % o.heads == 0, "the width (", o.dim, ") must divide into ", o.heads, " heads");
  wte = register_module("wte", torch::nn::Embedding(o.vocab, o.dim));
  wpe = register_module("wpe", torch::nn::Embedding(o.context, o.dim));
  {
    torch::NoGradGuard noGrad;
    wte->weight.normal_(0, 0.02);
    wpe->weight.normal_(0, 0.02);
  }
  blocks = torch::nn::Sequential();
  for (int64_t i = 0; i < o.layers; ++i) {
    GptBlock block(o);
    // Built in the same order whatever the options, so one seed gives the same values.
    if (o.shardBlocks && o.shardAsBuilt) {
      blocks->push_back(dtrain::fullyShard(block, *o.shardAsBuilt));  // 1/N kept from here
    } else {
      blocks->push_back(block);
    }
  }
  if (o.shardBlocks && !o.shardAsBuilt) blocks = dtrain::shardEveryChild(blocks);
  register_module("blocks", blocks);
  lnF = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.dim})));
  if (o.lora > 0) {
    for (auto* m : {wte.ptr().get(), wpe.ptr().get()}) {
      for (auto& p : m->parameters()) p.set_requires_grad(false);
    }
    for (auto& p : lnF->parameters()) p.set_requires_grad(false);
  }
}

torch::Tensor GptImpl::forward(const torch::Tensor& tokens) {
  const int64_t t = tokens.size(1);
  TORCH_CHECK(t <= options.context, "a sequence of ", t, " tokens; the model has ", options.context,
              " positions");
  torch::Tensor positions = torch::arange(t, tokens.options());
  torch::Tensor x = wte(tokens) + wpe(positions);
  x = F::dropout(x, F::DropoutFuncOptions().p(options.dropout).training(is_training()));
  if (options.recompute) {
    x = dtrain::recomputeSequential(blocks, static_cast<int64_t>(blocks->size()), x);
  } else {
    x = blocks->forward(x);
  }
  // The head is the token embedding, transposed: logits[v] = <x, wte[v]>.
  return F::linear(lnF(x), wte->weight);
}

DecayGroups decayGroups(torch::nn::Module& model) {
  DecayGroups groups;
  for (const auto& p : model.named_parameters()) {
    if (!p.value().requires_grad()) continue;
    (p.value().dim() >= 2 ? groups.decay : groups.noDecay).push_back(p.value());
  }
  return groups;
}

torch::Tensor generate(Gpt& model, const std::function<torch::Tensor(const torch::Tensor&)>& run,
                       torch::Tensor prompt, int64_t count, double temperature, int64_t topK,
                       at::Generator generator) {
  torch::NoGradGuard noGrad;
  const bool training = model->is_training();
  model->eval();
  torch::Tensor tokens = prompt.to(torch::kLong).reshape({1, -1});
  for (int64_t i = 0; i < count; ++i) {
    const int64_t t = tokens.size(1);
    torch::Tensor context = tokens.narrow(1, std::max<int64_t>(0, t - model->options.context),
                                          std::min(t, model->options.context));
    torch::Tensor logits = run(context).select(1, -1).to(torch::kFloat) /
                           std::max(temperature, 1e-6);
    if (topK > 0 && topK < logits.size(-1)) {
      const torch::Tensor kth = std::get<0>(logits.topk(topK)).select(-1, -1).unsqueeze(-1);
      logits = logits.masked_fill(logits < kth, -INFINITY);
    }
    torch::Tensor next = at::multinomial(logits.softmax(-1), 1, false, generator);
    tokens = torch::cat({tokens, next.to(tokens.device())}, 1);
  }
  model->train(training);
  return tokens.reshape({-1}).narrow(0, prompt.numel(), count);
}

}  // namespace examples
