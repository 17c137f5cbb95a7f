#pragma once
// BatchLoader: turns a list of dataset indices (a DistributedSampler's share of an epoch) into
// training batches on a background thread, a bounded number of batches ahead of the training
// loop, so that decoding, augmentation and normalisation overlap with forward and backward.
//
//   sampler.setEpoch(epoch);
//   BatchLoader loader(train, sampler.indices(), options);
//   while (auto batch = loader.next()) { ... batch->images, batch->labels ... }
//
// Batches come in exactly the order of the indices (the last one smaller unless dropLast). The
// thread never touches the sampler: it gets a copy of the indices, so the sampler stays
// single-threaded as in PyTorch. Augmentation (random 32x32 crop of the image padded by 4 zero
// pixels, random horizontal flip: torchvision's RandomCrop(32, padding=4) + RandomHorizontalFlip)
// is drawn per sample from (seed, epoch, dataset index) alone, so it does not depend on the rank,
// the world size, the prefetch depth, or on whether the epoch was resumed from a checkpoint.
// An error on the thread is handed to next(), which rethrows it.

#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <ATen/core/Tensor.h>

#include "cifar10.h"

namespace examples {

// Per-channel mean and standard deviation of CIFAR-10's training images (on the 0-1 scale):
// torchvision's Normalize((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)).
struct Normalization {
  std::array<float, 3> mean{0.4914f, 0.4822f, 0.4465f};
  std::array<float, 3> std{0.2470f, 0.2435f, 0.2616f};
};

struct LoaderOptions {
  int64_t batchSize = 128;
  size_t prefetch = 4;  // batches ready ahead of next(): the queue's bound
  bool augment = true;
  bool dropLast = false;
  uint64_t seed = 0;
  int64_t epoch = 0;
  Normalization normalization;
};

struct Batch {
  at::Tensor images;   // float [B, 3, 32, 32], normalised
  at::Tensor labels;   // int64 [B]
  at::Tensor indices;  // int64 [B]: the dataset indices these samples came from
};

class BatchLoader {
 public:
  BatchLoader(CifarSplit data, std::vector<size_t> indices, LoaderOptions options);
  ~BatchLoader();  // stops the thread (a batch being built is finished, then dropped)
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // The next batch, waiting for the thread if needed; nullopt after the last one. Rethrows an
  // error of the thread.
  std::optional<Batch> next();
  // Batches this loader yields in all.
  int64_t batches() const;
  // Batches built and waiting for next() (at most LoaderOptions::prefetch).
  size_t queued() const;

 private:
  void run();
  Batch build(size_t first, size_t count) const;

  CifarSplit data_;
  std::vector<size_t> indices_;
  LoaderOptions options_;
  std::array<std::array<float, 256>, 3> lut_;  // pixel byte -> normalised value, per channel

  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::deque<Batch> queue_;   // guarded by mu_
  bool finished_ = false;     // guarded by mu_: the thread produced its last batch
  bool stopping_ = false;     // guarded by mu_
  std::exception_ptr error_;  // guarded by mu_
  std::thread thread_;
};

}  // namespace examples
