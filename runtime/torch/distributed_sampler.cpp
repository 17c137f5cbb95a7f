#include "dtrain/torch/distributed_sampler.h"

#include <algorithm>
#include <cstring>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/serialize/archive.h>

#include "byte_layout.h"
#include "dtrain/base/error.h"

namespace dtrain {

namespace {

constexpr char kMagic[8] = {'D', 'T', 'S', 'A', 'M', 'P', 'L', 'R'};
constexpr const char* kArchiveKey = "dtrain_sampler_state";

// The epoch's order of the whole dataset (PyTorch's: randperm with a generator seeded seed+epoch).
std::vector<int64_t> epochOrder(size_t n, const SamplerOptions& options, int64_t epoch) {
  at::Tensor order;
  if (options.shuffle) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(options.seed +
                                                        static_cast<uint64_t>(epoch));
    order = at::randperm(static_cast<int64_t>(n), gen, at::kLong);
  } else {
    order = at::arange(static_cast<int64_t>(n), at::kLong);
  }
  const int64_t* p = order.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + n);
}

}  // namespace

std::vector<uint8_t> SamplerState::encode() const {
  std::vector<uint8_t> out(kEncodedSize, 0);
  std::memcpy(out.data(), kMagic, sizeof(kMagic));
  putLE(out.data() + 8, kFormatVersion, 4);
  putLE(out.data() + 12, (shuffle ? 1u : 0u) | (dropLast ? 2u : 0u), 4);
  putLE(out.data() + 16, seed, 8);
  putLE(out.data() + 24, static_cast<uint64_t>(epoch), 8);
  putLE(out.data() + 32, datasetSize, 8);
  putLE(out.data() + 40, cursor, 8);
  return out;
}

SamplerState SamplerState::decode(const std::vector<uint8_t>& bytes) {
  DTRAIN_CHECK_T(CheckpointError, bytes.size() == kEncodedSize,
                 "sampler state: expected {} bytes, got {}", kEncodedSize, bytes.size());
  DTRAIN_CHECK_T(CheckpointError, std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) == 0,
                 "sampler state: bad magic (not a dtrain sampler state)");
  uint64_t version = getLE(bytes.data() + 8, 4);
  DTRAIN_CHECK_T(CheckpointError, version == kFormatVersion,
                 "sampler state: format version {} is not supported (this build reads {}). "
                 "HINT: resume with the dtrain version that wrote the checkpoint",
                 version, kFormatVersion);
  uint64_t flags = getLE(bytes.data() + 12, 4);
  DTRAIN_CHECK_T(CheckpointError, (flags & ~uint64_t{3}) == 0, "sampler state: unknown flags {:#x}",
                 flags);
  SamplerState s;
  s.shuffle = flags & 1;
  s.dropLast = flags & 2;
  s.seed = getLE(bytes.data() + 16, 8);
  s.epoch = static_cast<int64_t>(getLE(bytes.data() + 24, 8));
  s.datasetSize = getLE(bytes.data() + 32, 8);
  s.cursor = getLE(bytes.data() + 40, 8);
  DTRAIN_CHECK_T(CheckpointError, s.epoch >= 0, "sampler state: negative epoch {}", s.epoch);
  DTRAIN_CHECK_T(CheckpointError, s.cursor <= s.datasetSize,
                 "sampler state: cursor {} is past the dataset size {}", s.cursor, s.datasetSize);
  return s;
}

bool SamplerState::operator==(const SamplerState& o) const {
  return seed == o.seed && epoch == o.epoch && datasetSize == o.datasetSize && cursor == o.cursor &&
         shuffle == o.shuffle && dropLast == o.dropLast;
}

DistributedSampler::DistributedSampler(size_t datasetSize, int numReplicas, int rank,
                                       SamplerOptions options)
    : numReplicas_(numReplicas),
      rank_(rank),
      options_(options),
      pos_(std::make_shared<Position>()) {
  // Both checks also catch the old (rank, worldSize) order: a valid rank is below the world size,
  // so swapped values give numReplicas 0 or rank >= numReplicas.
  DTRAIN_CHECK_ARG(numReplicas >= 1 && rank >= 0 && rank < numReplicas,
                   "DistributedSampler(datasetSize={}, numReplicas={}, rank={}): {}. HINT: the "
                   "order is PyTorch's, numReplicas (the world size) before rank: "
                   "DistributedSampler(n, group->size(), group->rank()); were they swapped?",
                   datasetSize, numReplicas, rank,
                   numReplicas < 1 ? "numReplicas must be at least 1"
                                   : fmt::format("rank must be in 0..{}", numReplicas - 1));
  pos_->datasetSize = datasetSize;
  rebuild();
}

void DistributedSampler::rebuild() {
  Position& p = *pos_;
  p.indices.clear();
  p.handedOut = 0;
  p.shared = 0;
  p.order.clear();
  const size_t n = p.datasetSize;
  const size_t w = static_cast<size_t>(numReplicas_);
  if (n == 0) return;
  auto order = epochOrder(n, options_, p.epoch);
  const size_t remaining = n - p.start;
  const size_t perRank = options_.dropLast ? remaining / w : (remaining + w - 1) / w;
  p.indices.reserve(perRank);
  // Entry j of what is left: the order after the cursor, then (padding) the order from its start.
  for (size_t k = 0; k < perRank; ++k) {
    size_t j = k * w + static_cast<size_t>(rank_);
    size_t at = j < remaining ? p.start + j : (j - remaining) % n;
    p.indices.push_back(static_cast<size_t>(order[at]));
  }
}

