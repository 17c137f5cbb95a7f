// examples/models/gpt and examples/training/state_dict: the parameter count of every preset, the
// tied head and the causal mask, LoRA starting as its base with only the adapters trained,
// recompute bitwise, the MLP's memory without gradients, and PyTorch's model
// (benchmarks/gpt/gpt_model.py): its state_dict, read without Python (and held once), gives this
// model PyTorch's logits; what is not a state_dict is refused.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "counting_allocator.h"
#include "models/gpt.h"
#include "test_support.h"
#include "training/state_dict.h"

namespace examples::gpt_test {
namespace {

int64_t count(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

// Embeddings V d + C d; per block LayerNorms 2 x 2d, qkv 3d^2 + 3d, proj d^2 + d, fc 4d^2 + 4d,
// proj 4d^2 + d; ln_f 2d; the head tied (nothing).
TEST(GptModel, PresetsHaveTheFormulasParameterCount) {
  for (const auto& name : gptPresetNames()) {
    GptOptions o = *gptPreset(name);
    if (name == "gpt2") o.layers = 1;  // the formula, without building 85M parameters
    Gpt model(o);
    const int64_t d = o.dim;
    EXPECT_EQ(count(*model), o.vocab * d + o.context * d + o.layers * (12 * d * d + 13 * d) + 2 * d)
        << name;
  }
  EXPECT_EQ(count(*Gpt(*gptPreset("nano"))), 842496);
  EXPECT_FALSE(gptPreset("huge").has_value());
}

// The head is wte transposed: logits = ln_f(h) wte^T, no parameter of its own. Changing the
// tokens after position t changes no logit at or before t (the causal mask).
TEST(GptModel, TheHeadIsTheTokenEmbeddingAndAttentionIsCausal) {
  torch::manual_seed(1);
  Gpt model(*gptPreset("nano"));
  for (const auto& p : model->named_parameters()) {
    EXPECT_EQ(p.key().find("head"), std::string::npos) << p.key();
  }
  torch::Tensor tokens = torch::randint(256, {2, 32}, torch::kLong);
  torch::Tensor logits = model->forward(tokens);
  ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{2, 32, 256}));
  torch::Tensor other = tokens.clone();
  other.narrow(1, 20, 12).random_(256);
  torch::Tensor changed = model->forward(other);
  EXPECT_TRUE(torch::allclose(changed.narrow(1, 0, 20), logits.narrow(1, 0, 20), 0, 0));
  EXPECT_FALSE(torch::allclose(changed.narrow(1, 20, 12), logits.narrow(1, 20, 12)));
  // The logits are the final hidden state against every token's embedding.
  torch::NoGradGuard noGrad;
  torch::Tensor x = model->wte(tokens) + model->wpe(torch::arange(32, torch::kLong));
  x = model->lnF(model->blocks->forward(x));
  EXPECT_TRUE(torch::allclose(torch::matmul(x, model->wte->weight.t()), logits, 1e-5, 1e-6));
}

// B starts at zero, so a LoRA model with its base's weights gives the base's outputs; only the
// adapters need gradients, and the decay group holds them all.
TEST(GptModel, LoraStartsAsItsBaseAndTrainsOnlyTheAdapters) {
  torch::manual_seed(2);
  Gpt base(*gptPreset("nano"));
  GptOptions o = *gptPreset("nano");
  o.lora = 4;
  Gpt adapted(o);
  const auto baseParams = base->named_parameters();
  int64_t adapters = 0;
  torch::NoGradGuard noGrad;
  for (auto& p : adapted->named_parameters()) {
    const bool adapter = p.key().find(".lora_") != std::string::npos;
    EXPECT_EQ(p.value().requires_grad(), adapter) << p.key();
    if (adapter) {
      adapters += p.value().numel();
    } else {
      p.value().copy_(baseParams[p.key()]);
    }
  }
  EXPECT_EQ(adapters, 4 * 4 * ((128 + 384) + (128 + 128) + (128 + 512) + (512 + 128)));
  torch::Tensor tokens = torch::randint(256, {2, 16}, torch::kLong);
  EXPECT_TRUE(torch::equal(adapted->forward(tokens), base->forward(tokens)));
  const DecayGroups groups = decayGroups(*adapted);
  int64_t decayed = 0;
  for (const auto& t : groups.decay) decayed += t.numel();
  EXPECT_EQ(decayed, adapters);
  EXPECT_TRUE(groups.noDecay.empty());
}

// Recompute: the same loss and gradients, bitwise.
TEST(GptModel, RecomputeGivesTheSameGradientsBitwise) {
  auto gradients = [](bool recompute) {
    torch::manual_seed(3);
    GptOptions o = *gptPreset("nano");
    o.recompute = recompute;
    Gpt model(o);
    torch::Tensor tokens = torch::randint(256, {2, 24}, torch::kLong);
    torch::nn::functional::cross_entropy(model->forward(tokens).reshape({-1, 256}),
                                         tokens.roll(-1, 1).reshape({-1}))
        .backward();
    std::map<std::string, torch::Tensor> out;
    for (const auto& p : model->named_parameters()) out[p.key()] = p.value().grad().clone();
    return out;
  };
  const auto plain = gradients(false), recomputed = gradients(true);
  for (const auto& [name, g] : plain) EXPECT_TRUE(torch::equal(recomputed.at(name), g)) << name;
}

// Without gradients (an evaluation, a sample, recompute's first forward) the MLP frees fc's output
// before proj allocates its own: at most fc's and gelu's outputs (4 x the width each) at once, as
// in PyTorch, never those and proj's output together.
TEST(GptModel, AnMlpWithoutGradientsHoldsAtMostTwoHiddenActivations) {
  auto& counting = dtrain::testing::CountingCpuAllocator::install();
  const GptOptions o = *gptPreset("nano");
  Mlp mlp(o);
  const torch::Tensor x = torch::randn({4, 32, o.dim});
  const int64_t out = x.numel() * static_cast<int64_t>(sizeof(float));  // proj's
  const int64_t hidden = 4 * out;                                       // fc's, gelu's
  torch::NoGradGuard noGrad;
  const int64_t before = counting.live();
  counting.resetPeak();
  const torch::Tensor y = mlp(x);
  const int64_t peak = counting.peak() - before;
  EXPECT_GE(peak, 2 * hidden);        // the count sees fc's and gelu's outputs alive together
  EXPECT_LT(peak, 2 * hidden + out);  // but fc's gone before proj's output is made
  EXPECT_EQ(y.sizes(), x.sizes());
}

std::string peerScript(const std::string& body) {
  return "import sys, torch\nsys.path.insert(0, '" + dtrain::testing::sourceDir() +
         "/benchmarks/gpt')\nfrom gpt_model import GPT, GPTConfig\n" + body;
}

// PyTorch's model saves its state_dict (an OrderedDict, as model.state_dict() is) and its logits
// on a batch; this model, loaded from that file by readStateDict, gives the same logits.
TEST(GptInterop, PyTorchsStateDictGivesPyTorchsLogits) {
  dtrain::testing::TempDir dir;
  const std::string script = peerScript(
      "torch.manual_seed(5)\n"
      "m = GPT(GPTConfig.preset('nano')).eval()\n"
      "torch.save(m.state_dict(), sys.argv[1])\n"
      "tokens = torch.randint(256, (3, 40))\n"
      "with torch.no_grad():\n"
      "  torch.save({'tokens': tokens, 'logits': m(tokens)}, sys.argv[2])\n");
  dtrain::testing::writeFile(dir.file("peer.py"), script);
  const std::string cmd = dtrain::testing::python() + " " + dir.file("peer.py") + " " +
                          dir.file("model.pt") + " " + dir.file("batch.pt");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  Gpt model(*gptPreset("nano"));
  model->eval();
  std::map<std::string, torch::Tensor> saved;
  for (auto& [name, t] : readStateDict(dir.file("model.pt"))) saved[name] = t;
  torch::NoGradGuard noGrad;
  for (auto& p : model->named_parameters()) {
    ASSERT_TRUE(saved.count(p.key())) << p.key();
    ASSERT_EQ(saved.at(p.key()).sizes(), p.value().sizes()) << p.key();
    p.value().copy_(saved.at(p.key()));
  }
  EXPECT_EQ(saved.size(), model->named_parameters().size());
  std::map<std::string, torch::Tensor> batch;
  for (auto& [name, t] : readStateDict(dir.file("batch.pt"))) batch[name] = t;
  const torch::Tensor logits = model->forward(batch.at("tokens"));
  EXPECT_TRUE(torch::allclose(logits, batch.at("logits"), 1e-5, 1e-5))
      << (logits - batch.at("logits")).abs().max().item<double>();
}

// readStateDict holds a state_dict once: each storage is read straight into its tensor, so the
// reading's peak is the tensors' bytes, not those and a record's buffer (the largest's) beside.
TEST(GptInterop, AStateDictIsReadIntoItsTensorsWithNoSecondCopy) {
  dtrain::testing::TempDir dir;
  dtrain::testing::writeFile(
      dir.file("peer.py"),
      peerScript("torch.save(GPT(GPTConfig.preset('nano')).state_dict(), sys.argv[1])\n"));
  const std::string cmd = dtrain::testing::python() + " " + dir.file("peer.py") + " " +
                          dir.file("model.pt");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto& counting = dtrain::testing::CountingCpuAllocator::install();
  const int64_t before = counting.live();
  counting.resetPeak();
  int64_t total = 0, largest = 0;
  {
    const auto state = readStateDict(dir.file("model.pt"));
    for (const auto& [name, t] : state) {
      const auto bytes = static_cast<int64_t>(t.storage().nbytes());
      total += bytes;
      largest = std::max(largest, bytes);
    }
    EXPECT_EQ(counting.live() - before, total);  // each parameter its own storage, nothing else
  }
  const int64_t peak = counting.peak() - before;
  EXPECT_GE(peak, total);
  EXPECT_LT(peak, total + largest);
}

// A pickled module (torch.save(model)), a checkpoint of several things and a file that is no
// archive are refused, naming the file and what to save instead.
TEST(GptInterop, WhatIsNotAStateDictIsRefusedWithAHint) {
  dtrain::testing::TempDir dir;
  const std::string script = peerScript(
      "m = GPT(GPTConfig(layers=1))\n"
      "torch.save(m, sys.argv[1])\n"
      "torch.save({'model': m.state_dict(), 'step': 3}, sys.argv[2])\n");
  dtrain::testing::writeFile(dir.file("peer.py"), script);
  const std::string cmd = dtrain::testing::python() + " " + dir.file("peer.py") + " " +
                          dir.file("module.pt") + " " + dir.file("nested.pt");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  dtrain::testing::writeFile(dir.file("text.pt"), "not an archive");
  const std::map<std::string, std::string> expected = {
      {"module.pt", "gpt_model.GPT"},
      {"nested.pt", "its entry model is not a tensor"},
      {"text.pt", "not an archive torch.save writes"}};
  for (const auto& [file, what] : expected) {
    try {
      readStateDict(dir.file(file));
      ADD_FAILURE() << file << " was read";
    } catch (const std::runtime_error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(file), std::string::npos) << message;
      EXPECT_NE(message.find(what), std::string::npos) << message;
      EXPECT_NE(message.find("HINT"), std::string::npos) << message;
    }
  }
}

}  // namespace
}  // namespace examples::gpt_test
