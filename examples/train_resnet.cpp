// train_resnet: ResNet-18/34/50/101 on CIFAR-10 with dtrain, the way a real training job runs:
// data-parallel over every rank (DDP), a background data loader, a warm-up + cosine learning-rate
// schedule, gradient accumulation, mixed precision, checkpoints with automatic resume,
// evaluation, progress lines and metrics.
//
//   launch --nproc-per-node 2 --max-restarts 3 ./train_resnet --arch resnet18 --data-dir cifar
//          --synthetic 10000 --epochs 5 --checkpoint-dir ckpt --metrics-file metrics.jsonl
//
// Read it top to bottom:
//   1. options            6. checkpoints and resume
//   2. join the job       7. metrics
//   3. data               8. the training loop (accumulation, mixed precision, progress,
//   4. model and DDP         evaluation, checkpoints)
//   5. optimizer, learning-rate schedule, loss scaling   9. summary
// Helpers live beside it: the models in examples/models, the CIFAR-10 reader and the loader
// thread in examples/data.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include <cxxopts.hpp>
#include <torch/torch.h>

#include <dtrain/dtrain.h>
#include <dtrain/base/fault.h>
#include <dtrain/base/metrics.h>

#include "data/cifar10.h"
#include "data/loader.h"
#include "models/resnet.h"

namespace {

using Clock = std::chrono::steady_clock;

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
  double lr = 0.2;          // for 256 samples per step; scaled linearly with the global batch
  double momentum = 0.9;
  double weightDecay = 5e-4;
  int64_t warmupSteps = 100;
  std::string checkpointDir;  // empty: no checkpoints
  int64_t saveEvery = 0;      // steps; 0: at the end of every epoch
  std::string dataDir = "cifar10";
  int64_t synthetic = 0;  // > 0: write a synthetic set of this many training images first
  std::string device = "auto";
  uint64_t seed = 0;
  int64_t evalEvery = 0;  // steps; 0: at the end of every epoch
  int64_t logEvery = 20;  // steps per progress line
  int64_t threads = 0;    // intra-op threads per rank; 0: OMP_NUM_THREADS (launch sets it)
  std::string metricsFile;
  int metricsPort = -1;  // -1: no endpoint; 0: a free port
};

[[noreturn]] void usageError(const std::string& message) {
  std::fprintf(stderr, "train_resnet: %s (see --help)\n", message.c_str());
  std::exit(2);
}

// Reads flag `name` as a number in [min, max]; a bad value is a usage error naming the flag.
template <typename T>
T number(const cxxopts::ParseResult& r, const std::string& name, double min, double max) {
  const std::string text = r[name].as<std::string>();
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  const bool integral = std::is_integral_v<T>;
  if (text.empty() || *end != '\0' || errno != 0 || value < min || value > max ||
      (integral && value != std::floor(value))) {
    usageError("--" + name + " must be " + (integral ? "an integer" : "a number") + " in [" +
               fmt::format("{}", min) + ", " + fmt::format("{}", max) + "], got '" + text + "'");
  }
  return static_cast<T>(value);
}

