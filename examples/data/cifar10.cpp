#include "cifar10.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <dtrain/base/error.h>

namespace examples {
namespace {

namespace fs = std::filesystem;

constexpr int kTrainFiles = 5;

std::string trainFile(const std::string& dir, int i) {
  return (fs::path(dir) / ("data_batch_" + std::to_string(i) + ".bin")).string();
}

std::string testFile(const std::string& dir) { return (fs::path(dir) / "test_batch.bin").string(); }

}  // namespace

CifarSplit readCifar10File(const std::string& path) {
  std::error_code ec;
  const uintmax_t bytes = fs::file_size(path, ec);
  DTRAIN_CHECK_ARG(!ec,
                   "cannot read CIFAR-10 file {}: {}. HINT: --data-dir must hold the "
                   "binary version's files (cifar-10-batches-bin), or pass --synthetic N to "
                   "write a synthetic set there",
                   path, ec.message());
  const auto records = static_cast<int64_t>(bytes / kCifarRecordBytes);
  const auto rest = static_cast<int64_t>(bytes % kCifarRecordBytes);
  DTRAIN_CHECK_ARG(rest == 0,
                   "{}: truncated record at offset {}: {} of its {} bytes present (file size {}). "
                   "HINT: the file is incomplete; download or write it again",
                   path, records * kCifarRecordBytes, rest, kCifarRecordBytes, bytes);
  DTRAIN_CHECK_ARG(records > 0, "{}: empty file, no CIFAR-10 records", path);

  at::Tensor raw = at::empty({records, kCifarRecordBytes}, at::kByte);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(raw.data_ptr<uint8_t>()), static_cast<std::streamsize>(bytes));
  DTRAIN_CHECK_ARG(in.gcount() == static_cast<std::streamsize>(bytes),
                   "{}: read {} of {} bytes ({})", path, in.gcount(), bytes, std::strerror(errno));

  const uint8_t* p = raw.data_ptr<uint8_t>();
  for (int64_t i = 0; i < records; ++i) {
    uint8_t label = p[i * kCifarRecordBytes];
    DTRAIN_CHECK_ARG(label < kCifarClasses,
                     "{}: record {} at offset {} has label {}, expected 0-{}. HINT: not a "
                     "CIFAR-10 binary file (CIFAR-100's records have two label bytes)",
                     path, i, i * kCifarRecordBytes, label, kCifarClasses - 1);
  }
  CifarSplit split;
  split.labels = raw.select(1, 0).to(at::kLong);
  split.images =
      raw.narrow(1, 1, kCifarImageBytes).reshape({records, 3, kCifarSide, kCifarSide}).contiguous();
  return split;
}

CifarSplit readCifar10(const std::string& dir, bool train) {
  if (!train) return readCifar10File(testFile(dir));
  std::vector<at::Tensor> images, labels;
  for (int i = 1; i <= kTrainFiles; ++i) {
    CifarSplit part = readCifar10File(trainFile(dir, i));
    images.push_back(part.images);
    labels.push_back(part.labels);
  }
  return {at::cat(images), at::cat(labels)};
}

void writeCifar10File(const std::string& path, const CifarSplit& split) {
  const int64_t n = split.size();
  DTRAIN_CHECK_ARG(split.images.dtype() == at::kByte &&
                       split.images.sizes() == at::IntArrayRef({n, 3, kCifarSide, kCifarSide}),
                   "{}: images must be uint8 [{}, 3, 32, 32], got {} {}", path, n,
                   std::string(split.images.dtype().name()), c10::str(split.images.sizes()));
  at::Tensor records = at::cat({split.labels.to(at::kByte).unsqueeze(1),
                                split.images.reshape({n, kCifarImageBytes})},
                               1)
                           .contiguous();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(records.data_ptr<uint8_t>()),
              static_cast<std::streamsize>(records.numel()));
    out.flush();
    DTRAIN_CHECK(out.good(), "cannot write {}: {}", tmp, std::strerror(errno));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  DTRAIN_CHECK(!ec, "cannot rename {} to {}: {}", tmp, path, ec.message());
}

