// train_resnet: ResNet-18/34/50/101 on CIFAR-10 with dtrain, the way a real training job runs:
// data-parallel over every rank (DDP), a background data loader, a warm-up + cosine learning-rate
// schedule, gradient accumulation, mixed precision, checkpoints with automatic resume,
// evaluation, progress lines and metrics.
//
//   launch --nproc-per-node 2 --max-restarts 3 ./train_resnet --arch resnet18 --data-dir cifar
//          --synthetic 10000 --epochs 5 --checkpoint-dir ckpt --metrics-file metrics.jsonl
//
// Read it top to bottom, each step where it is defined; main, at the end, takes them in order:
//   1. options            6. checkpoints and resume
//   2. join the job       7. metrics
//   3. data               8. the training loop (accumulation, mixed precision, progress,
//   4. model and DDP         evaluation, checkpoints)
//   5. optimizer, learning-rate schedule, loss scaling   9. summary
// Helpers live beside it: the models in examples/models, the CIFAR-10 reader and the loader
// thread in examples/data, the progress lines, the test-set evaluation, the learning-rate
// schedule, the closing fingerprint and the reading of a numeric flag in examples/training.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include <cxxopts.hpp>
#include <torch/torch.h>

#include <dtrain/dtrain.h>

#include "data/cifar10.h"
#include "data/loader.h"
#include "models/resnet.h"
#include "training/evaluate.h"
#include "training/fingerprint.h"
#include "training/flags.h"
#include "training/job.h"
#include "training/progress.h"
#include "training/schedule.h"

