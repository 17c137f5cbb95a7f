// train_gpt: a GPT (decoder-only transformer) on any text, byte by byte, with dtrain: data
// parallel (DDP) or sharded (ZeRO 1/2/3), activation recompute, LoRA fine-tuning from a PyTorch
// state_dict, AdamW with decay groups, a warm-up + cosine learning-rate schedule, gradient
// accumulation and clipping, mixed precision, validation, checkpoints with automatic resume,
// progress lines, metrics, and a generated sample at the end.
//
//   launch --nproc-per-node 2 ./train_gpt --preset nano --steps 200 --checkpoint-dir ckpt
//   launch --nproc-per-node 2 ./train_gpt --preset small --zero 3 --recompute --amp
//
// Read it top to bottom, each step where it is defined; main, at the end, takes them in order
// (but the data, read once the model is built):
//   1. options            5. optimizer, learning-rate schedule, loss scaling
//   2. join the job       6. checkpoints and resume
//   3. data               7. metrics
//   4. model              8. the training loop (accumulation, clipping, validation, checkpoints)
//                         9. summary and a generated sample
// The model is in examples/models/gpt.*; the progress lines, the schedule and the reading of a
// numeric flag are examples/training's, shared with train_resnet.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <cxxopts.hpp>
#include <torch/torch.h>

#include <dtrain/dtrain.h>

#include "models/gpt.h"
#include "training/fingerprint.h"
#include "training/flags.h"
#include "training/job.h"
#include "training/progress.h"
#include "training/schedule.h"
#include "training/state_dict.h"

