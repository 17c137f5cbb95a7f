#include "loader.h"

#include <algorithm>

#include <ATen/ATen.h>

#include <dtrain/base/error.h>

namespace examples {
namespace {

constexpr int kPad = 4;  // RandomCrop(32, padding=4)

// SplitMix64: a good 64-bit mix of a counter, enough to draw a crop and a flip per sample.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

struct Augmentation {
  int dx = 0, dy = 0;  // crop offset in the padded image, minus the padding: -4..4
  bool flip = false;
};

Augmentation drawAugmentation(uint64_t seed, int64_t epoch, size_t index) {
  uint64_t r = mix(mix(mix(seed) ^ static_cast<uint64_t>(epoch)) ^ index);
  Augmentation a;
  a.dx = static_cast<int>(r % (2 * kPad + 1)) - kPad;
  a.dy = static_cast<int>((r >> 8) % (2 * kPad + 1)) - kPad;
  a.flip = ((r >> 16) & 1) != 0;
  return a;
}

}  // namespace

BatchLoader::BatchLoader(CifarSplit data, std::vector<size_t> indices, LoaderOptions options)
    : data_(std::move(data)), indices_(std::move(indices)), options_(options) {
  DTRAIN_CHECK_ARG(options_.batchSize > 0, "batch size must be positive, got {}",
                   options_.batchSize);
  DTRAIN_CHECK_ARG(options_.prefetch > 0, "prefetch must be at least 1");
  DTRAIN_CHECK_ARG(data_.images.is_contiguous() && data_.images.dtype() == at::kByte,
                   "images must be contiguous uint8");
  for (size_t i : indices_) {
    DTRAIN_CHECK_ARG(static_cast<int64_t>(i) < data_.size(),
                     "index {} is outside the dataset of {} images", i, data_.size());
  }
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      lut_[c][v] = (static_cast<float>(v) / 255.0f - options_.normalization.mean[c]) /
                   options_.normalization.std[c];
    }
  }
  thread_ = std::thread([this] { run(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

int64_t BatchLoader::batches() const {
  const auto n = static_cast<int64_t>(indices_.size()), b = options_.batchSize;
  return options_.dropLast ? n / b : (n + b - 1) / b;
}

size_t BatchLoader::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

std::optional<Batch> BatchLoader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return !queue_.empty() || finished_; });
  if (queue_.empty()) {
    if (error_) std::rethrow_exception(error_);
    return std::nullopt;
  }
  Batch batch = std::move(queue_.front());
  queue_.pop_front();
  lock.unlock();
  changed_.notify_all();
  return batch;
}

void BatchLoader::run() {
  std::exception_ptr error;
  try {
    const int64_t total = batches();
    for (int64_t b = 0; b < total; ++b) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        changed_.wait(lock, [&] { return queue_.size() < options_.prefetch || stopping_; });
        if (stopping_) break;
      }
      const size_t first = static_cast<size_t>(b * options_.batchSize);
      const size_t count = std::min(static_cast<size_t>(options_.batchSize),
                                    indices_.size() - first);
      Batch batch = build(first, count);
      {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.push_back(std::move(batch));
      }
      changed_.notify_all();
    }
  } catch (...) {
    error = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    finished_ = true;
    error_ = error;
  }
  changed_.notify_all();
}

Batch BatchLoader::build(size_t first, size_t count) const {
  constexpr int kSide = static_cast<int>(kCifarSide);
  const auto n = static_cast<int64_t>(count);
  Batch batch{at::empty({n, 3, kSide, kSide}, at::kFloat), at::empty({n}, at::kLong),
              at::empty({n}, at::kLong)};
  const uint8_t* src = data_.images.data_ptr<uint8_t>();
  const int64_t* labels = data_.labels.data_ptr<int64_t>();
  float* out = batch.images.data_ptr<float>();
  int64_t* outLabels = batch.labels.data_ptr<int64_t>();
  int64_t* outIndices = batch.indices.data_ptr<int64_t>();
  for (size_t s = 0; s < count; ++s) {
    const size_t index = indices_[first + s];
    outLabels[s] = labels[index];
    outIndices[s] = static_cast<int64_t>(index);
    Augmentation a;
    if (options_.augment) a = drawAugmentation(options_.seed, options_.epoch, index);
    const uint8_t* image = src + index * kCifarImageBytes;
    float* dst = out + s * kCifarImageBytes;
    for (int c = 0; c < 3; ++c) {
      const auto& lut = lut_[c];
      for (int y = 0; y < kSide; ++y) {
        const int sy = y + a.dy;
        float* row = dst + (c * kSide + y) * kSide;
        if (sy < 0 || sy >= kSide) {
          std::fill(row, row + kSide, lut[0]);  // the zero padding, normalised
          continue;
        }
        const uint8_t* srcRow = image + (c * kSide + sy) * kSide;
        for (int x = 0; x < kSide; ++x) {
          // Flip after the crop, as RandomHorizontalFlip follows RandomCrop.
          const int sx = (a.flip ? kSide - 1 - x : x) + a.dx;
          row[x] = (sx < 0 || sx >= kSide) ? lut[0] : lut[srcRow[sx]];
        }
      }
    }
  }
  return batch;
}

}  // namespace examples