namespace {

using Clock = std::chrono::steady_clock;
using examples::learningRate;
using examples::number;
using examples::setLearningRate;
using examples::usageError;

// ---------------------------------------------------------------------------------------------
// 1. Options. Every flag has a default; --help lists them, a bad value exits 2 naming the flag.
// ---------------------------------------------------------------------------------------------
struct Options {
  std::string arch = "resnet18";
  int64_t width = 64;         // channels of the first stage (torchvision: 64)
  bool imagenetStem = false;  // 7x7/2 + max-pool instead of the CIFAR stem (3x3, no pool)
  int64_t epochs = 10;
  int64_t batchSize = 128;  // per rank
  int64_t accumSteps = 1;   // micro-batches per optimizer step
  bool amp = false;         // mixed precision: bfloat16 autocast on the CPU, float16 on CUDA
  int zero = 0;             // 0: DDP; ZeRO 1: optimizer state, 2: + gradients, 3: + parameters
  bool offload = false;     // ZeRO-2/3: optimizer state on the host (a no-op on the CPU)
  bool recompute = false;   // recompute the stem and each residual block in backward
  double lr = 0.2;          // for 256 samples per step; scaled linearly with the global batch
  double momentum = 0.9;
  double weightDecay = 5e-4;
  int64_t warmupSteps = 100;
  std::string checkpointDir;  // empty: no checkpoints
  int64_t saveEvery = 0;      // steps; 0: at the end of every epoch
  std::string dataDir = "cifar10";
  int64_t synthetic = 0;  // > 0: write a synthetic set of this many training images first
  uint64_t seed = 0;
  int64_t evalEvery = 0;   // steps; 0: at the end of every epoch
  int64_t logEvery = 20;   // steps per progress line
  examples::JobFlags job;  // --device, --threads, rank 0's metrics sinks
};

// The flags, each with its line of --help and its default from Options.
cxxopts::Options optionSpec(const Options& o) {
  cxxopts::Options spec("train_resnet",
                        "Train a ResNet on CIFAR-10 with dtrain (run it under launch).");
  spec.set_width(120);  // one line per flag
  auto str = [](const auto& v) {
    return cxxopts::value<std::string>()->default_value(fmt::format("{}", v));
  };
  auto none = [] { return cxxopts::value<std::string>(); };  // no default value
  // clang-format off
  spec.add_options()
      ("arch", "resnet18 | resnet34 | resnet50 | resnet101", str(o.arch))
      ("width", "channels of the first stage (torchvision: 64)", str(o.width))
      ("imagenet-stem", "7x7/2 convolution + max-pool stem instead of CIFAR's 3x3")
      ("epochs", "passes over the training set", str(o.epochs))
      ("batch-size", "samples per rank per micro-batch", str(o.batchSize))
      ("accum-steps", "micro-batches per optimizer step (accumulation)", str(o.accumSteps))
      ("amp", "mixed precision: bfloat16 on the CPU; float16 + loss scaling on CUDA")
      ("zero", "0 DDP | ZeRO: 1 shard optimizer state | 2 and gradients | 3 and parameters",
               str(o.zero))
      ("offload", "--zero 2 or 3: optimizer state on the host (CUDA); a no-op on the CPU")
      ("recompute", "keep only the stem's and each residual block's input; rerun them in backward")
      ("lr", "peak learning rate per 256 samples a step (scaled to the batch)", str(o.lr))
      ("momentum", "SGD momentum", str(o.momentum))
      ("weight-decay", "SGD weight decay", str(o.weightDecay))
      ("warmup-steps", "linear warm-up steps before the cosine decay", str(o.warmupSteps))
      ("checkpoint-dir", "checkpoints here (sharded with --zero); resume from the newest "
                         "(default: none)", none())
      ("save-every", "checkpoint every N steps (0: after every epoch)", str(o.saveEvery))
      ("data-dir", "CIFAR-10 binary files (data_batch_1..5.bin, test_batch.bin)", str(o.dataDir))
      ("synthetic", "first write N synthetic training images (N/5 test) there", str(o.synthetic))
      ("seed", "model, sampler and augmentation seed", str(o.seed))
      ("eval-every", "test accuracy every N steps (0: after every epoch)", str(o.evalEvery))
      ("log-every", "steps per progress line", str(o.logEvery));
  // clang-format on
  examples::addJobFlags(spec, o.job);
  return spec;
}

Options parseOptions(int argc, char** argv) {
  Options o;
  cxxopts::Options spec = optionSpec(o);
  const cxxopts::ParseResult r = examples::parseFlags(spec, argc, argv);
  o.arch = r["arch"].as<std::string>();
  const auto& archs = examples::resnetArchs();
  if (std::find(archs.begin(), archs.end(), o.arch) == archs.end()) {
    usageError("--arch must be one of resnet18, resnet34, resnet50, resnet101, got '" + o.arch +
               "'");
  }
  o.width = number<int64_t>(r, "width", 1, 4096);
  o.imagenetStem = r.count("imagenet-stem") > 0;
  o.epochs = number<int64_t>(r, "epochs", 1, 1e6);
  o.batchSize = number<int64_t>(r, "batch-size", 1, 1e6);
  o.accumSteps = number<int64_t>(r, "accum-steps", 1, 1e4);
  o.amp = r.count("amp") > 0;
  o.zero = number<int>(r, "zero", 0, 3);
  o.offload = r.count("offload") > 0;
  o.recompute = r.count("recompute") > 0;
  o.lr = number<double>(r, "lr", 0, 1e3);
  o.momentum = number<double>(r, "momentum", 0, 1);
  o.weightDecay = number<double>(r, "weight-decay", 0, 1);
  o.warmupSteps = number<int64_t>(r, "warmup-steps", 0, 1e9);
  if (r.count("checkpoint-dir")) o.checkpointDir = r["checkpoint-dir"].as<std::string>();
  if (o.offload && o.zero < 2) usageError("--offload needs --zero 2 or 3");
  o.saveEvery = number<int64_t>(r, "save-every", 0, 1e9);
  o.dataDir = r["data-dir"].as<std::string>();
  o.synthetic = number<int64_t>(r, "synthetic", 0, 1e7);
  o.seed = number<uint64_t>(r, "seed", 0, 1e15);
  o.evalEvery = number<int64_t>(r, "eval-every", 0, 1e9);
  o.logEvery = number<int64_t>(r, "log-every", 1, 1e9);
  o.job = examples::readJobFlags(r);
  return o;
}

// ---------------------------------------------------------------------------------------------
// 2. Join the job. Rank, world size and the store come from `launch`'s environment; the backend
//    is NCCL on GPUs (cuda:LOCAL_RANK) and Gloo on the CPU, unless --device says which
//    (examples::joinJob in examples/training/job.h, called in main).
// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// 3. Data. Every rank reads the whole set (CIFAR-10 is small); the DistributedSampler gives each
//    rank its own shard of every epoch, and a BatchLoader thread (in the training loop, step 8)
//    turns the shard into augmented, normalised batches ahead of the training loop.
// ---------------------------------------------------------------------------------------------
struct Data {
  examples::CifarSplit train, test;
  dtrain::DistributedSampler sampler;
  int64_t samplesPerStep;  // per rank: --batch-size x --accum-steps
  int64_t stepsPerEpoch;   // whole optimizer steps
  int64_t totalSteps;
};

Data loadData(const Options& opt, dtrain::ProcessGroup& group) {
  if (opt.synthetic > 0) {
    // One writer per node (each node may have its own disk); the set is deterministic.
    if (group.localRank() == 0) {
      examples::writeSyntheticCifar10(opt.dataDir, opt.synthetic,
                                      std::max<int64_t>(10, opt.synthetic / 5), opt.seed);
    }
    group.barrier();
  }
  examples::CifarSplit train = examples::readCifar10(opt.dataDir, /*train=*/true);
  examples::CifarSplit test = examples::readCifar10(opt.dataDir, /*train=*/false);
  dtrain::SamplerOptions samplerOptions;
  samplerOptions.seed = opt.seed;
  dtrain::DistributedSampler sampler(static_cast<size_t>(train.size()), group.size(), group.rank(),
                                     samplerOptions);

  // Whole optimizer steps per epoch: the sampler gives every rank the same number of samples.
  const int64_t samplesPerStep = opt.batchSize * opt.accumSteps;
  const int64_t stepsPerEpoch = static_cast<int64_t>(sampler.size()) / samplesPerStep;
  if (stepsPerEpoch == 0) {
    DTRAIN_THROW(dtrain::InvalidArgument,
                 "{} training images give each of {} ranks {} samples, less than one step of {} "
                 "(--batch-size x --accum-steps). HINT: a smaller batch or more data",
                 train.size(), group.size(), sampler.size(), samplesPerStep);
  }
  return Data{std::move(train), std::move(test), std::move(sampler),
              samplesPerStep,   stepsPerEpoch,   opt.epochs * stepsPerEpoch};
}

// ---------------------------------------------------------------------------------------------
// 4. Model. Every rank builds the same architecture; in main, DDP's constructor then copies rank
//    0's parameters and buffers to all, and from then on averages gradients during backward.
//    With --zero 3 each residual block is sharded the moment it is built (dtrain::fullyShard):
//    no rank ever holds the blocks whole, which is how a model larger than one rank's memory is
//    built. That needs the same values on every rank -- the same seed, set here -- and DDP does
//    not copy rank 0's values of those blocks (no rank has them); the stage-3 optimizer checks
//    that every rank built the same.
// ---------------------------------------------------------------------------------------------
examples::ResNet buildModel(const Options& opt, const dtrain::ProcessGroup& group) {
  const torch::Device device = group.device();
  torch::manual_seed(opt.seed);
  examples::ResNetOptions modelOptions;
  modelOptions.arch = opt.arch;
  modelOptions.numClasses = examples::kCifarClasses;
  modelOptions.cifarStem = !opt.imagenetStem;
  modelOptions.width = opt.width;
  // Activation recompute: less memory for about one more forward per step; same results.
  modelOptions.recompute = opt.recompute;
  modelOptions.shardBlocks = opt.zero == 3;  // ZeRO-3: each block a unit (step 5) ...
  if (opt.zero == 3) modelOptions.shardAsBuilt = dtrain::ShardPlacement(group);  // ... as built
  examples::ResNet model = examples::makeResNet(modelOptions);
  model->to(device);
  return model;
}

// ---------------------------------------------------------------------------------------------
// 5. Optimizer, schedule and loss scaling. The peak learning rate scales with the global batch
//    (the "linear scaling rule"), so changing the number of ranks keeps the recipe. With --amp
//    on CUDA the forward runs in float16, whose gradients can underflow: the GradScaler
//    multiplies the loss before backward and divides the gradients again, skipping a step (on
//    every rank alike) when any rank saw an inf or NaN. bfloat16 (the CPU) has float32's range
//    and needs no scaling: the scaler is then disabled and changes nothing. With --zero 1 or 2
//    the optimizer is a ShardedOptimizer: each rank keeps the momentum (and, at 2, the averaged
//    gradients) of its 1/N of the parameters, steps a real SGD over that part and all-gathers
//    the parameters; to the rest of the program it is an optimizer like any other. With --zero 3
//    it also frees every residual block's parameters but the rank's 1/N: each block gathers them
//    when it runs, in forward and again in backward (the model's shardBlocks, step 4).
// ---------------------------------------------------------------------------------------------
std::unique_ptr<torch::optim::Optimizer> makeOptimizer(
    const Options& opt, dtrain::DistributedDataParallel<examples::ResNet>& ddp, double peakLr) {
  const auto sgd =
      torch::optim::SGDOptions(peakLr).momentum(opt.momentum).weight_decay(opt.weightDecay);
  if (opt.zero == 0) return std::make_unique<torch::optim::SGD>(ddp.parameters(), sgd);
  dtrain::ZeroOptions zero;
  zero.stage = opt.zero;
  // --offload: on CUDA the momentum (and master weights) in host memory and SGD's step on the
  // CPU; on the CPU they are on the host already and nothing changes.
  zero.offload = opt.offload;
  return std::make_unique<dtrain::ShardedOptimizer>(
      ddp, dtrain::optimizerFactory<torch::optim::SGD>(sgd), zero);
}

// ---------------------------------------------------------------------------------------------
// 6. The training state, checkpoints and resume. Everything the job's state is made of is
//    registered once, in a TrainingState: the model, the optimizer (momentum), the scaler, and
//    the sampler (how far every rank got in the data; the learning rate follows from the step).
//    The training loop tells it where each step begins (beginStep). A Checkpointer built from
//    it saves and restores that state: when `launch --max-restarts` restarts the job after a
//    failure, or the command is simply run again, restore() finds the newest checkpoint every
//    rank can load and the loop continues from there; on a fresh start it finds none. A SIGTERM
//    (a spot instance's notice) makes every rank save at the same step and exit 75, which launch
//    passes on: run the same command again to resume.
// ---------------------------------------------------------------------------------------------
std::shared_ptr<dtrain::TrainingState> makeState(std::shared_ptr<dtrain::ProcessGroup> group,
                                                 examples::ResNet& model,
                                                 torch::optim::Optimizer& optimizer,
                                                 dtrain::GradScaler& scaler,
                                                 dtrain::DistributedSampler& sampler) {
  auto state = std::make_shared<dtrain::TrainingState>(std::move(group));
  state->addModule("model", model);
  state->addOptimizer("optimizer", optimizer);
  state->addScaler("scaler", scaler);
  state->addSampler("sampler", sampler);
  return state;
}

// ---------------------------------------------------------------------------------------------
// 7. Metrics. Every rank records its own figures each step: its batch's loss and accuracy, the
//    job's samples/s as it measured them, its share of the step spent waiting for gradient
//    allreduces, the loss scale, the checkpoints' durations. Under `launch` they reach launch
//    through the job's store by themselves, so `launch --metrics-port` shows every rank's
//    figures beside launch's own samples (memory, CPU, GPUs) and `launch --metrics-file` holds
//    them all: the trainer needs no port of its own. Rank 0 can also write its own JSONL file,
//    TensorBoard events and serve its own Prometheus endpoint (without launch, say:
//    examples::addOwnSinks, examples/training/job.h). The progress lines average over all ranks.
// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// 8. The training loop: epochs of optimizer steps of micro-batches, with progress lines,
//    evaluation and checkpoints between steps. Training holds what steps 2-7 built and what the
//    loop keeps track of: run() is the loop over epochs and steps, trainStep() one optimizer
//    step, forwardBackward() one micro-batch. The progress lines and the evaluation on the test
//    set are helpers in examples/training.
// ---------------------------------------------------------------------------------------------
struct Training {
  const Options& opt;
  dtrain::ProcessGroup& group;
  Data& data;
  examples::ResNet& model;
  dtrain::DistributedDataParallel<examples::ResNet>& ddp;
  torch::optim::Optimizer& optimizer;
  double peakLr;
  dtrain::GradScaler& scaler;
  dtrain::TrainingState& state;
  dtrain::Checkpointer* checkpointer;  // null without --checkpoint-dir
  dtrain::metrics::Metrics& metrics;
  int64_t firstStep;  // the checkpoint's step, or 0