namespace {

using Clock = std::chrono::steady_clock;
using examples::learningRate;
using examples::number;
using examples::setLearningRate;
using examples::usageError;

// The corpus of the Debian package `fortunes` (~2.5 MB of English), when --data is not given.
constexpr const char* kDefaultData = "/usr/share/games/fortunes";

// ---------------------------------------------------------------------------------------------
// 1. Options. Every flag has a default; --help lists them, a bad value exits 2 naming the flag.
// ---------------------------------------------------------------------------------------------
struct Options {
  std::string preset = "nano";
  examples::GptOptions model;  // the preset's, then the size flags given
  int64_t steps = 500;         // optimizer steps
  int64_t batchSize = 16;      // sequences per rank per micro-batch
  int64_t accumSteps = 1;      // micro-batches per optimizer step
  bool amp = false;            // bfloat16 autocast on the CPU, float16 + loss scaling on CUDA
  int zero = 0;                // 0: DDP; ZeRO 1: optimizer state, 2: + gradients, 3: + parameters
  bool offload = false;        // ZeRO-2/3: optimizer state on the host (a no-op on the CPU)
  std::string optimizer = "adamw";  // or sgd: plain SGD (comparisons with another trainer)
  double lr = 1e-3;                 // peak
  double minLrRatio = 0.1;          // the cosine ends at lr x this
  double weightDecay = 0.1;         // matrices only
  double beta1 = 0.9, beta2 = 0.95;
  double clip = 1.0;  // gradient norm; 0: none
  int64_t warmupSteps = 50;
  std::string data = kDefaultData;
  double valFraction = 0.1;  // the corpus's last bytes
  std::string initFrom;      // a PyTorch state_dict (torch.save) of the same model
  std::string checkpointDir;
  int64_t saveEvery = 100;   // steps; 0: at the end only
  int64_t evalEvery = 100;   // steps; 0: at the end only
  int64_t mirrorEvery = 10;  // --zero under --on-node-loss continue: steps between shard mirrors
  int64_t evalBatches = 16;  // validation sequences, spread over the ranks
  int64_t logEvery = 10;
  int64_t sampleTokens = 200;  // generated at the end; 0: none
  std::string prompt = "\n";
  double temperature = 0.8;
  int64_t topK = 40;
  uint64_t seed = 0;
  examples::JobFlags job;  // --device, --threads, rank 0's metrics sinks
};

cxxopts::Options optionSpec(const Options& o) {
  cxxopts::Options spec("train_gpt", "Train a GPT on text, byte by byte, with dtrain (run it "
                                     "under launch).");
  spec.set_width(120);
  auto str = [](const auto& v) {
    return cxxopts::value<std::string>()->default_value(fmt::format("{}", v));
  };
  auto none = [] { return cxxopts::value<std::string>(); };
  // clang-format off
  spec.add_options()
      ("preset", "nano (~0.8M) | small (~10.8M) | gpt2 (GPT-2 small's shape, 86.0M)",
                 str(o.preset))
      ("layers", "blocks (default: the preset's)", none())
      ("heads", "attention heads (default: the preset's)", none())
      ("dim", "width (default: the preset's)", none())
      ("context", "positions, the training sequences' length (default: the preset's)", none())
      ("dropout", "attention and residual dropout", str(o.model.dropout))
      ("steps", "optimizer steps", str(o.steps))
      ("batch-size", "sequences per rank per micro-batch", str(o.batchSize))
      ("accum-steps", "micro-batches per optimizer step (accumulation)", str(o.accumSteps))
      ("amp", "mixed precision: bfloat16 on the CPU; float16 + loss scaling on CUDA")
      ("zero", "0 DDP | ZeRO: 1 shard optimizer state | 2 and gradients | 3 and parameters",
               str(o.zero))
      ("offload", "--zero 2 or 3: optimizer state on the host (CUDA); a no-op on the CPU")
      ("recompute", "keep only each block's input; rerun the block in backward")
      ("lora", "rank of LoRA adapters on every projection; the base model frozen (0: none)",
               str(o.model.lora))
      ("lora-alpha", "the adapters' scale is alpha / rank", str(o.model.loraAlpha))
      ("optimizer", "adamw | sgd (plain, with the same decay groups)", str(o.optimizer))
      ("lr", "peak learning rate", str(o.lr))
      ("min-lr-ratio", "the cosine decays to lr x this", str(o.minLrRatio))
      ("weight-decay", "AdamW's, on matrices and embeddings only", str(o.weightDecay))
      ("beta1", "AdamW's", str(o.beta1))
      ("beta2", "AdamW's", str(o.beta2))
      ("clip", "clip the gradients' global norm to this (0: no clipping)", str(o.clip))
      ("warmup-steps", "linear warm-up steps before the cosine decay", str(o.warmupSteps))
      ("data", "a text file, or a directory of them (name order)", str(o.data))
      ("val-fraction", "the corpus's last bytes kept for validation", str(o.valFraction))
      ("init-from", "a PyTorch state_dict of this model (torch.save) to start from", none())
      ("checkpoint-dir", "checkpoints here (sharded with --zero); resume from the newest "
                         "(default: none)", none())
      ("save-every", "checkpoint every N steps (0: at the end only)", str(o.saveEvery))
      ("eval-every", "validation loss every N steps (0: at the end only)", str(o.evalEvery))
      ("mirror-every", "--zero under launch --on-node-loss continue: mirror the shards on "
                       "another node every N steps (a loss runs at most N steps again)",
                       str(o.mirrorEvery))
      ("eval-batches", "validation sequences per evaluation, spread over the ranks",
                       str(o.evalBatches))
      ("log-every", "steps per progress line", str(o.logEvery))
      ("sample-tokens", "bytes generated at the end (0: none)", str(o.sampleTokens))
      ("prompt", "what the sample continues", none())
      ("temperature", "of the sample", str(o.temperature))
      ("top-k", "the sample draws from the k likeliest bytes (0: all)", str(o.topK))
      ("seed", "model, data and dropout seed", str(o.seed));
  // clang-format on
  examples::addJobFlags(spec, o.job);
  return spec;
}

Options parseOptions(int argc, char** argv) {
  Options o;
  cxxopts::Options spec = optionSpec(o);
  const cxxopts::ParseResult r = examples::parseFlags(spec, argc, argv);
  o.preset = r["preset"].as<std::string>();
  const auto preset = examples::gptPreset(o.preset);
  if (!preset) usageError("--preset must be nano, small or gpt2, got '" + o.preset + "'");
  o.model = *preset;
  if (r.count("layers")) o.model.layers = number<int64_t>(r, "layers", 1, 1024);
  if (r.count("heads")) o.model.heads = number<int64_t>(r, "heads", 1, 1024);
  if (r.count("dim")) o.model.dim = number<int64_t>(r, "dim", 1, 1 << 16);
  if (r.count("context")) o.model.context = number<int64_t>(r, "context", 2, 1 << 20);
  if (o.model.dim % o.model.heads != 0) {
    usageError(
        fmt::format("--dim ({}) must be a multiple of --heads ({})", o.model.dim, o.model.heads));
  }
  o.model.dropout = number<double>(r, "dropout", 0, 0.99);
  o.model.lora = number<int64_t>(r, "lora", 0, 4096);
  o.model.loraAlpha = number<double>(r, "lora-alpha", 0, 1e6);
  o.steps = number<int64_t>(r, "steps", 0, 1e9);
  o.batchSize = number<int64_t>(r, "batch-size", 1, 1e6);
  o.accumSteps = number<int64_t>(r, "accum-steps", 1, 1e4);
  o.amp = r.count("amp") > 0;
  o.zero = number<int>(r, "zero", 0, 3);
  o.offload = r.count("offload") > 0;
  if (o.offload && o.zero < 2) usageError("--offload needs --zero 2 or 3");
  o.model.recompute = r.count("recompute") > 0;
  o.optimizer = r["optimizer"].as<std::string>();
  if (o.optimizer != "adamw" && o.optimizer != "sgd") {
    usageError("--optimizer must be adamw or sgd, got '" + o.optimizer + "'");
  }
  o.lr = number<double>(r, "lr", 0, 10);
  o.minLrRatio = number<double>(r, "min-lr-ratio", 0, 1);
  o.weightDecay = number<double>(r, "weight-decay", 0, 10);
  o.beta1 = number<double>(r, "beta1", 0, 0.999999);
  o.beta2 = number<double>(r, "beta2", 0, 0.999999);
  o.clip = number<double>(r, "clip", 0, 1e9);
  o.warmupSteps = number<int64_t>(r, "warmup-steps", 0, 1e9);
  o.data = r["data"].as<std::string>();
  o.valFraction = number<double>(r, "val-fraction", 0.001, 0.5);
  if (r.count("init-from")) o.initFrom = r["init-from"].as<std::string>();
  if (r.count("checkpoint-dir")) o.checkpointDir = r["checkpoint-dir"].as<std::string>();
  o.saveEvery = number<int64_t>(r, "save-every", 0, 1e9);
  o.evalEvery = number<int64_t>(r, "eval-every", 0, 1e9);
  o.mirrorEvery = number<int64_t>(r, "mirror-every", 1, 1e9);
  o.evalBatches = number<int64_t>(r, "eval-batches", 1, 1e6);
  o.logEvery = number<int64_t>(r, "log-every", 1, 1e9);
  o.sampleTokens = number<int64_t>(r, "sample-tokens", 0, 1e6);
  if (r.count("prompt")) o.prompt = r["prompt"].as<std::string>();
  if (o.prompt.empty()) usageError("--prompt must not be empty");
  o.temperature = number<double>(r, "temperature", 0, 100);
  o.topK = number<int64_t>(r, "top-k", 0, 256);
  o.seed = number<uint64_t>(r, "seed", 0, 1e15);
  o.job = examples::readJobFlags(r);
  return o;
}

// ---------------------------------------------------------------------------------------------
// 2. Join the job, as train_resnet does: the backend is NCCL on GPUs (cuda:LOCAL_RANK), Gloo on
//    the CPU, unless --device says which (examples::joinJob in examples/training/job.h).
// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// 3. Data. The tokens are the corpus's bytes (a vocabulary of 256, no tokenizer to ship); every
//    rank reads the whole corpus. A training sequence is a window of context + 1 bytes (inputs
//    and the next-byte targets) at a random offset, drawn from a generator seeded by the seed,
//    the step, the micro-batch and the rank: the batches of a step are the same whoever runs it
//    and whenever, so a resumed run continues with exactly the data it would have seen, with no
//    sampler state to save. Validation uses fixed windows of the corpus's last bytes.
// ---------------------------------------------------------------------------------------------
struct Data {
  torch::Tensor train, val;  // uint8 bytes
};

std::string readCorpus(const std::string& path) {
  std::vector<std::string> files;
  if (DIR* dir = opendir(path.c_str())) {
    while (dirent* entry = readdir(dir)) {
      const std::string name = entry->d_name;
      const std::string full = path + "/" + name;
      struct stat st {};
      // Regular files (not links: the fortunes package links each file to a .u8 twin), without
      // the package's .dat indexes.
      if (lstat(full.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      if (name.size() > 4 && name.compare(name.size() - 4, 4, ".dat") == 0) continue;
      files.push_back(full);
    }
    closedir(dir);
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  std::string text;
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    DTRAIN_CHECK_ARG(in.good(),
                     "cannot read the corpus {}. HINT: give --data a text file or a "
                     "directory of them{}",
                     file,
                     path == kDefaultData ? " (the default is the Debian package fortunes')" : "");
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return text;
}

Data loadData(const Options& opt) {
  const std::string text = readCorpus(opt.data);
  const auto bytes = static_cast<int64_t>(text.size());
  const auto val = static_cast<int64_t>(static_cast<double>(bytes) * opt.valFraction);
  const int64_t need = opt.model.context + 1;
  DTRAIN_CHECK_ARG(bytes - val >= need && val >= need,
                   "the corpus {} has {} bytes: its training part ({}) and validation part ({}, "
                   "--val-fraction {}) must each hold a sequence of {} (--context + 1). HINT: "
                   "more text, or a shorter --context",
                   opt.data, bytes, bytes - val, val, opt.valFraction, need);
  torch::Tensor all = torch::empty({bytes}, torch::kUInt8);
  std::memcpy(all.data_ptr(), text.data(), text.size());
  return Data{all.narrow(0, 0, bytes - val).clone(), all.narrow(0, bytes - val, val).clone()};
}

// Windows of context + 1 tokens at `offsets` of `tokens`: inputs [n, T] and targets [n, T].
std::pair<torch::Tensor, torch::Tensor> windows(const torch::Tensor& tokens,
                                                const torch::Tensor& offsets, int64_t context) {
  torch::Tensor index = offsets.to(torch::kLong).unsqueeze(1) +
                        torch::arange(context + 1, torch::kLong);
  torch::Tensor seq = tokens.index({index}).to(torch::kLong);
  return {seq.narrow(1, 0, context), seq.narrow(1, 1, context)};
}

// A generator of its own for every (seed, step, micro-batch, rank): splitmix64 of them together.
at::Generator generatorFor(uint64_t seed, int64_t step, int64_t micro, int rank) {
  uint64_t z = seed;
  for (uint64_t v :
       {static_cast<uint64_t>(step), static_cast<uint64_t>(micro), static_cast<uint64_t>(rank)}) {
    z += 0x9e3779b97f4a7c15ULL + v;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
  }
  return at::make_generator<at::CPUGeneratorImpl>(z);
}

// ---------------------------------------------------------------------------------------------
// 4. Model. Every rank builds the same model from the seed (or loads --init-from); DDP's
//    constructor then copies rank 0's values to all. With --zero 3 each block is a unit of its
//    own, sharded the moment it is built (dtrain::fullyShard) so no rank holds the blocks whole
//    -- unless --init-from has to load them first: then they are built whole, loaded, and the
//    optimizer shards them. The embeddings and the final LayerNorm are the root's (the tied head
//    uses the token embedding at both ends of the model): the model itself is marked for them.
// ---------------------------------------------------------------------------------------------
// Copies a PyTorch state_dict (torch.save's file) into the model by name. Every parameter the
// model trains from the start must be there with its shape; LoRA adapters, new to a base model,
// may be missing.
void loadStateDict(examples::Gpt& model, const std::string& path) {
  std::map<std::string, torch::Tensor> saved;
  try {
    for (auto& [name, t] : examples::readStateDict(path)) saved[name] = t;
  } catch (const std::runtime_error& e) {
    DTRAIN_THROW(dtrain::InvalidArgument, "--init-from {}", e.what());
  }
  torch::NoGradGuard noGrad;
  for (auto& p : model->named_parameters()) {
    const bool adapter = p.key().find(".lora_") != std::string::npos;
    auto it = saved.find(p.key());
    if (it == saved.end()) {
      DTRAIN_CHECK_ARG(adapter,
                       "--init-from {}: it has no {} (a state_dict of this model, "
                       "saved with torch.save(model.state_dict()), has). HINT: the same preset "
                       "and sizes as the model that saved it",
                       path, p.key());
      continue;
    }
    DTRAIN_CHECK_ARG(it->second.sizes() == p.value().sizes(),
                     "--init-from {}: {} is {} there, "
                     "{} here. HINT: the same preset and sizes as the model that saved it",
                     path, p.key(), fmt::format("{}", fmt::join(it->second.sizes(), "x")),
                     fmt::format("{}", fmt::join(p.value().sizes(), "x")));
    p.value().copy_(it->second);
  }
}

examples::Gpt buildModel(const Options& opt, const dtrain::ProcessGroup& group) {
  torch::manual_seed(opt.seed);
  examples::GptOptions o = opt.model;
  o.shardBlocks = opt.zero == 3;
  if (opt.zero == 3 && opt.initFrom.empty()) o.shardAsBuilt = dtrain::ShardPlacement(group);
  examples::Gpt model(o);
  if (!opt.initFrom.empty()) loadStateDict(model, opt.initFrom);
  model->to(group.device());
  return model;
}

// The model as DDP runs it: the whole model marked as a unit too, as FSDP2's recipe applies
// fully_shard to the root after the blocks. Under --zero 3 that shards the parameters of no block
// -- the embeddings, the head tied to the token embedding, the final LayerNorm -- like the blocks,
// 1/N per rank, gathered (in bfloat16 under --amp, as FSDP2's root) from the model's forward to
// the end of its backward; evaluation and generation run through it too. At other stages no
// ShardedOptimizer binds it and it only runs the model.
dtrain::ShardedUnit markModel(examples::Gpt& model) {
  dtrain::ShardedUnitOptions root;
  root.reshardAfterForward = false;  // backward starts with the head: keep it gathered
  return dtrain::ShardedUnit(model, root);
}

// ---------------------------------------------------------------------------------------------
// 5. Optimizer, schedule and loss scaling. AdamW in two groups, as GPT recipes have it: weight
//    decay on matrices and embeddings, none on biases and LayerNorms (with --lora only the
//    adapters are trained; --optimizer sgd: plain SGD over the same groups, for comparisons with
//    another trainer). With --zero the optimizer is a ShardedOptimizer over the same groups:
//    each rank keeps Adam's moments (at 2, the averaged gradients; at 3, the parameters) of its
//    1/N, and to the rest of the program it is an optimizer like any other (the schedule sets
//    its groups' rates). Stage 3 under --amp gathers its blocks in bfloat16 (float16 on CUDA)
//    with float32 masters (ZeroOptions::paramDtype), so autocast keeps no second copy of the
//    weights, and sums the gradients in float32. On CUDA --amp is float16, whose gradients can
//    underflow: the GradScaler scales the loss; bfloat16 needs none (the scaler is disabled).
// ---------------------------------------------------------------------------------------------
std::unique_ptr<torch::optim::Optimizer> makeOptimizer(
    const Options& opt, examples::Gpt& model,
    dtrain::DistributedDataParallel<dtrain::ShardedUnit>& ddp, const torch::Device& device) {
  // Each group's options in full, and the optimizer's defaults with weight_decay left at its
  // type's default: libtorch 2.x replaces a group's option that equals its type's default (SGD's
  // weight_decay 0, AdamW's 0.01) by the optimizer's default, so defaults with weight_decay 0.1
  // would turn the no-decay group's 0 into 0.1 under SGD.
  std::unique_ptr<torch::optim::OptimizerOptions> decay, noDecay;
  dtrain::OptimizerFactory factory;
  if (opt.optimizer == "sgd") {
    const auto sgd = torch::optim::SGDOptions(opt.lr);
    decay = std::make_unique<torch::optim::SGDOptions>(
        torch::optim::SGDOptions(sgd).weight_decay(opt.weightDecay));
    noDecay = std::make_unique<torch::optim::SGDOptions>(
        torch::optim::SGDOptions(sgd).weight_decay(0));
    factory = dtrain::optimizerFactory<torch::optim::SGD>(sgd);
  } else {
    const auto adamw = torch::optim::AdamWOptions(opt.lr).betas({opt.beta1, opt.beta2});
    decay = std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(adamw).weight_decay(opt.weightDecay));
    noDecay = std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(adamw).weight_decay(0));
    factory = dtrain::optimizerFactory<torch::optim::AdamW>(adamw);
  }
  examples::DecayGroups split = examples::decayGroups(*model);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!split.decay.empty()) groups.emplace_back(split.decay, decay->clone());
  if (!split.noDecay.empty()) groups.emplace_back(split.noDecay, noDecay->clone());
  if (opt.zero == 0) return factory.make(std::move(groups));
  dtrain::ZeroOptions zero;
  zero.stage = opt.zero;
  zero.offload = opt.offload;
  if (opt.zero == 3 && opt.amp) {
    zero.paramDtype = dtrain::AutocastGuard::lowerPrecision(device);
    zero.reduceDtype = at::kFloat;
  }
  return std::make_unique<dtrain::ShardedOptimizer>(ddp, std::move(groups), std::move(factory),
                                                    zero);
}

// ---------------------------------------------------------------------------------------------
// 6. The training state, checkpoints and resume: a TrainingState holds the model, the optimizer
//    and the scaler (the data of a step and the learning rate follow from the step, which the
//    checkpoint holds) and hears where each step begins; a Checkpointer built from it saves and
//    restores it. A restart by `launch --max-restarts`, or the command run again, resumes from
//    the newest checkpoint every rank can load; SIGTERM makes every rank save at the same step
//    and exit 75. With --zero the checkpoints are sharded; `checkpoint export` makes a PyTorch
//    state_dict of any of them.
// ---------------------------------------------------------------------------------------------
std::shared_ptr<dtrain::TrainingState> makeState(std::shared_ptr<dtrain::ProcessGroup> group,
                                                 examples::Gpt& model,
                                                 torch::optim::Optimizer& optimizer,
                                                 dtrain::GradScaler& scaler, int64_t mirrorEvery) {
  auto state = std::make_shared<dtrain::TrainingState>(std::move(group));
  state->addModule("model", model);
  state->addOptimizer("optimizer", optimizer);
  state->addScaler("scaler", scaler);
  // With --zero under `launch --on-node-loss continue`: how often the shards are mirrored on
  // another node, the most steps a lost node makes the survivors run again.
  state->setMirrorInterval(mirrorEvery);
  return state;
}

// ---------------------------------------------------------------------------------------------
// 7. Metrics, as train_resnet's: every rank records its figures (under launch they reach its
//    endpoint and file by themselves); rank 0 can also write JSONL, TensorBoard events and serve
//    Prometheus (examples::addOwnSinks, examples/training/job.h).
// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// 8. The training loop: optimizer steps of micro-batches, with progress lines, validation and
//    checkpoints between steps.
// ---------------------------------------------------------------------------------------------
struct Training {
  const Options& opt;
  dtrain::ProcessGroup& group;
  Data& data;
  examples::Gpt& model;
  dtrain::ShardedUnit& net;  // runs the model: gathers its root's units under --zero 3
  dtrain::DistributedDataParallel<dtrain::ShardedUnit>& ddp;
  torch::optim::Optimizer& optimizer;
  dtrain::GradScaler& scaler;
  dtrain::TrainingState& state;
  dtrain::Checkpointer* checkpointer;  // null without --checkpoint-dir
  dtrain::metrics::Metrics& metrics;
  int64_t firstStep;