Options parseOptions(int argc, char** argv) {
  Options o;
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
      ("lr", "peak learning rate per 256 samples a step (scaled to the batch)", str(o.lr))
      ("momentum", "SGD momentum", str(o.momentum))
      ("weight-decay", "SGD weight decay", str(o.weightDecay))
      ("warmup-steps", "linear warm-up steps before the cosine decay", str(o.warmupSteps))
      ("checkpoint-dir", "checkpoints here; resume from the newest (default: none)", none())
      ("save-every", "checkpoint every N steps (0: after every epoch)", str(o.saveEvery))
      ("data-dir", "CIFAR-10 binary files (data_batch_1..5.bin, test_batch.bin)", str(o.dataDir))
      ("synthetic", "first write N synthetic training images (N/5 test) there", str(o.synthetic))
      ("device", "auto | cpu | cuda", str(o.device))
      ("seed", "model, sampler and augmentation seed", str(o.seed))
      ("eval-every", "test accuracy every N steps (0: after every epoch)", str(o.evalEvery))
      ("log-every", "steps per progress line", str(o.logEvery))
      ("threads", "threads per rank (0: OMP_NUM_THREADS, set by launch)", str(o.threads))
      ("metrics-file", "a JSON record per step, appended (rank 0; default: none)", none())
      ("metrics-port", "Prometheus endpoint (rank 0; 0: a free port; default: none)", none())
      ("h,help", "print this help");
  // clang-format on
  cxxopts::ParseResult r;
  try {
    r = spec.parse(argc, argv);
  } catch (const cxxopts::exceptions::exception& e) {
    usageError(e.what());
  }
  if (r.count("help")) {
    std::fputs(spec.help().c_str(), stdout);
    std::exit(0);
  }
  if (!r.unmatched().empty()) usageError("unexpected argument '" + r.unmatched()[0] + "'");
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
  o.lr = number<double>(r, "lr", 0, 1e3);
  o.momentum = number<double>(r, "momentum", 0, 1);
  o.weightDecay = number<double>(r, "weight-decay", 0, 1);
  o.warmupSteps = number<int64_t>(r, "warmup-steps", 0, 1e9);
  if (r.count("checkpoint-dir")) o.checkpointDir = r["checkpoint-dir"].as<std::string>();
  o.saveEvery = number<int64_t>(r, "save-every", 0, 1e9);
  o.dataDir = r["data-dir"].as<std::string>();
  o.synthetic = number<int64_t>(r, "synthetic", 0, 1e7);
  o.device = r["device"].as<std::string>();
  if (o.device != "auto" && o.device != "cpu" && o.device != "cuda") {
    usageError("--device must be auto, cpu or cuda, got '" + o.device + "'");
  }
  o.seed = number<uint64_t>(r, "seed", 0, 1e15);
  o.evalEvery = number<int64_t>(r, "eval-every", 0, 1e9);
  o.logEvery = number<int64_t>(r, "log-every", 1, 1e9);
  o.threads = number<int64_t>(r, "threads", 0, 1024);
  if (r.count("metrics-file")) o.metricsFile = r["metrics-file"].as<std::string>();
  if (r.count("metrics-port")) o.metricsPort = number<int>(r, "metrics-port", 0, 65535);
  return o;
}