  int64_t step = firstStep;  // optimizer steps done
  int64_t savedAt = firstStep, evaluatedAt = -1, bestStep = 0;
  double testAccuracy = -1, bestAccuracy = -1;
  double lastLoss = NAN, lastAccuracy = NAN;
  examples::Progress progress{group, opt.epochs, data.totalSteps};
  Clock::time_point started = Clock::now();

  struct StepFigures {
    torch::Tensor loss = torch::zeros({}, torch::kDouble);  // summed over the micro-batches
    torch::Tensor correct = torch::zeros({}, torch::kLong);
  };

  // Trains up to the last step. False when the job was preempted: every rank saved this step.
  bool run() {
    bool midEpoch = step > 0;  // the sampler continues the epoch it was saved in
    for (int64_t epoch = data.sampler.epoch(); step < data.totalSteps; ++epoch) {
      if (!midEpoch) data.sampler.setEpoch(epoch);  // a new order each epoch, the same everywhere
      midEpoch = false;
      examples::LoaderOptions loaderOptions;
      loaderOptions.batchSize = opt.batchSize;
      loaderOptions.dropLast = true;
      loaderOptions.seed = opt.seed;
      loaderOptions.epoch = epoch;
      examples::BatchLoader loader(data.train, data.sampler.indices(), loaderOptions);
      // Whole steps left in this epoch (all of them, unless it was resumed part-way).
      const int64_t steps = static_cast<int64_t>(data.sampler.size()) / data.samplesPerStep;

      for (int64_t inEpoch = 0; inEpoch < steps && step < data.totalSteps; ++inEpoch) {
        state.beginStep(step);  // where the step begins (DTRAIN_FAULT: tests kill or stop a rank)
        const auto stepStart = Clock::now();
        const StepFigures figures = trainStep(loader);
        record(epoch, figures, std::chrono::duration<double>(Clock::now() - stepStart).count());
        if (opt.evalEvery > 0 && step % opt.evalEvery == 0) evaluateNow();
        if (checkpointer) {
          if (opt.saveEvery > 0 && step % opt.saveEvery == 0) save(epoch);
          // SIGTERM on any rank: every rank has saved this step, and stops.
          if (checkpointer->preempted(step, epoch)) {
            progress.line(fmt::format("preempted: saved step {}; run again to resume", step));
            return false;
          }
        }
      }
      if (steps == 0) continue;  // resumed at the very end of an epoch
      if (opt.evalEvery == 0) evaluateNow();
      if (checkpointer && opt.saveEvery == 0) save(epoch);
    }
    return true;
  }