  int64_t step = firstStep;
  int64_t savedAt = firstStep, evaluatedAt = -1;
  double lastLoss = NAN, valLoss = NAN, bestValLoss = NAN;
  examples::Progress progress{group, 0, opt.steps, "tokens"};
  Clock::time_point started = Clock::now();

  int64_t tokensPerStep() const { return opt.batchSize * opt.accumSteps * opt.model.context; }
  torch::Device device() const { return group.device(); }
  // Linear warm-up from ~0 to --lr, then half a cosine down to --lr x --min-lr-ratio.
  double lrAt(int64_t s) const {
    if (s < opt.warmupSteps) return learningRate(opt.lr, s, opt.warmupSteps, opt.steps);
    const double floor = opt.lr * opt.minLrRatio;
    return floor + learningRate(opt.lr - floor, s, opt.warmupSteps, opt.steps);
  }

  // Trains up to the last step. False when the job was preempted: every rank saved this step.
  bool run() {
    while (step < opt.steps) {
      state.beginStep(step);  // where the step begins (DTRAIN_FAULT: tests kill or stop a rank)
      const auto stepStart = Clock::now();
      // The step as a transaction: under `launch --on-node-loss continue`, a node lost during it
      // discards it on every survivor, the group re-forms among them and the step runs again
      // (docs/training.md, "Surviving a lost node"); the update is its last part. Each rank
      // keeps its batch size, so the global batch shrinks with the world. Under --zero the
      // update has collectives and the shards lived on the lost node too: the survivors roll
      // back to the last step whose shards were mirrored on another node (every --mirror-every
      // steps: TrainingState::setMirrorInterval) and run the steps from there again. Otherwise a
      // failure ends the run as before.
      // A node taken into the running job (launch --on-node-join live) settles with the members
      // at its first step: it gets their state and their step. The members finish the step in
      // flight and re-form with it before the next, which then runs on more ranks (nothing is
      // run twice; a step longer than DTRAIN_JOIN_WAIT seconds is cut short as for a loss).
      const bool joining = group.joinPending();
      const int ranks = group.size();
      bool ran = false;
      if (!state.tryStep([&] {
            ran = true;
            trainStep();
          })) {
        step = state.currentStep();
        if (joining) {
          std::printf("rank %d joined the running job at step %lld on %d ranks\n", group.rank(),
                      static_cast<long long>(step), group.size());
        } else {
          progress.line(fmt::format("a node {}: step {} runs {}on {} ranks",
                                    group.size() > ranks ? "joined" : "was lost", step,
                                    ran ? "again " : "", group.size()));
        }
        continue;
      }
      ++step;
      record(std::chrono::duration<double>(Clock::now() - stepStart).count());
      // Collectives between steps: a node lost or joining meanwhile cuts them short, and the
      // next step re-forms the group (TrainingState::tryCollective).
      if (opt.evalEvery > 0 && step % opt.evalEvery == 0) {
        state.tryCollective([&] { evaluateNow(); });
      }
      if (checkpointer) {
        if (opt.saveEvery > 0 && step % opt.saveEvery == 0) save();
        if (checkpointer->preempted(step)) {
          progress.line(fmt::format("preempted: saved step {}; run again to resume", step));
          return false;
        }
      }
    }
    return true;
  }