// Warm-up + cosine: linear from ~0 to the peak over `warmup` steps, then half a cosine to 0.
double learningRate(double peak, int64_t step, int64_t warmup, int64_t total) {
  if (step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const double progress = static_cast<double>(step - warmup) /
                          static_cast<double>(std::max<int64_t>(1, total - warmup));
  return 0.5 * peak * (1.0 + std::cos(M_PI * std::min(1.0, progress)));
}

std::string duration(double seconds) {
  const auto s = static_cast<int64_t>(std::max(0.0, seconds) + 0.5);
  return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
}

// Progress lines on rank 0: the mean loss and accuracy over an interval of steps and over every
// rank, the job's samples/s, the time left. Under `launch` stdout is a pipe that launch prefixes
// line by line, so each report is a whole line; run directly on a terminal, the line is redrawn
// in place.
class Progress {
 public:
  Progress(dtrain::ProcessGroup& group, int64_t epochs, int64_t totalSteps)
      : group_(group),
        epochs_(epochs),
        totalSteps_(totalSteps),
        terminal_(group.rank() == 0 && isatty(STDOUT_FILENO)) {}

  // One step of this rank: its loss (mean over its samples), correct predictions, samples.
  void add(double loss, double correct, double samples) {
    sums_[0] += loss * samples;
    sums_[1] += correct;
    sums_[2] += samples;
    ++steps_;
  }

  // Collective (one small allreduce): every rank calls it at the same steps.
  void report(int64_t epoch, int64_t step, const std::string& extra) {
    group_.allreduce(sums_);  // sums over every rank
    const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    const double samples = sums_[2].item<double>();
    const double eta =
        elapsed / static_cast<double>(steps_) * static_cast<double>(totalSteps_ - step);
    line(fmt::format(
             "epoch {}/{}  step {}/{}  loss {:.4f}  acc {:5.1f}%  {:.0f} samples/s  eta {}{}",
             epoch + 1, epochs_, step, totalSteps_, sums_[0].item<double>() / samples,
             100 * sums_[1].item<double>() / samples, samples / elapsed, duration(eta), extra),
         /*redraw=*/true);
    sums_.zero_();
    steps_ = 0;
    start_ = Clock::now();
  }

  // Any other line from rank 0 (evaluation, summary): ends a line being redrawn first.
  void line(const std::string& text, bool redraw = false) {
    if (group_.rank() != 0) return;
    if (terminal_ && redraw) {
      std::printf("\r%s", text.c_str());
      open_ = true;
    } else {
      std::printf("%s%s\n", open_ ? "\n" : "", text.c_str());
      open_ = false;
    }
    std::fflush(stdout);
  }

 private:
  dtrain::ProcessGroup& group_;
  int64_t epochs_, totalSteps_;
  bool terminal_;
  bool open_ = false;  // a redrawn line without its newline yet
  torch::Tensor sums_ = torch::zeros({3}, torch::kDouble);  // loss x samples, correct, samples
  int64_t steps_ = 0;
  Clock::time_point start_ = Clock::now();
};

// Test accuracy over the whole test set: each rank evaluates every world-th image (no padding,
// so no image counts twice), then the counts are summed across ranks.
double evaluate(examples::ResNet& model, const examples::CifarSplit& test,
                dtrain::ProcessGroup& group, const torch::Device& device, int64_t batchSize) {
  torch::NoGradGuard noGrad;
  model->eval();
  std::vector<size_t> mine;
  for (int64_t i = group.rank(); i < test.size(); i += group.size())
    mine.push_back(static_cast<size_t>(i));
  examples::LoaderOptions options;
  options.batchSize = batchSize;
  options.augment = false;
  examples::BatchLoader loader(test, std::move(mine), options);
  torch::Tensor counts = torch::zeros({2}, torch::kDouble);  // correct, seen
  while (auto batch = loader.next()) {
    torch::Tensor predicted = model->forward(batch->images.to(device)).argmax(1).cpu();
    counts[0] += (predicted == batch->labels).sum().item<int64_t>();
    counts[1] += batch->labels.size(0);
  }
  model->train();
  if (device.is_cuda()) counts = counts.to(device);
  group.allreduce(counts);
  counts = counts.cpu();
  return counts[0].item<double>() / std::max(1.0, counts[1].item<double>());
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parseOptions(argc, argv);
  try {
    if (opt.threads > 0) torch::set_num_threads(static_cast<int>(opt.threads));

    // -------------------------------------------------------------------------------------------
    // 2. Join the job. Rank, world size and the store come from `launch`'s environment; the
    //    backend is NCCL on GPUs (cuda:LOCAL_RANK) and Gloo on the CPU.
    // -------------------------------------------------------------------------------------------
    dtrain::InitOptions init;
    if (opt.device == "cpu") init.backend = "gloo";
    if (opt.device == "cuda") init.backend = "nccl";
    auto group = dtrain::init(init);
    const int rank = group->rank(), world = group->size();
    const bool leader = rank == 0;
    const torch::Device device = group->device();

    // -------------------------------------------------------------------------------------------
    // 3. Data. Every rank reads the whole set (CIFAR-10 is small); the DistributedSampler gives
    //    each rank its own shard of every epoch, and a BatchLoader thread turns the shard into
    //    augmented, normalised batches ahead of the training loop.
    // -------------------------------------------------------------------------------------------
    if (opt.synthetic > 0) {
      // One writer per node (each node may have its own disk); the set is deterministic.
      if (group->localRank() == 0) {
        examples::writeSyntheticCifar10(opt.dataDir, opt.synthetic,
                                        std::max<int64_t>(10, opt.synthetic / 5), opt.seed);
      }
      group->barrier();
    }
    const examples::CifarSplit train = examples::readCifar10(opt.dataDir, /*train=*/true);
    const examples::CifarSplit test = examples::readCifar10(opt.dataDir, /*train=*/false);
    dtrain::SamplerOptions samplerOptions;
    samplerOptions.seed = opt.seed;
    dtrain::DistributedSampler sampler(static_cast<size_t>(train.size()), world, rank,
                                       samplerOptions);

    // Whole optimizer steps per epoch: the sampler gives every rank the same number of samples.
    const int64_t samplesPerStep = opt.batchSize * opt.accumSteps;  // per rank
    const int64_t stepsPerEpoch = static_cast<int64_t>(sampler.size()) / samplesPerStep;
    if (stepsPerEpoch == 0) {
      DTRAIN_THROW(dtrain::InvalidArgument,
                   "{} training images give each of {} ranks {} samples, less than one step of {} "
                   "(--batch-size x --accum-steps). HINT: a smaller batch or more data",
                   train.size(), world, sampler.size(), samplesPerStep);
    }
    const int64_t totalSteps = opt.epochs * stepsPerEpoch;

    // -------------------------------------------------------------------------------------------
    // 4. Model and DDP. Every rank builds the same architecture; DDP's constructor copies rank
    //    0's parameters and buffers to all, and from then on averages gradients during backward.
    // -------------------------------------------------------------------------------------------
    torch::manual_seed(opt.seed);
    examples::ResNetOptions modelOptions;
    modelOptions.arch = opt.arch;
    modelOptions.numClasses = examples::kCifarClasses;
    modelOptions.cifarStem = !opt.imagenetStem;
    modelOptions.width = opt.width;
    examples::ResNet model = examples::makeResNet(modelOptions);
    model->to(device);
    dtrain::DistributedDataParallel<examples::ResNet> ddp(model, group);

    // -------------------------------------------------------------------------------------------
    // 5. Optimizer, schedule and loss scaling. The peak learning rate scales with the global
    //    batch (the "linear scaling rule"), so changing the number of ranks keeps the recipe.
    //    With --amp on CUDA the forward runs in float16, whose gradients can underflow: the
    //    GradScaler multiplies the loss before backward and divides the gradients again, skipping
    //    a step (on every rank alike) when any rank saw an inf or NaN. bfloat16 (the CPU) has
    //    float32's range and needs no scaling: the scaler is then disabled and changes nothing.
    // -------------------------------------------------------------------------------------------
    const double peakLr = opt.lr * static_cast<double>(samplesPerStep * world) / 256.0;
    torch::optim::SGD optimizer(
        ddp.parameters(),
        torch::optim::SGDOptions(peakLr).momentum(opt.momentum).weight_decay(opt.weightDecay));
    auto setLr = [&](double lr) {
      for (auto& g : optimizer.param_groups())
        static_cast<torch::optim::SGDOptions&>(g.options()).lr(lr);
    };
    dtrain::GradScalerOptions scalerOptions;
    scalerOptions.enabled = opt.amp && device.is_cuda();
    dtrain::GradScaler scaler(group, scalerOptions);

    // -------------------------------------------------------------------------------------------
    // 6. Checkpoints and resume. Everything the job's state is made of goes in: the model, the
    //    optimizer (momentum), the scaler, and the sampler (how far every rank got in the data;
    //    the learning rate follows from the step). When `launch --max-restarts` restarts the job
    //    after a failure, or the command is simply run again, restore() finds the newest
    //    checkpoint every rank can load and the loop below continues from there; on a fresh start
    //    it finds none. A SIGTERM (a spot instance's notice) makes every rank save at the same
    //    step and exit 75, which launch passes on: run the same command again to resume.
    // -------------------------------------------------------------------------------------------
    int64_t step = 0;  // optimizer steps done
    std::unique_ptr<dtrain::Checkpointer> checkpointer;
    if (!opt.checkpointDir.empty()) {
      checkpointer = std::make_unique<dtrain::Checkpointer>(
          group, dtrain::CheckpointOptions(opt.checkpointDir));
      checkpointer->addModule("model", model);
      checkpointer->addOptimizer("optimizer", optimizer);
      checkpointer->addScaler("scaler", scaler);
      checkpointer->addSampler("sampler", sampler);
      if (auto restored = checkpointer->restore()) {
        step = restored->step;
        if (leader) {
          std::printf("resumed from the checkpoint of step %lld (%s)\n",
                      static_cast<long long>(step), restored->path.c_str());
        }
      }
    }
    const int64_t firstStep = step;
    bool midEpoch = step > 0;  // the sampler continues the epoch it was saved in

    // -------------------------------------------------------------------------------------------
    // 7. Metrics. Every rank records its own figures each step: its batch's loss and accuracy,
    //    the job's samples/s as it measured them, its share of the step spent waiting for
    //    gradient allreduces, the loss scale, the checkpoints' durations. Under `launch` they
    //    reach launch through the job's store by themselves, so `launch --metrics-port` shows
    //    every rank's figures beside launch's own samples (memory, CPU, GPUs) and
    //    `launch --metrics-file` holds them all: the trainer needs no port of its own. Rank 0
    //    can also write its own JSONL file and serve its own Prometheus endpoint (without launch,
    //    say). The progress lines average over all ranks.
    // -------------------------------------------------------------------------------------------
    dtrain::metrics::Metrics metrics;
    if (leader && !opt.metricsFile.empty())
      metrics.addSink(dtrain::metrics::JsonlSink::open(opt.metricsFile));
    if (leader && opt.metricsPort >= 0) {
      auto endpoint = dtrain::metrics::PrometheusEndpoint::start(
          {"0.0.0.0", static_cast<uint16_t>(opt.metricsPort)});
      std::printf("metrics: http://%s:%u/metrics\n", metrics.node().c_str(), endpoint->port());
      metrics.addSink(endpoint);
    }
    if (step > 0) metrics.record(step, {{"resumed", 1}});  // plot_metrics.py marks it
    // A checkpoint's background write ends while training goes on: its duration and size are
    // recorded (under the step it saved) once it has, on each node's writer rank.
    auto recordCheckpointWrites = [&] {
      if (!checkpointer) return;
      for (const auto& write : checkpointer->finishedWrites()) {
        metrics.record(write.step, {{"checkpoint_write_seconds", write.seconds},
                                    {"checkpoint_bytes", static_cast<double>(write.bytes)}});
      }
    };

    // -------------------------------------------------------------------------------------------
    // 8. Train.
    // -------------------------------------------------------------------------------------------
    if (leader) {
      std::printf(
          "train_resnet: %s (%.2fM parameters), %d ranks x %lld samples per step on %s%s, "
          "%lld steps (%lld per epoch), peak lr %.4g\n",
          opt.arch.c_str(), examples::parameterCount(*model) / 1e6, world,
          static_cast<long long>(samplesPerStep), device.str().c_str(),
          opt.amp ? (device.is_cuda() ? " (amp: float16)" : " (amp: bfloat16)") : "",
          static_cast<long long>(totalSteps), static_cast<long long>(stepsPerEpoch), peakLr);
      std::fflush(stdout);
    }
    Progress progress(*group, opt.epochs, totalSteps);
    const auto started = Clock::now();
    double testAccuracy = -1, bestAccuracy = -1;
    int64_t bestStep = 0, evaluatedAt = -1;
    double lastLoss = NAN, lastAccuracy = NAN;

    auto runEval = [&] {
      ddp.syncBuffers();  // every rank evaluates rank 0's BatchNorm statistics
      testAccuracy = evaluate(model, test, *group, device, opt.batchSize);
      evaluatedAt = step;
      if (testAccuracy > bestAccuracy) bestAccuracy = testAccuracy, bestStep = step;
      metrics.record(step, {{"test_accuracy", testAccuracy}});
      progress.line(fmt::format("eval step {}: test accuracy {:.2f}%", step, 100 * testAccuracy));
    };
    int64_t savedAt = step;
    auto save = [&](int64_t epoch) {
      savedAt = step;
      const auto begin = Clock::now();
      checkpointer->saveAsync(step, epoch);  // a snapshot now; written while training goes on
      metrics.record(step, {{"checkpoint_seconds",
                             std::chrono::duration<double>(Clock::now() - begin).count()}});
    };

    for (int64_t epoch = sampler.epoch(); step < totalSteps; ++epoch) {
      if (!midEpoch) sampler.setEpoch(epoch);  // a new order each epoch, the same on every rank
      midEpoch = false;
      examples::LoaderOptions loaderOptions;
      loaderOptions.batchSize = opt.batchSize;
      loaderOptions.dropLast = true;
      loaderOptions.seed = opt.seed;
      loaderOptions.epoch = epoch;
      examples::BatchLoader loader(train, sampler.indices(), loaderOptions);
      // Whole steps left in this epoch (all of them, unless it was resumed part-way).
      const int64_t steps = static_cast<int64_t>(sampler.size()) / samplesPerStep;

      for (int64_t inEpoch = 0; inEpoch < steps && step < totalSteps; ++inEpoch) {
        dtrain::fault::injectAt(rank, step);  // DTRAIN_FAULT: tests kill or stop a rank here
        const auto stepStart = Clock::now();
        setLr(learningRate(peakLr, step, opt.warmupSteps, totalSteps));
        optimizer.zero_grad();

        // Gradient accumulation: the first accumSteps - 1 micro-batches only accumulate into
        // .grad (noSync: no communication); the last one's backward averages the sum across
        // ranks. Each micro-batch's loss is divided by accumSteps, so the step sees the mean.
        torch::Tensor stepLoss = torch::zeros({}, torch::kDouble),
                      stepCorrect = torch::zeros({}, torch::kLong);
        for (int64_t micro = 0; micro < opt.accumSteps; ++micro) {
          auto batch = loader.next();
          DTRAIN_CHECK(batch, "the loader ended early, at micro-batch {} of step {}", micro, step);
          // The loader works ahead on a copy of the sampler's indices; the sampler itself follows
          // what training consumed, so that a checkpoint records exactly where the job is.
          const std::vector<size_t> consumed = sampler.next(batch->indices.size(0)).value();
          DTRAIN_CHECK(
              std::equal(consumed.begin(), consumed.end(), batch->indices.data_ptr<int64_t>(),
                         [](size_t a, int64_t b) { return a == static_cast<size_t>(b); }),
              "the loader's batch at step {} is not the sampler's", step);
          torch::Tensor images = batch->images.to(device), labels = batch->labels.to(device);
          auto forwardBackward = [&] {
            // Mixed precision: the forward and the loss under autocast (bfloat16 on the CPU,
            // float16 on CUDA); backward outside it, as in PyTorch.
            torch::Tensor logits, loss;
            {
              dtrain::AutocastGuard autocast(device, opt.amp);
              logits = ddp(images);
              loss = torch::nn::functional::cross_entropy(logits, labels);
            }
            scaler.scale(loss / static_cast<double>(opt.accumSteps)).backward();
            stepLoss += loss.detach().to(torch::kCPU, torch::kDouble);
            stepCorrect += (logits.argmax(1) == labels).sum().cpu();
          };
          if (micro + 1 < opt.accumSteps) {
            auto noSync = ddp.noSync();
            forwardBackward();
          } else {
            forwardBackward();
          }
        }
        scaler.step(optimizer);  // optimizer.step(), unless a rank's gradients overflowed
        scaler.update();
        ++step;

        // Bookkeeping: this step's figures, and the progress line at the end of an interval.
        const double seconds = std::chrono::duration<double>(Clock::now() - stepStart).count();
        lastLoss = stepLoss.item<double>() / static_cast<double>(opt.accumSteps);
        lastAccuracy = stepCorrect.item<double>() / static_cast<double>(samplesPerStep);
        progress.add(lastLoss, stepCorrect.item<double>(), static_cast<double>(samplesPerStep));
        const double waited = std::chrono::duration<double>(ddp.lastIteration().waited).count();
        const double samplesPerSecond = static_cast<double>(samplesPerStep * world) / seconds;
        metrics.record(step, {{"loss", lastLoss},
                              {"accuracy", lastAccuracy},
                              {"samples_per_s", samplesPerSecond},
                              {"lr", learningRate(peakLr, step - 1, opt.warmupSteps, totalSteps)},
                              {"allreduce_wait_share", waited / seconds},
                              {"loss_scale", scaler.isEnabled() ? scaler.getScale() : 1.0},
                              {"epoch", static_cast<double>(epoch)}});
        recordCheckpointWrites();

        if (step % opt.logEvery == 0 || step == totalSteps) {
          progress.report(epoch, step,
                          scaler.isEnabled() ? fmt::format("  scale {:g}", scaler.getScale()) : "");
        }
        if (opt.evalEvery > 0 && step % opt.evalEvery == 0) runEval();
        if (checkpointer) {
          if (opt.saveEvery > 0 && step % opt.saveEvery == 0) save(epoch);
          // SIGTERM on any rank: every rank has saved this step, and stops.
          if (checkpointer->preempted(step, epoch)) {
            progress.line(fmt::format("preempted: saved step {}; run again to resume", step));
            group->shutdown();
            return dtrain::kExitPreempted;
          }
        }
      }
      if (steps == 0) continue;  // resumed at the very end of an epoch
      if (opt.evalEvery == 0) runEval();
      if (checkpointer && opt.saveEvery == 0) save(epoch);
    }

    // -------------------------------------------------------------------------------------------
    // 9. Summary. Every rank ends with the same parameters (DDP); rank 0 reports.
    // -------------------------------------------------------------------------------------------
    if (evaluatedAt != step) runEval();
    if (checkpointer) {
      if (savedAt != step) save(sampler.epoch());
      checkpointer->wait();  // the last asynchronous save is on disk everywhere
      recordCheckpointWrites();
    }
    metrics.flush();  // the last records reach the file, the endpoint and launch now
    // Each rank prints a fingerprint of its parameters and buffers: equal lines show that DDP kept
    // the ranks bitwise in step (evaluation synchronised the BatchNorm statistics).
    std::printf("fingerprint of rank %d's model: %016llx\n", rank,
                static_cast<unsigned long long>(examples::fingerprint(*model)));
    const double total = std::chrono::duration<double>(Clock::now() - started).count();
    if (step == firstStep) {
      progress.line(fmt::format("done: all {} steps were trained before; test accuracy {:.2f}%",
                                step, 100 * testAccuracy));
    } else {
      progress.line(fmt::format(
          "done: {} steps in {} ({:.0f} samples/s); last step loss {:.4f}, accuracy {:.1f}%; "
          "test accuracy {:.2f}% (best {:.2f}% at step {})",
          step, duration(total),
          static_cast<double>((step - firstStep) * samplesPerStep * world) / total, lastLoss,
          100 * lastAccuracy, 100 * testAccuracy, 100 * bestAccuracy, bestStep));
    }
    if (!opt.metricsFile.empty()) progress.line("metrics: " + opt.metricsFile);
    if (checkpointer) progress.line("checkpoints: " + checkpointer->nodeDirectory());
    group->shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_resnet: %s\n", e.what());
    return 1;
  }
}