  // One optimizer step of --accum-steps micro-batches.
  StepFigures trainStep(examples::BatchLoader& loader) {
    setLearningRate(optimizer, learningRate(peakLr, step, opt.warmupSteps, data.totalSteps));
    optimizer.zero_grad();
    // Gradient accumulation: the first accumSteps - 1 micro-batches only accumulate into .grad
    // (noSync: no communication); the last one's backward averages the sum across ranks. Each
    // micro-batch's loss is divided by accumSteps, so the step sees the mean.
    StepFigures figures;
    for (int64_t micro = 0; micro < opt.accumSteps; ++micro) {
      const examples::Batch batch = nextBatch(loader, micro);
      torch::Tensor images = batch.images.to(device()), labels = batch.labels.to(device());
      if (micro + 1 < opt.accumSteps) {
        auto noSync = ddp.noSync();
        forwardBackward(images, labels, figures);
      } else {
        forwardBackward(images, labels, figures);
      }
    }
    scaler.step(optimizer);  // optimizer.step(), unless a rank's gradients overflowed
    scaler.update();
    ++step;
    return figures;
  }

  // The loader works ahead on a copy of the sampler's indices; the sampler itself follows what
  // training consumed, so that a checkpoint records exactly where the job is.
  examples::Batch nextBatch(examples::BatchLoader& loader, int64_t micro) {
    auto batch = loader.next();
    DTRAIN_CHECK(batch, "the loader ended early, at micro-batch {} of step {}", micro, step);
    const std::vector<size_t> consumed = data.sampler.next(batch->indices.size(0)).value();
    DTRAIN_CHECK(std::equal(consumed.begin(), consumed.end(), batch->indices.data_ptr<int64_t>(),
                            [](size_t a, int64_t b) { return a == static_cast<size_t>(b); }),
                 "the loader's batch at step {} is not the sampler's", step);
    return std::move(*batch);
  }