  torch::Tensor loss = torch::zeros({}, torch::kDouble);     // this step's, summed over micro
  torch::Tensor correct = torch::zeros({}, torch::kDouble);  // next bytes predicted right
  double gradNorm = NAN;
  // This step's host time in forward (and loss), in backward, and in the optimizer (unscale,
  // clipping, step): on CUDA the time to queue the work, not to do it.
  double forwardSeconds = 0, backwardSeconds = 0, optimizerSeconds = 0;

  void trainStep() {
    setLearningRate(optimizer, lrAt(step));
    optimizer.zero_grad();
    loss.zero_();
    correct.zero_();
    forwardSeconds = backwardSeconds = 0;
    // Dropout's masks from a generator seeded by the step: a resumed run draws the same.
    torch::manual_seed(generatorFor(opt.seed, step, -1, group.rank()).current_seed());
    for (int64_t micro = 0; micro < opt.accumSteps; ++micro) {
      at::Generator g = generatorFor(opt.seed, step, micro, group.rank());
      torch::Tensor offsets = torch::randint(data.train.numel() - opt.model.context - 1,
                                             {opt.batchSize}, g,
                                             torch::TensorOptions().dtype(torch::kLong));
      auto [x, y] = windows(data.train, offsets, opt.model.context);
      // Accumulation: all but the last micro-batch only accumulate (noSync: no communication
      // under DDP; under ZeRO-2/3 each reduce-scatters into the shards' gradients).
      if (micro + 1 < opt.accumSteps) {
        auto noSync = ddp.noSync();
        forwardBackward(x.to(device()), y.to(device()));
      } else {
        forwardBackward(x.to(device()), y.to(device()));
      }
    }
    const auto optimizerStart = Clock::now();
    if (opt.clip > 0) {
      scaler.unscale(optimizer);  // the true gradients, then their norm over every rank
      auto* sharded = dynamic_cast<dtrain::ShardedOptimizer*>(&optimizer);
      if (sharded) {
        gradNorm = dtrain::clipGradNorm(*sharded, opt.clip);
      } else {
        std::vector<torch::Tensor> trained;
        for (auto& group : optimizer.param_groups()) {
          for (auto& p : group.params()) trained.push_back(p);
        }
        gradNorm = torch::nn::utils::clip_grad_norm_(trained, opt.clip);
      }
    }
    scaler.step(optimizer);  // optimizer.step(), unless a rank's gradients overflowed
    scaler.update();
    optimizerSeconds = std::chrono::duration<double>(Clock::now() - optimizerStart).count();
  }