void DistributedSampler::setEpoch(int64_t epoch) {
  DTRAIN_CHECK_ARG(epoch >= 0, "DistributedSampler: negative epoch {}", epoch);
  pos_->epoch = epoch;
  pos_->start = 0;
  rebuild();
}

void DistributedSampler::reset(std::optional<size_t> newSize) {
  if (newSize.has_value() && *newSize != pos_->datasetSize) {
    pos_->datasetSize = *newSize;
    pos_->start = 0;
    rebuild();
  }
  pos_->handedOut = 0;
  pos_->shared = 0;
}

std::optional<std::vector<size_t>> DistributedSampler::next(size_t batchSize) {
  Position& p = *pos_;
  if (p.handedOut >= p.indices.size()) return {};
  size_t count = std::min(batchSize, p.indices.size() - p.handedOut);
  std::vector<size_t> batch(p.indices.begin() + static_cast<std::ptrdiff_t>(p.handedOut),
                            p.indices.begin() + static_cast<std::ptrdiff_t>(p.handedOut + count));
  p.handedOut += count;
  return batch;
}

std::optional<std::vector<size_t>> DistributedSampler::nextShare(size_t globalBatch) {
  DTRAIN_CHECK_ARG(globalBatch >= 1, "DistributedSampler::nextShare: a global batch of 0");
  Position& p = *pos_;
  const uint64_t begin = p.start + p.shared;
  if (begin >= p.datasetSize) return {};
  const uint64_t window = std::min<uint64_t>(globalBatch, p.datasetSize - begin);
  if (options_.dropLast && window < globalBatch) return {};
  if (p.order.empty()) p.order = epochOrder(p.datasetSize, options_, p.epoch);
  std::vector<size_t> share;
  for (uint64_t k = static_cast<uint64_t>(rank_); k < window;
       k += static_cast<uint64_t>(numReplicas_)) {
    share.push_back(static_cast<size_t>(p.order[begin + k]));
  }
  p.shared += window;
  return share;
}

double sampleWeight(size_t localSamples, size_t globalSamples, int worldSize) {
  DTRAIN_CHECK_ARG(globalSamples > 0 && worldSize > 0,
                   "sampleWeight: {} global samples over {} ranks", globalSamples, worldSize);
  return static_cast<double>(localSamples) * worldSize / static_cast<double>(globalSamples);
}

SamplerState DistributedSampler::state(size_t consumed) const {
  const Position& p = *pos_;
  consumed = std::min(consumed, p.indices.size());
  SamplerState s;
  s.seed = options_.seed;
  s.epoch = p.epoch;
  s.datasetSize = p.datasetSize;
  // nextShare() counts the world's entries itself; next() counts this rank's, a stride apart.
  s.cursor = p.shared > 0
                 ? std::min<uint64_t>(p.datasetSize, p.start + p.shared)
                 : std::min<uint64_t>(p.datasetSize, p.start + uint64_t{consumed} * numReplicas_);
  s.shuffle = options_.shuffle;
  s.dropLast = options_.dropLast;
  return s;
}

void DistributedSampler::loadState(const SamplerState& s) {
  DTRAIN_CHECK_ARG(s.datasetSize == pos_->datasetSize,
                   "DistributedSampler: the saved state is for a dataset of {} samples, this "
                   "sampler has {}. HINT: resume with the same dataset",
                   s.datasetSize, pos_->datasetSize);
  DTRAIN_CHECK_ARG(s.seed == options_.seed && s.shuffle == options_.shuffle,
                   "DistributedSampler: the saved state was shuffled with seed {} (shuffle={}), "
                   "this sampler uses seed {} (shuffle={}); the epoch's order would differ. "
                   "HINT: construct the sampler with the saved options",
                   s.seed, s.shuffle, options_.seed, options_.shuffle);
  DTRAIN_CHECK_ARG(s.dropLast == options_.dropLast,
                   "DistributedSampler: the saved state has dropLast={}, this sampler {}",
                   s.dropLast, options_.dropLast);
  DTRAIN_CHECK_ARG(s.cursor <= s.datasetSize && s.epoch >= 0,
                   "DistributedSampler: invalid state (epoch {}, cursor {} of {})", s.epoch,
                   s.cursor, s.datasetSize);
  pos_->epoch = s.epoch;
  pos_->start = s.cursor;
  rebuild();
}

void DistributedSampler::reshard(int numReplicas, int rank, const SamplerState& state) {
  DTRAIN_CHECK_ARG(numReplicas >= 1 && rank >= 0 && rank < numReplicas,
                   "DistributedSampler::reshard: rank {} of {} replicas", rank, numReplicas);
  numReplicas_ = numReplicas;
  rank_ = rank;
  loadState(state);
}

void DistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  auto bytes = state().encode();
  archive.write(
      kArchiveKey,
      at::tensor(std::vector<int64_t>(bytes.begin(), bytes.end()), at::kLong).to(at::kByte),
      /*is_buffer=*/true);
}

void DistributedSampler::load(torch::serialize::InputArchive& archive) {
  at::Tensor t;
  archive.read(kArchiveKey, t, /*is_buffer=*/true);
  t = t.to(at::kByte).contiguous();
  const uint8_t* p = t.data_ptr<uint8_t>();
  loadState(SamplerState::decode(std::vector<uint8_t>(p, p + t.numel())));
}

}  // namespace dtrain
