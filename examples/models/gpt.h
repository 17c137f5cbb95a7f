#pragma once
// A decoder-only transformer (GPT-2's layout) as torch::nn modules: token and position
// embeddings, pre-norm blocks of causal self-attention (scaled_dot_product_attention) and a GELU
// MLP, a final LayerNorm, and the language-model head tied to the token embedding (no weight of
// its own). The parameters' names are the state_dict keys of the PyTorch model beside it
// (benchmarks/gpt/gpt_model.py), so a state_dict saved by `torch.save` there loads here and an
// export from here loads there:
//   wte.weight, wpe.weight,
//   blocks.<i>.ln1.{weight,bias}, blocks.<i>.attn.qkv.{weight,bias},
//   blocks.<i>.attn.proj.{weight,bias}, blocks.<i>.ln2.{weight,bias},
//   blocks.<i>.mlp.fc.{weight,bias}, blocks.<i>.mlp.proj.{weight,bias},
//   ln_f.{weight,bias}
// and with LoRA adapters, beside each projection's weight: <proj>.lora_a, <proj>.lora_b.
// Initialisation as GPT-2's: normal(0, 0.02) weights and embeddings, the residual projections'
// scaled by 1/sqrt(2 x layers), zero biases, LayerNorm 1 and 0.
//
// Options the training program uses:
//   - lora: every attention and MLP projection gets rank-`lora` adapters (LoRA, Hu et al. 2021):
//     y = x W^T + b + (alpha / r) x A^T B^T, with A [r, in] (Kaiming-uniform) and B [out, r]
//     (zeros, so training starts from the base model), and the base model is frozen
//     (requires_grad false on every other parameter);
//   - recompute: every block runs through dtrain::recomputeSequential, so forward keeps only
//     the blocks' inputs and backward runs each block again;
//   - shardBlocks: every block is a dtrain::ShardedUnit (ZeRO-3): under a stage-3
//     ShardedOptimizer its parameters are gathered only while it runs; the embeddings (the tied
//     head uses the token embedding at both ends of the model) and ln_f are the root's, a unit
//     when the model itself is marked too (train_gpt's markModel). With shardAsBuilt each block
//     is sharded the moment it is built (dtrain::fullyShard).
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>

#include <dtrain/torch/fully_shard.h>

namespace examples {

struct GptOptions {
  int64_t vocab = 256;    // byte-level tokens
  int64_t context = 128;  // positions
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t dim = 128;
  double dropout = 0;     // attention and residual dropout, in training mode
  int64_t lora = 0;       // adapter rank; 0: none, every parameter trained
  double loraAlpha = 16;  // the adapters' output is scaled by loraAlpha / lora
  bool recompute = false;
  bool shardBlocks = false;
  std::optional<dtrain::ShardPlacement> shardAsBuilt;  // with shardBlocks: where (the group)
};

// The presets: "nano" (~0.8M parameters, the tests'), "small" (~10.8M, the CPU benchmark's),
// "gpt2" (GPT-2 small's shape, 12 x 768 with 1024 positions: 86.0M with byte-level tokens, 124M
// with GPT-2's 50257-token vocabulary). Empty optional for an unknown name.
std::optional<GptOptions> gptPreset(const std::string& name);
const std::vector<std::string>& gptPresetNames();

// A Linear layer with optional LoRA adapters; its parameters are weight, bias (and lora_a,
// lora_b), as torch.nn.Linear's (and the peer's adapters).
struct LoraLinearImpl : torch::nn::Module {
  LoraLinearImpl(int64_t in, int64_t out, int64_t rank, double alpha);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias, loraA, loraB;  // loraA, loraB undefined without adapters
  double scale = 0;
};
TORCH_MODULE(LoraLinear);

struct CausalSelfAttentionImpl : torch::nn::Module {
  explicit CausalSelfAttentionImpl(const GptOptions& o);
  torch::Tensor forward(const torch::Tensor& x);  // [B, T, C] -> [B, T, C]
  LoraLinear qkv{nullptr}, proj{nullptr};
  int64_t heads;
  double dropout;
};
TORCH_MODULE(CausalSelfAttention);

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(const GptOptions& o);
  torch::Tensor forward(const torch::Tensor& x);
  LoraLinear fc{nullptr}, proj{nullptr};
  double dropout;
};
TORCH_MODULE(Mlp);

// x + attn(ln1(x)), then + mlp(ln2(x)): one unit of ZeRO-3, one segment of recompute.
struct GptBlockImpl : torch::nn::Module {
  explicit GptBlockImpl(const GptOptions& o);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(GptBlock);

struct GptImpl : torch::nn::Module {
  explicit GptImpl(const GptOptions& options);
  // [B, T] token ids (int64, T <= context) -> [B, T, vocab] logits.
  torch::Tensor forward(const torch::Tensor& tokens);
  GptOptions options;
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::Sequential blocks{nullptr};
  torch::nn::LayerNorm lnF{nullptr};
};
TORCH_MODULE(Gpt);

// Trained parameters that AdamW's weight decay applies to (matrices: the projections' weights,
// the embeddings, the adapters) and those it does not (biases, LayerNorm), by name, as GPT
// recipes split them. Frozen parameters are in neither.
struct DecayGroups {
  std::vector<torch::Tensor> decay, noDecay;
};
DecayGroups decayGroups(torch::nn::Module& model);

// `count` tokens sampled after `prompt` ([T] int64), one at a time, `model` in eval mode and
// without gradients, each forward through `run` (the model's own forward, or a dtrain::
// ShardedUnit around the model, which gathers what it shards): multinomial at `temperature` over
// the `topK` most likely (0: all), from `generator`. The context is the last options.context
// tokens.
torch::Tensor generate(Gpt& model, const std::function<torch::Tensor(const torch::Tensor&)>& run,
                       torch::Tensor prompt, int64_t count, double temperature, int64_t topK,
                       at::Generator generator);

}  // namespace examples