  // The forward and the loss under autocast with --amp; backward outside it, as in PyTorch.
  void forwardBackward(const torch::Tensor& x, const torch::Tensor& y) {
    torch::Tensor logits, l;
    const auto start = Clock::now();
    {
      dtrain::AutocastGuard autocast(device(), opt.amp);
      logits = ddp(x);
      l = torch::nn::functional::cross_entropy(
          logits.reshape({-1, logits.size(-1)}).to(torch::kFloat), y.reshape({-1}));
    }
    const auto forwardEnd = Clock::now();
    scaler.scale(l / static_cast<double>(opt.accumSteps)).backward();
    forwardSeconds += std::chrono::duration<double>(forwardEnd - start).count();
    backwardSeconds += std::chrono::duration<double>(Clock::now() - forwardEnd).count();
    loss += l.detach().to(torch::kCPU, torch::kDouble);
    correct += (logits.detach().argmax(-1) == y).sum().to(torch::kCPU, torch::kDouble);
  }

  void record(double seconds) {
    const auto tokens = static_cast<double>(tokensPerStep());
    lastLoss = loss.item<double>() / static_cast<double>(opt.accumSteps);
    progress.add(lastLoss, correct.item<double>(), tokens);
    metrics.record(step, {{"loss", lastLoss},
                          {"tokens_per_s", tokens * group.size() / seconds},
                          {"lr", lrAt(step - 1)},
                          {"grad_norm", gradNorm},
                          {"step_seconds", seconds},
                          {"forward_seconds", forwardSeconds},
                          {"backward_seconds", backwardSeconds},
                          {"optimizer_seconds", optimizerSeconds},
                          {"loss_scale", scaler.isEnabled() ? scaler.getScale() : 1.0}});
    examples::recordCheckpointWrites(checkpointer, metrics);
    if (step % opt.logEvery == 0 || step == opt.steps) {
      state.tryCollective([&] {  // its sums are allreduced: as evaluateNow() in run()
        progress.report(0, step, std::isnan(gradNorm) ? "" : fmt::format("  |g| {:.3f}", gradNorm));
      });
    }
  }

