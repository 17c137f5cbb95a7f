#include "evaluate.h"

#include <algorithm>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "data/loader.h"

namespace examples {

double evaluate(ResNet& model, const CifarSplit& test, dtrain::ProcessGroup& group,
                const c10::Device& device, int64_t batchSize) {
  torch::NoGradGuard noGrad;
  model->eval();
  std::vector<size_t> mine;
  for (int64_t i = group.rank(); i < test.size(); i += group.size())
    mine.push_back(static_cast<size_t>(i));
  LoaderOptions options;
  options.batchSize = batchSize;
  options.augment = false;
  BatchLoader loader(test, std::move(mine), options);
  at::Tensor counts = at::zeros({2}, at::kDouble);  // correct, seen
  int64_t batches = 0;
  while (auto batch = loader.next()) {
    at::Tensor predicted = model->forward(batch->images.to(device)).argmax(1).cpu();
    counts[0] += (predicted == batch->labels).sum().item<int64_t>();
    counts[1] += batch->labels.size(0);
    ++batches;
  }
  // A sharded model's forward is collective (ZeRO-3 gathers each unit in it): every rank runs as
  // many as rank 0, which has the most images, the extra ones on the first image, not counted.
  const int64_t perRank = (test.size() + group.size() - 1) / group.size();
  const int64_t mostBatches = (perRank + batchSize - 1) / batchSize;
  if (batches < mostBatches) {
    BatchLoader first(test, {0}, options);
    const at::Tensor image = first.next()->images.to(device);
    for (; batches < mostBatches; ++batches) model->forward(image);
  }
  model->train();
  if (device.is_cuda()) counts = counts.to(device);
  group.allreduce(counts);
  counts = counts.cpu();
  return counts[0].item<double>() / std::max(1.0, counts[1].item<double>());
}

}  // namespace examples
