// train_linear: the smallest complete data-parallel training program with dtrain.
//
//   launch --nproc-per-node 2 --max-restarts 1 ./train_linear --epochs 5 --checkpoint-dir ckpt
//
// Every rank builds the same synthetic regression problem (y = x . w* + b* + noise), trains a
// linear model on its shard of each epoch, and DDP averages the gradients across ranks during
// backward. Read it top to bottom: init, data, model, DDP, checkpoints, metrics, the training
// loop.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <type_traits>

#include <torch/torch.h>

#include <dtrain/dtrain.h>

namespace {

struct Args {
  int64_t epochs = 5;
  int64_t batchSize = 32;  // per rank
  double lr = 0.05;
  int64_t samples = 4096;
  int64_t features = 16;
  std::string checkpointDir;   // empty: no checkpoints
  std::string tensorboardDir;  // empty: no TensorBoard events
  bool amp = false;            // mixed precision: bfloat16 on the CPU, float16 on CUDA
};

void printUsage(FILE* to) {
  const Args d;
  std::fprintf(
      to,
      "usage: train_linear [--epochs N] [--batch-size N] [--lr X] [--samples N]\n"
      "                    [--checkpoint-dir DIR] [--amp] [--tensorboard-dir DIR]\n"
      "  --epochs N            epochs to train (default %lld)\n"
      "  --batch-size N        samples per rank per step (default %lld)\n"
      "  --lr X                SGD learning rate (default %g)\n"
      "  --samples N           size of the synthetic dataset (default %lld)\n"
      "  --checkpoint-dir DIR  save after each epoch and resume from there (default: none)\n"
      "  --amp                 mixed precision: bfloat16 on the CPU, float16 on CUDA\n"
      "  --tensorboard-dir DIR rank 0 writes TensorBoard events there (default: none)\n"
      "Run it under launch: launch --nproc-per-node 2 train_linear --epochs 5\n",
      static_cast<long long>(d.epochs), static_cast<long long>(d.batchSize), d.lr,
      static_cast<long long>(d.samples));
}

Args parseArgs(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    auto take = [&](auto* out) {
      char* end = nullptr;
      double number = value ? std::strtod(value, &end) : 0;
      if (value == nullptr || *value == '\0' || *end != '\0' || number <= 0) {
        std::fprintf(stderr, "train_linear: %s needs a positive number, got '%s'\n", flag.c_str(),
                     value ? value : "");
        std::exit(2);
      }
      *out = static_cast<std::remove_pointer_t<decltype(out)>>(number);
      ++i;
    };
    if (flag == "--help" || flag == "-h") {
      printUsage(stdout);
      std::exit(0);
    }
    if (flag == "--amp") args.amp = true;
    else if (flag == "--checkpoint-dir" && value != nullptr) args.checkpointDir = argv[++i];
    else if (flag == "--tensorboard-dir" && value != nullptr) args.tensorboardDir = argv[++i];
    else if (flag == "--epochs") take(&args.epochs);
    else if (flag == "--batch-size") take(&args.batchSize);
    else if (flag == "--lr") take(&args.lr);
    else if (flag == "--samples") take(&args.samples);
    else {
      std::fprintf(stderr, "train_linear: unknown flag %s\n", flag.c_str());
      printUsage(stderr);
      std::exit(2);
    }
  }
  return args;
}

// The same data on every rank: a fixed seed, so only the sampler decides who trains on what.
struct RegressionData : torch::data::datasets::Dataset<RegressionData> {
  torch::Tensor x, y, trueWeight;
  float trueBias = 0.5f;

  RegressionData(int64_t samples, int64_t features) {
    torch::manual_seed(1234);
    x = torch::randn({samples, features});
    trueWeight = torch::randn({features, 1});
    y = x.matmul(trueWeight) + trueBias + 0.01 * torch::randn({samples, 1});
  }
  torch::data::Example<> get(size_t i) override { return {x[i], y[i]}; }
  torch::optional<size_t> size() const override { return static_cast<size_t>(x.size(0)); }
};