  // The mean loss over --eval-batches fixed windows of the validation bytes, each rank its share,
  // summed over the ranks. Collective (under ZeRO-3 every forward is).
  void evaluateNow() {
    const int64_t ranks = group.size();
    const int64_t each = std::max<int64_t>(1, opt.evalBatches / ranks);
    const int64_t span = data.val.numel() - opt.model.context - 1;
    std::vector<int64_t> starts;  // window i of each x ranks starts at i x span / (each x ranks)
    for (int64_t i = group.rank() * each; i < (group.rank() + 1) * each; ++i) {
      starts.push_back(i * span / (each * ranks));
    }
    torch::Tensor offsets = torch::tensor(starts, torch::kLong);
    auto [x, y] = windows(data.val, offsets, opt.model.context);
    torch::Tensor sums = torch::zeros({2}, torch::kDouble);
    {
      torch::NoGradGuard noGrad;
      model->eval();
      dtrain::AutocastGuard autocast(device(), opt.amp);
      torch::Tensor logits = net->forward(x.to(device())).to(torch::kFloat);
      sums[0].copy_(torch::nn::functional::cross_entropy(
          logits.reshape({-1, logits.size(-1)}), y.to(device()).reshape({-1}),
          torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)));
      sums[1].fill_(static_cast<double>(y.numel()));
      model->train();
    }
    sums = sums.to(device());
    group.allreduce(sums);
    valLoss = (sums[0] / sums[1]).item<double>();
    evaluatedAt = step;
    if (std::isnan(bestValLoss) || valLoss < bestValLoss) bestValLoss = valLoss;
    metrics.record(step, {{"val_loss", valLoss}});
    progress.line(fmt::format("eval step {}: validation loss {:.4f} ({:.3f} bits per byte)", step,
                              valLoss, valLoss / std::log(2.0)));
  }