namespace {

// Gratings per class pattern, and the image statistics around them.
constexpr int64_t kGratings = 3;
constexpr double kContrast = 55.0;  // grating amplitude, in pixel levels
constexpr double kNoise = 70.0;     // per-pixel Gaussian noise, in pixel levels

struct ClassPatterns {
  at::Tensor angle;   // [classes, gratings]
  at::Tensor freq;    // cycles per image, [classes, gratings]
  at::Tensor colour;  // [classes, gratings, 3]
};

ClassPatterns drawPatterns(at::Generator& gen) {
  ClassPatterns p;
  p.angle = at::rand({kCifarClasses, kGratings}, gen, at::kDouble) * M_PI;
  p.freq = 1.0 + at::rand({kCifarClasses, kGratings}, gen, at::kDouble) * 3.0;
  p.colour = at::rand({kCifarClasses, kGratings, 3}, gen, at::kDouble) * 2.0 - 1.0;
  return p;
}

// `n` images with balanced labels, in shuffled order.
CifarSplit drawImages(const ClassPatterns& p, int64_t n, at::Generator& gen) {
  at::Tensor labels = at::arange(n, at::kLong).remainder(kCifarClasses);
  labels = labels.index_select(0, at::randperm(n, gen, at::kLong));
  at::Tensor images = at::empty({n, 3, kCifarSide, kCifarSide}, at::kByte);
  at::Tensor coord = at::arange(kCifarSide, at::kDouble) / kCifarSide;
  at::Tensor y = coord.view({1, 1, kCifarSide, 1}), x = coord.view({1, 1, 1, kCifarSide});
  constexpr int64_t kChunk = 1024;  // bounds the [chunk, gratings, 32, 32] temporaries
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t m = std::min(kChunk, n - start);
    at::Tensor c = labels.narrow(0, start, m);
    at::Tensor angle = p.angle.index_select(0, c).view({m, kGratings, 1, 1});
    at::Tensor freq = p.freq.index_select(0, c).view({m, kGratings, 1, 1});
    at::Tensor phase = at::rand({m, kGratings, 1, 1}, gen, at::kDouble) * (2 * M_PI);
    at::Tensor waves = at::sin(2 * M_PI * freq * (x * at::cos(angle) + y * at::sin(angle)) + phase);
    // [m, gratings, 32, 32] x [m, gratings, 3] -> [m, 3, 32, 32]
    at::Tensor pattern = at::einsum("mgyx,mgc->mcyx", {waves, p.colour.index_select(0, c)});
    at::Tensor contrast = 0.3 + at::rand({m, 1, 1, 1}, gen, at::kDouble);
    at::Tensor brightness = (at::rand({m, 1, 1, 1}, gen, at::kDouble) - 0.5) * 60.0;
    at::Tensor noise = at::randn({m, 3, kCifarSide, kCifarSide}, gen, at::kDouble) * kNoise;
    at::Tensor pixels = 128.0 + brightness + contrast * kContrast * pattern + noise;
    images.narrow(0, start, m).copy_(pixels.round().clamp(0, 255).to(at::kByte));
  }
  return {images, labels};
}

}  // namespace

void writeSyntheticCifar10(const std::string& dir, int64_t trainSize, int64_t testSize,
                           uint64_t seed) {
  DTRAIN_CHECK_ARG(trainSize >= kTrainFiles && testSize > 0,
                   "a synthetic set needs at least {} training images and 1 test image, got {} "
                   "and {}",
                   kTrainFiles, trainSize, testSize);
  std::error_code ec;
  fs::create_directories(dir, ec);
  DTRAIN_CHECK(!ec, "cannot create {}: {}", dir, ec.message());
  at::Generator gen = at::detail::createCPUGenerator(seed);
  ClassPatterns patterns = drawPatterns(gen);
  CifarSplit train = drawImages(patterns, trainSize, gen);
  for (int i = 0; i < kTrainFiles; ++i) {
    int64_t begin = trainSize * i / kTrainFiles, end = trainSize * (i + 1) / kTrainFiles;
    writeCifar10File(trainFile(dir, i + 1),
                     {train.images.slice(0, begin, end), train.labels.slice(0, begin, end)});
  }
  writeCifar10File(testFile(dir), drawImages(patterns, testSize, gen));
}

}  // namespace examples