// One epoch over this rank's shard. backward() returns with every gradient averaged over the
// ranks. Returns {sum of the losses, number of batches}.
template <typename Loader>
torch::Tensor trainEpoch(Loader& loader, dtrain::DistributedDataParallel<torch::nn::Linear>& ddp,
                         torch::optim::SGD& optimizer, dtrain::GradScaler& scaler,
                         c10::Device device, bool amp) {
  torch::Tensor lossSum = torch::zeros({2});
  for (auto& batch : loader) {
    optimizer.zero_grad();
    torch::Tensor loss;
    {
      dtrain::AutocastGuard autocast(device, amp);  // forward and loss only
      loss = torch::mse_loss(ddp(batch.data), batch.target);
    }
    scaler.scale(loss).backward();
    scaler.step(optimizer);
    scaler.update();
    lossSum[0] += loss.item<float>();
    lossSum[1] += 1;
  }
  return lossSum;
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parseArgs(argc, argv);
  try {
    // 1. Join the job: rank, world size and the collectives come from `launch`'s environment.
    auto group = dtrain::init();
    const bool leader = group->rank() == 0;

    // 2. Data: each rank iterates over its own shard of every epoch.
    RegressionData data(args.samples, args.features);
    torch::Tensor trueWeight = data.trueWeight.clone();
    // PyTorch's argument order: dataset size, number of replicas (the world size), rank.
    dtrain::DistributedSampler sampler(static_cast<size_t>(args.samples), group->size(),
                                       group->rank());
    auto loader = torch::data::make_data_loader(
        std::move(data).map(torch::data::transforms::Stack<>()), sampler,
        torch::data::DataLoaderOptions().batch_size(static_cast<size_t>(args.batchSize)));

    // 3. Model, wrapped in DDP: construction checks that every rank has the same model and
    //    copies rank 0's parameters to everyone.
    torch::manual_seed(static_cast<uint64_t>(group->rank()));  // different on purpose
    torch::nn::Linear model(args.features, 1);
    dtrain::DistributedDataParallel<torch::nn::Linear> ddp(model, group);
    torch::optim::SGD optimizer(ddp.parameters(), torch::optim::SGDOptions(args.lr).momentum(0.9));
    dtrain::GradScalerOptions scaling;  // --amp: float16 (CUDA) needs loss scaling, bfloat16 not
    scaling.enabled = args.amp && group->device().is_cuda();
    dtrain::GradScaler scaler(group, scaling);

    // 4. The training state: what a checkpoint saves and restores, registered once. Checkpoints:
    //    after each epoch into --checkpoint-dir; a restarted (or rerun) job resumes after the
    //    last one.
    auto state = std::make_shared<dtrain::TrainingState>(group);
    state->addModule("model", model);
    state->addOptimizer("optimizer", optimizer);
    state->addScaler("scaler", scaler);
    std::unique_ptr<dtrain::Checkpointer> checkpointer;
    if (!args.checkpointDir.empty()) {
      checkpointer = std::make_unique<dtrain::Checkpointer>(state, args.checkpointDir);
    }
    int64_t firstEpoch = 0;
    if (checkpointer) {
      if (auto restored = checkpointer->restore()) firstEpoch = restored->step;  // epochs done
    }
    // 5. Metrics: each epoch's mean loss; under launch it reaches launch's endpoint and files by
    //    itself, and --tensorboard-dir makes rank 0 write TensorBoard events of its own.
    dtrain::metrics::Metrics metrics;
    if (leader && !args.tensorboardDir.empty()) {
      metrics.addSink(dtrain::metrics::TensorBoardSink::open(args.tensorboardDir));
    }

    if (leader && firstEpoch > 0) {
      std::printf("resumed at epoch %lld\n", static_cast<long long>(firstEpoch));
    }

    // 6. Train: trainEpoch() above is one epoch on this rank's shard.
    for (int64_t epoch = firstEpoch; epoch < args.epochs; ++epoch) {
      state->beginStep(epoch);  // where each epoch begins (DTRAIN_FAULT's "step" is the epoch)
      sampler.setEpoch(epoch);  // a new shuffle each epoch, the same on every rank
      torch::Tensor lossSum = trainEpoch(*loader, ddp, optimizer, scaler, group->device(),
                                         args.amp);
      if (checkpointer) checkpointer->save(epoch + 1, epoch);
      group->allreduce(lossSum);  // the mean over every rank's batches
      const float meanLoss = (lossSum[0] / lossSum[1]).item<float>();
      metrics.record(epoch, {{"loss", meanLoss}});
      if (leader) {
        std::printf("epoch %lld: mean loss %.6f over %d ranks\n", static_cast<long long>(epoch),
                    meanLoss, group->size());
      }
    }

    // Every rank ends with the same parameters; rank 0 reports how close they are to the truth.
    if (leader) {
      float error = (model->weight.detach().t() - trueWeight).abs().max().item<float>();
      std::printf("done: largest weight error %.4f, bias %.4f (true 0.5)\n", error,
                  model->bias.item<float>());
    }
    group->shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_linear: %s\n", e.what());
    return 1;
  }
}