  // What this rank holds of the model's state, from the tensors' storages: under ZeRO its
  // shards (ShardedOptimizer::stats()), under DDP everything.
  std::string memoryLine() {
    constexpr double kMiB = 1 << 20;
    if (auto* sharded = dynamic_cast<dtrain::ShardedOptimizer*>(&optimizer)) {
      const dtrain::ZeroMemory m = sharded->stats().memory;
      // Frozen parameters the shards do not hold (all of them at stages 1 and 2, none at 3)
      // stay whole; a freed one's storage has no bytes.
      std::set<const void*> seen;
      double whole = 0;
      for (const auto& p : model->parameters()) {
        if (p.requires_grad() || !seen.insert(p.storage().data()).second) continue;
        whole += static_cast<double>(p.storage().nbytes());
      }
      return fmt::format("model state on rank {} (ZeRO-{}): parameters {:.2f} MiB (frozen: {:.2f} "
                         "whole, {:.2f} sharded), gradients {:.2f}, master weights {:.2f}, "
                         "optimizer state {:.2f}",
                         group.rank(), opt.zero, (static_cast<double>(m.parameters) + whole) / kMiB,
                         whole / kMiB, m.frozen / kMiB, m.gradients / kMiB, m.masterWeights / kMiB,
                         m.optimizerState / kMiB);
    }
    double params = 0, frozen = 0, grads = 0, state = 0;
    for (const auto& p : model->parameters()) {
      const double bytes = static_cast<double>(p.numel() * p.element_size());
      params += bytes;
      if (!p.requires_grad()) frozen += bytes;
      if (p.grad().defined()) grads += static_cast<double>(p.grad().numel() * p.element_size());
    }
    for (const auto& [key, s] : optimizer.state()) {
      if (const auto* adam = dynamic_cast<const torch::optim::AdamWParamState*>(s.get())) {
        for (const auto* t : {&adam->exp_avg(), &adam->exp_avg_sq()}) {
          state += static_cast<double>(t->numel() * t->element_size());
        }
      }
    }
    return fmt::format("model state on rank {} (DDP): parameters {:.2f} MiB (frozen: {:.2f}), "
                       "gradients {:.2f}, optimizer state {:.2f}",
                       group.rank(), params / kMiB, frozen / kMiB, grads / kMiB, state / kMiB);
  }

  void save() {
    savedAt = step;
    const auto begin = Clock::now();
    checkpointer->saveAsync(step);
    metrics.record(step, {{"checkpoint_seconds",
                           std::chrono::duration<double>(Clock::now() - begin).count()}});
  }