  // Mixed precision: the forward and the loss under autocast (bfloat16 on the CPU, float16 on
  // CUDA); backward outside it, as in PyTorch.
  void forwardBackward(const torch::Tensor& images, const torch::Tensor& labels,
                       StepFigures& figures) {
    torch::Tensor logits, loss;
    {
      dtrain::AutocastGuard autocast(device(), opt.amp);
      logits = ddp(images);
      loss = torch::nn::functional::cross_entropy(logits, labels);
    }
    scaler.scale(loss / static_cast<double>(opt.accumSteps)).backward();
    figures.loss += loss.detach().to(torch::kCPU, torch::kDouble);
    figures.correct += (logits.argmax(1) == labels).sum().cpu();
  }

  // This step's figures, and the progress line at the end of an interval.
  void record(int64_t epoch, const StepFigures& figures, double seconds) {
    const auto samplesPerStep = static_cast<double>(data.samplesPerStep);
    lastLoss = figures.loss.item<double>() / static_cast<double>(opt.accumSteps);
    lastAccuracy = figures.correct.item<double>() / samplesPerStep;
    progress.add(lastLoss, figures.correct.item<double>(), samplesPerStep);
    const double waited = std::chrono::duration<double>(ddp.lastIteration().waited).count();
    metrics.record(step, {{"loss", lastLoss},
                          {"accuracy", lastAccuracy},
                          {"samples_per_s", samplesPerStep * group.size() / seconds},
                          {"lr", learningRate(peakLr, step - 1, opt.warmupSteps, data.totalSteps)},
                          {"allreduce_wait_share", waited / seconds},
                          {"loss_scale", scaler.isEnabled() ? scaler.getScale() : 1.0},
                          {"epoch", static_cast<double>(epoch)}});
    examples::recordCheckpointWrites(checkpointer, metrics);
    if (step % opt.logEvery == 0 || step == data.totalSteps) {
      progress.report(epoch, step,
                      scaler.isEnabled() ? fmt::format("  scale {:g}", scaler.getScale()) : "");
    }
  }

