// examples/data/loader: the background thread keeps the sampler's order, bounds its queue, and
// augments and normalises like torchvision's RandomCrop(32, 4) + RandomHorizontalFlip + Normalize.
#include <chrono>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <dtrain/base/error.h>
#include <dtrain/torch/distributed_sampler.h>

#include "data/loader.h"

namespace examples::loader_test {
namespace {

// Image i is filled with bytes derived from i, label i % 10.
CifarSplit indexed(int64_t n) {
  CifarSplit s;
  s.images = torch::empty({n, 3, 32, 32}, torch::kByte);
  for (int64_t i = 0; i < n; ++i) {
    s.images[i] = torch::arange(3 * 32 * 32, torch::kLong)
                      .add(i * 7)
                      .remainder(256)
                      .to(torch::kByte)
                      .view({3, 32, 32});
  }
  s.labels = torch::arange(n, torch::kLong).remainder(10);
  return s;
}

torch::Tensor normalised(const torch::Tensor& bytes, const Normalization& norm) {
  torch::Tensor mean =
      torch::tensor(std::vector<float>(norm.mean.begin(), norm.mean.end())).view({3, 1, 1});
  torch::Tensor std =
      torch::tensor(std::vector<float>(norm.std.begin(), norm.std.end())).view({3, 1, 1});
  return (bytes.to(torch::kFloat) / 255.0f - mean) / std;
}

TEST(BatchLoader, KeepsTheSamplersOrderAcrossBatchesAndEpochs) {
  CifarSplit data = indexed(103);
  dtrain::DistributedSampler sampler(103, /*numReplicas=*/2, /*rank=*/1);
  LoaderOptions options;
  options.batchSize = 7;
  options.prefetch = 2;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    sampler.setEpoch(epoch);
    options.epoch = epoch;
    BatchLoader loader(data, sampler.indices(), options);
    std::vector<int64_t> seen;
    int64_t batches = 0;
    while (auto batch = loader.next()) {
      ++batches;
      EXPECT_LE(batch->labels.size(0), 7);
      for (int64_t i = 0; i < batch->indices.size(0); ++i) {
        int64_t index = batch->indices[i].item<int64_t>();
        seen.push_back(index);
        EXPECT_EQ(batch->labels[i].item<int64_t>(), index % 10);
      }
    }
    EXPECT_EQ(batches, loader.batches());
    EXPECT_EQ(batches, 8);  // 52 samples on rank 1 (103 padded to 104), 7 per batch
    std::vector<int64_t> expected(sampler.indices().begin(), sampler.indices().end());
    EXPECT_EQ(seen, expected) << "epoch " << epoch;
    EXPECT_FALSE(loader.next().has_value());  // stays at the end
  }
}

TEST(BatchLoader, DropLastAndAResumedPosition) {
  CifarSplit data = indexed(40);
  dtrain::DistributedSampler sampler(40, 2, 0);
  sampler.setEpoch(1);
  dtrain::SamplerState resumed = sampler.state(/*consumed=*/6);  // 6 of 20 done: 12 of 40 overall
  dtrain::DistributedSampler again(40, 2, 0);
  again.loadState(resumed);
  LoaderOptions options;
  options.batchSize = 4;
  options.dropLast = true;
  BatchLoader loader(data, again.indices(), options);
  std::vector<int64_t> seen;
  while (auto batch = loader.next()) {
    EXPECT_EQ(batch->labels.size(0), 4);
    for (int64_t i = 0; i < 4; ++i) seen.push_back(batch->indices[i].item<int64_t>());
  }
  std::vector<int64_t> expected(sampler.indices().begin() + 6, sampler.indices().begin() + 18);
  EXPECT_EQ(seen, expected);  // the 14 left, cut to whole batches of 4
}

TEST(BatchLoader, WithoutAugmentationImagesAreNormalisedCopies) {
  CifarSplit data = indexed(10);
  LoaderOptions options;
  options.batchSize = 10;
  options.augment = false;
  BatchLoader loader(data, {3, 1, 4}, options);
  auto batch = loader.next();
  ASSERT_TRUE(batch);
  for (int64_t i = 0; i < 3; ++i) {
    int64_t index = batch->indices[i].item<int64_t>();
    EXPECT_TRUE(
        torch::allclose(batch->images[i], normalised(data.images[index], options.normalization)));
  }
}

// Every augmented image is one of the 9 x 9 x 2 crops/flips of its zero-padded source, the same
// one whatever the batch, rank or loader; another epoch draws again.
TEST(BatchLoader, AugmentationIsACropAndFlipDrawnPerSampleAndEpoch) {
  CifarSplit data = indexed(64);
  LoaderOptions options;
  options.batchSize = 5;
  options.seed = 9;
  options.epoch = 2;
  std::vector<size_t> all(64);
  for (size_t i = 0; i < 64; ++i) all[i] = i;
  BatchLoader loader(data, all, options);
  std::vector<torch::Tensor> images;
  while (auto batch = loader.next()) {
    for (int64_t i = 0; i < batch->images.size(0); ++i) images.push_back(batch->images[i]);
  }
  ASSERT_EQ(images.size(), 64u);
  for (int64_t index : {0, 17, 63}) {
    torch::Tensor padded = torch::constant_pad_nd(data.images[index], {4, 4, 4, 4}, 0);
    bool found = false;
    for (int dy = 0; dy <= 8 && !found; ++dy) {
      for (int dx = 0; dx <= 8 && !found; ++dx) {
        torch::Tensor crop = padded.slice(1, dy, dy + 32).slice(2, dx, dx + 32);
        for (bool flip : {false, true}) {
          torch::Tensor candidate = normalised(flip ? crop.flip({2}) : crop, options.normalization);
          if (torch::equal(candidate, images[index])) {
            found = true;
            break;
          }
        }
      }
    }
    EXPECT_TRUE(found) << "image " << index << " is no crop/flip of its source";
  }
  // Most of 64 images differ from their source (each is unchanged with chance 1/162).
  int64_t different = 0;
  for (int64_t i = 0; i < 64; ++i) {
    different += !torch::equal(images[i], normalised(data.images[i], options.normalization));
  }
  EXPECT_GT(different, 32);

  // The same index in another loader (another batch size, a subset, as another rank would have)
  // gets the same augmentation; another epoch mostly not.
  options.batchSize = 3;
  BatchLoader other(data, {17, 63}, options);
  auto batch = other.next();
  EXPECT_TRUE(torch::equal(batch->images[0], images[17]));
  EXPECT_TRUE(torch::equal(batch->images[1], images[63]));
  options.epoch = 3;
  BatchLoader nextEpoch(data, all, options);
  int64_t same = 0, i = 0;
  while (auto b = nextEpoch.next()) {
    for (int64_t k = 0; k < b->images.size(0); ++k, ++i)
      same += torch::equal(b->images[k], images[i]);
  }
  EXPECT_LT(same, 16);
}

TEST(BatchLoader, QueueIsBoundedAndTheDestructorDoesNotWaitForTheRest) {
  CifarSplit data = indexed(200);
  std::vector<size_t> all(200);
  for (size_t i = 0; i < 200; ++i) all[i] = i;
  LoaderOptions options;
  options.batchSize = 2;
  options.prefetch = 3;
  auto loader = std::make_unique<BatchLoader>(data, all, options);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (loader->queued() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(loader->queued(), 3u);  // full, and no further
  ASSERT_TRUE(loader->next());
  loader.reset();  // 96 batches never built
}

TEST(BatchLoader, IndexOutsideTheDatasetIsRefused) {
  CifarSplit data = indexed(4);
  EXPECT_THROW(BatchLoader(data, {0, 4}, LoaderOptions{}), dtrain::InvalidArgument);
}

}  // namespace
}  // namespace examples::loader_test
