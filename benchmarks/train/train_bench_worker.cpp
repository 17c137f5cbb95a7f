// dtrain's side of train_bench: train_resnet's step — a batch from the BatchLoader thread (crop,
// flip, normalise), forward and backward through DistributedDataParallel, SGD — one step per
// turn, timed from asking for the batch to the end of the optimizer step (on CUDA, until the
// device has finished it). With --amp, forward and loss run under AutocastGuard and the
// GradScaler scales the loss, as train_resnet --amp does.
#include <chrono>
#include <fstream>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <dtrain/dtrain.h>

#include "common/bench_process.h"
#include "data/cifar10.h"
#include "data/loader.h"
#include "models/resnet.h"
#include "train_bench.h"

namespace dtrain::bench {

// Batches forever: a new epoch (sampler epoch, loader) whenever one ends, as a training loop does.
class EpochBatches {
 public:
  EpochBatches(examples::CifarSplit data, int world, int rank, int batch)
      : data_(std::move(data)), sampler_(static_cast<size_t>(data_.size()), world, rank) {
    options_.batchSize = batch;
    options_.dropLast = true;
    start();
  }
  examples::Batch next() {
    auto batch = loader_->next();
    if (!batch) {
      ++epoch_;
      start();
      batch = loader_->next();
      DTRAIN_CHECK(batch.has_value(), "an epoch of the benchmark data has no whole batch");
    }
    return std::move(*batch);
  }

 private:
  void start() {
    loader_.reset();
    sampler_.setEpoch(epoch_);
    options_.epoch = epoch_;
    loader_ = std::make_unique<examples::BatchLoader>(data_, sampler_.indices(), options_);
  }
  examples::CifarSplit data_;
  DistributedSampler sampler_;
  examples::LoaderOptions options_;
  int64_t epoch_ = 0;
  std::unique_ptr<examples::BatchLoader> loader_;
};

int runTrainWorker(const TrainConfig& config) {
  torch::set_num_threads(1);
  InitOptions initOptions;
  initOptions.backend = config.device == "cuda" ? "nccl" : "gloo";
  auto group = init(initOptions);
  const torch::Device device = group->device();
  torch::manual_seed(0);
  examples::ResNetOptions modelOptions;
  modelOptions.arch = config.model;
  const bool cifar = config.model == "resnet18";
  modelOptions.cifarStem = cifar;
  modelOptions.numClasses = cifar ? 10 : 1000;
  examples::ResNet model = examples::makeResNet(modelOptions);
  model->to(device);
  DistributedDataParallel<examples::ResNet> ddp(model, group);
  torch::optim::SGD sgd(ddp.parameters(),
                        torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(5e-4));
  GradScalerOptions scalerOptions;
  scalerOptions.enabled = config.amp && device.is_cuda();
  GradScaler scaler(group, scalerOptions);

  // ResNet-18 reads the CIFAR files through the loader thread; ResNet-50 trains on one fixed
  // random ImageNet-sized batch (the data path is ResNet-18's measurement).
  std::unique_ptr<EpochBatches> batches;
  torch::Tensor fixedImages, fixedLabels;
  if (cifar) {
    batches = std::make_unique<EpochBatches>(examples::readCifar10(config.data, true),
                                             group->size(), group->rank(), config.batch);
  } else {
    torch::manual_seed(static_cast<uint64_t>(group->rank()) + 1);
    fixedImages = torch::randn({config.batch, 3, 224, 224}).to(device);
    fixedLabels = torch::randint(0, 1000, {config.batch}, torch::kLong).to(device);
  }

  TurnTaker turns(config.turns, group->rank() == 0);
  auto step = [&] {
    turns.begin();
    group->barrier();
    const auto start = std::chrono::steady_clock::now();
    torch::Tensor images = fixedImages, labels = fixedLabels;
    if (batches) {
      examples::Batch batch = batches->next();
      images = batch.images.to(device);
      labels = batch.labels.to(device);
    }
    sgd.zero_grad();
    torch::Tensor loss;
    {
      AutocastGuard autocast(device, config.amp);
      loss = torch::nn::functional::cross_entropy(ddp(images), labels);
    }
    scaler.scale(loss).backward();
    scaler.step(sgd);
    scaler.update();
    if (device.is_cuda()) torch::cuda::synchronize();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    group->barrier();
    turns.end();
    return ms;
  };

  TrainResult result;
  result.impl = "dtrain";
  result.model = config.model;
  result.parameters = examples::parameterCount(*model);
  for (int i = 0; i < config.warmup; ++i) step();
  for (int i = 0; i < config.steps; ++i) result.stepMs.push_back(step());
  if (group->rank() == 0 && !config.out.empty())
    std::ofstream(config.out) << toJson(result) << "\n";
  group->barrier();
  group->shutdown();
  return 0;
}

std::string toJson(const TrainResult& r) {
  nlohmann::json j = {
      {"impl", r.impl}, {"model", r.model}, {"parameters", r.parameters}, {"step_ms", r.stepMs}};
  return j.dump();
}

TrainResult trainResultFromJson(const std::string& text) {
  auto j = nlohmann::json::parse(text);
  TrainResult r;
  r.impl = j.at("impl").get<std::string>();
  r.model = j.at("model").get<std::string>();
  r.parameters = j.at("parameters").get<int64_t>();
  r.stepMs = j.at("step_ms").get<std::vector<double>>();
  return r;
}

}  // namespace dtrain::bench