  void evaluateNow() {
    ddp.syncBuffers();  // every rank evaluates rank 0's BatchNorm statistics
    testAccuracy = examples::evaluate(model, data.test, group, device(), opt.batchSize);
    evaluatedAt = step;
    if (testAccuracy > bestAccuracy) bestAccuracy = testAccuracy, bestStep = step;
    metrics.record(step, {{"test_accuracy", testAccuracy}});
    progress.line(fmt::format("eval step {}: test accuracy {:.2f}%", step, 100 * testAccuracy));
  }

  void save(int64_t epoch) {
    savedAt = step;
    const auto begin = Clock::now();
    checkpointer->saveAsync(step, epoch);  // a snapshot now; written while training goes on
    metrics.record(step, {{"checkpoint_seconds",
                           std::chrono::duration<double>(Clock::now() - begin).count()}});
  }

  // 9. Summary. Every rank ends with the same parameters (DDP); rank 0 reports.
  void finish() {
    if (evaluatedAt != step) evaluateNow();
    if (checkpointer) {
      if (savedAt != step) save(data.sampler.epoch());
      checkpointer->wait();  // the last asynchronous save is on disk everywhere
      examples::recordCheckpointWrites(checkpointer, metrics);
    }
    metrics.flush();  // the last records reach the file, the endpoint and launch now
    // Each rank prints a fingerprint of its parameters and buffers: equal lines show that DDP
    // kept the ranks bitwise in step (evaluation synchronised the BatchNorm statistics).
    std::printf("fingerprint of rank %d's model: %016llx\n", group.rank(),
                static_cast<unsigned long long>(examples::trainedFingerprint(*model, optimizer)));
    const double total = std::chrono::duration<double>(Clock::now() - started).count();
    if (step == firstStep) {
      progress.line(fmt::format("done: all {} steps were trained before; test accuracy {:.2f}%",
                                step, 100 * testAccuracy));
    } else {
      progress.line(fmt::format(
          "done: {} steps in {} ({:.0f} samples/s); last step loss {:.4f}, accuracy {:.1f}%; "
          "test accuracy {:.2f}% (best {:.2f}% at step {})",
          step, examples::formatDuration(total),
          static_cast<double>((step - firstStep) * data.samplesPerStep * group.size()) / total,
          lastLoss, 100 * lastAccuracy, 100 * testAccuracy, 100 * bestAccuracy, bestStep));
    }
    if (!opt.job.metricsFile.empty()) progress.line("metrics: " + opt.job.metricsFile);
    if (!opt.job.tensorboardDir.empty()) progress.line("tensorboard: " + opt.job.tensorboardDir);
    if (checkpointer) progress.line("checkpoints: " + checkpointer->nodeDirectory());
  }