  // 9. Summary and a sample. Every rank generates (under ZeRO-3 each forward gathers the
  //    blocks: collective) from the same generator; rank 0 prints.
  void finish() {
    if (evaluatedAt != step) evaluateNow();
    if (checkpointer) {
      if (savedAt != step) save();
      checkpointer->wait();
      examples::recordCheckpointWrites(checkpointer, metrics);
    }
    metrics.flush();
    std::printf("fingerprint of rank %d's model: %016llx\n", group.rank(),
                static_cast<unsigned long long>(examples::trainedFingerprint(*model, optimizer)));
    const double total = std::chrono::duration<double>(Clock::now() - started).count();
    if (step == firstStep) {
      progress.line(firstStep > 0
                        ? fmt::format("done: all {} steps were trained before; "
                                      "validation loss {:.4f}",
                                      step, valLoss)
                        : fmt::format("done: no step to train; validation loss {:.4f}", valLoss));
    } else {
      progress.line(fmt::format(
          "done: {} steps in {} ({:.0f} tokens/s); last step loss {:.4f}; validation loss "
          "{:.4f} (best {:.4f})",
          step, examples::formatDuration(total),
          static_cast<double>((step - firstStep) * tokensPerStep() * group.size()) / total,
          lastLoss, valLoss, bestValLoss));
    }
    progress.line(memoryLine());
    if (opt.sampleTokens > 0) {
      torch::Tensor prompt = torch::empty({static_cast<int64_t>(opt.prompt.size())}, torch::kUInt8);
      std::memcpy(prompt.data_ptr(), opt.prompt.data(), opt.prompt.size());
      torch::Tensor out;
      {
        dtrain::AutocastGuard autocast(device(), opt.amp);
        out = examples::generate(
                  model, [&](const torch::Tensor& x) { return net->forward(x); },
                  prompt.to(torch::kLong).to(device()), opt.sampleTokens, opt.temperature, opt.topK,
                  generatorFor(opt.seed, -1, -1, 0))
                  .to(torch::kCPU, torch::kUInt8);
      }
      const std::string sample(reinterpret_cast<const char*>(out.data_ptr()),
                               static_cast<size_t>(out.numel()));
      progress.line("sample:\n" + opt.prompt + sample);
    }
    if (!opt.job.metricsFile.empty()) progress.line("metrics: " + opt.job.metricsFile);
    if (!opt.job.tensorboardDir.empty()) progress.line("tensorboard: " + opt.job.tensorboardDir);
    if (checkpointer) progress.line("checkpoints: " + checkpointer->nodeDirectory());
  }
};

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parseOptions(argc, argv);  // 1.
  try {
    if (opt.job.threads > 0) torch::set_num_threads(static_cast<int>(opt.job.threads));

    // 2. Join the job.
    std::shared_ptr<dtrain::ProcessGroup> group = examples::joinJob(opt.job.device);
    const bool leader = group->rank() == 0;
    const torch::Device device = group->device();

    // 4. Model and DDP.
    examples::Gpt model = buildModel(opt, *group);
    dtrain::ShardedUnit net = markModel(model);
    dtrain::DistributedDataParallel<dtrain::ShardedUnit> ddp(net, group);

    // 5. Optimizer and loss scaling (the schedule is set every step).
    std::unique_ptr<torch::optim::Optimizer> optimizer = makeOptimizer(opt, model, ddp, device);
    dtrain::GradScalerOptions scalerOptions;
    scalerOptions.enabled = opt.amp && device.is_cuda();
    dtrain::GradScaler scaler(group, scalerOptions);

    // 3. Data, read once the model is built and, with --zero 3, sharded: with --init-from the
    //    model is first built whole beside the state_dict it loads, and the corpus, not needed
    //    before the first step, would add to that start-up peak.
    Data data = loadData(opt);

    // 6. The training state, checkpoints and resume.
    std::shared_ptr<dtrain::TrainingState> state = makeState(group, model, *optimizer, scaler,
                                                             opt.mirrorEvery);
    std::unique_ptr<dtrain::Checkpointer> checkpointer;
    int64_t firstStep = 0;
    if (!opt.checkpointDir.empty()) {
      checkpointer = std::make_unique<dtrain::Checkpointer>(
          state, dtrain::CheckpointOptions(opt.checkpointDir));
      if (auto restored = checkpointer->restore()) {
        firstStep = restored->step;
        if (leader) {
          std::printf("resumed from the checkpoint of step %lld (%s)\n",
                      static_cast<long long>(firstStep), restored->path.c_str());
        }
      }
    }

    // 7. Metrics.
    dtrain::metrics::Metrics metrics;
    if (leader) {
      examples::addOwnSinks(metrics,
                            {opt.job.metricsFile, opt.job.metricsPort, opt.job.tensorboardDir});
    }
    if (firstStep > 0) metrics.record(firstStep, {{"resumed", 1}});

    // 8. Train.
    if (leader) {
      int64_t parameters = 0, trained = 0;  // the tied head adds none
      for (const auto& p : model->parameters()) {
        parameters += p.numel();
        trained += p.requires_grad() ? p.numel() : 0;
      }
      std::printf("train_gpt: %s, %lld layers x %lld wide, %lld heads, context %lld: %.2fM "
                  "parameters (%.2fM trained); %d ranks x %lld tokens per step on %s%s%s%s; "
                  "%lld steps, peak lr %.3g; corpus %.2f MB\n",
                  opt.preset.c_str(), static_cast<long long>(opt.model.layers),
                  static_cast<long long>(opt.model.dim), static_cast<long long>(opt.model.heads),
                  static_cast<long long>(opt.model.context), static_cast<double>(parameters) / 1e6,
                  static_cast<double>(trained) / 1e6, group->size(),
                  static_cast<long long>(opt.batchSize * opt.accumSteps * opt.model.context),
                  device.str().c_str(),
                  opt.amp ? (device.is_cuda() ? " (amp: float16)" : " (amp: bfloat16)") : "",
                  opt.zero > 0 ? fmt::format(" (ZeRO-{})", opt.zero).c_str() : "",
                  opt.model.recompute ? " (recompute)" : "", static_cast<long long>(opt.steps),
                  opt.lr, static_cast<double>(data.train.numel() + data.val.numel()) / 1e6);
      std::fflush(stdout);
    }
    Training training{opt,     *group,     data,   model,  net,
                      ddp,     *optimizer, scaler, *state, checkpointer.get(),
                      metrics, firstStep};
    if (!training.run()) {
      group->shutdown();
      return dtrain::kExitPreempted;
    }

    // 9. Summary and a sample.
    training.finish();
    group->shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_gpt: %s\n", e.what());
    return 1;
  }
}