  torch::Device device() const { return group.device(); }
};

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parseOptions(argc, argv);  // 1.
  try {
    if (opt.job.threads > 0) torch::set_num_threads(static_cast<int>(opt.job.threads));
    dtrain::enableHostMemoryCache();  // freed CPU tensor blocks reused (docs/training.md)

    // 2. Join the job.
    std::shared_ptr<dtrain::ProcessGroup> group = examples::joinJob(opt.job.device);
    const bool leader = group->rank() == 0;
    const torch::Device device = group->device();

    // 3. Data: the training and test sets, and this rank's sampler.
    Data data = loadData(opt, *group);

    // 4. Model and DDP.
    examples::ResNet model = buildModel(opt, *group);
    dtrain::DistributedDataParallel<examples::ResNet> ddp(model, group);

    // 5. Optimizer, schedule and loss scaling.
    const double peakLr = opt.lr * static_cast<double>(data.samplesPerStep * group->size()) / 256;
    std::unique_ptr<torch::optim::Optimizer> optimizer = makeOptimizer(opt, ddp, peakLr);
    dtrain::GradScalerOptions scalerOptions;
    scalerOptions.enabled = opt.amp && device.is_cuda();
    dtrain::GradScaler scaler(group, scalerOptions);

    // 6. The training state, checkpoints and resume.
    std::shared_ptr<dtrain::TrainingState> state = makeState(group, model, *optimizer, scaler,
                                                             data.sampler);
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
    if (firstStep > 0) metrics.record(firstStep, {{"resumed", 1}});  // plot_metrics.py marks it

    // 8. Train.
    if (leader) {
      std::printf(
          "train_resnet: %s (%.2fM parameters), %d ranks x %lld samples per step on %s%s%s, "
          "%lld steps (%lld per epoch), peak lr %.4g\n",
          opt.arch.c_str(), examples::parameterCount(*model) / 1e6, group->size(),
          static_cast<long long>(data.samplesPerStep), device.str().c_str(),
          opt.amp ? (device.is_cuda() ? " (amp: float16)" : " (amp: bfloat16)") : "",
          opt.zero > 0 ? fmt::format(" (ZeRO-{})", opt.zero).c_str() : "",
          static_cast<long long>(data.totalSteps), static_cast<long long>(data.stepsPerEpoch),
          peakLr);
      std::fflush(stdout);
    }
    Training training{opt,        *group,   data,   model,  ddp,
                      *optimizer, peakLr,   scaler, *state, checkpointer.get(),
                      metrics,    firstStep};
    if (!training.run()) {
      group->shutdown();
      return dtrain::kExitPreempted;
    }

    // 9. Summary.
    training.finish();
    group->shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_resnet: %s\n", e.what());
    return 1;
  }
}
