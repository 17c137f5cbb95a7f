#pragma once
// DistributedSampler: which dataset indices each rank trains on, with PyTorch's
// torch.utils.data.distributed.DistributedSampler semantics, plus a global cursor that a
// checkpoint saves so that a resumed run continues mid-epoch with exactly the samples that
// remained, also at another world size.
//
// Each epoch has one order of the whole dataset: a permutation drawn from a generator seeded with
// seed + epoch (the same permutation PyTorch draws), or 0..n-1 without shuffling. The order is
// padded by repeating it from its start until every rank gets as many samples (or, with dropLast,
// cut to a multiple of the world size), and rank r takes entries r, r + W, r + 2W, ... Call
// setEpoch() before each epoch, or every epoch repeats the first one's order.
//
// It is a torch::data sampler, so it plugs into torch::data::make_data_loader; it can also be
// used directly through indices() or next(). Copies share one position: see
// Note [Sampler copies share their position].

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <torch/data/samplers/base.h>

namespace dtrain {

struct SamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;  // every rank must use the same seed
  bool dropLast = false;
};

// Note [Sampler state]
// Where a job is in its data, independent of the world size: the epoch, and `cursor`, the number
// of entries of that epoch's order (padding not counted) that the ranks together have consumed.
// Since rank r takes entries r, r + W, ..., after every rank consumed k samples the ranks together
// consumed exactly the first k * W entries, so one number describes all ranks. A sampler resumed
// from it hands out the entries after the cursor, re-sharded for its own world size and padded
// (or cut) as a fresh epoch would be; at an unchanged world size that is exactly the rest of the
// epoch the interrupted run would have seen.
//
// Encoded (checkpoints) as 48 bytes, integers little-endian:
//   offset  size  field
//        0     8  magic "DTSAMPLR"
//        8     4  format version (1)
//       12     4  flags: bit 0 shuffle, bit 1 dropLast; other bits 0
//       16     8  seed (uint64)
//       24     8  epoch (int64)
//       32     8  datasetSize (uint64)
//       40     8  cursor (uint64, <= datasetSize)
struct SamplerState {
  uint64_t seed = 0;
  int64_t epoch = 0;
  uint64_t datasetSize = 0;
  uint64_t cursor = 0;
  bool shuffle = true;
  bool dropLast = false;

  static constexpr size_t kEncodedSize = 48;
  static constexpr uint32_t kFormatVersion = 1;
  std::vector<uint8_t> encode() const;
  // Throws CheckpointError naming the field that is wrong.
  static SamplerState decode(const std::vector<uint8_t>& bytes);
  bool operator==(const SamplerState& other) const;
};

// Note [Sampler copies share their position]
// torch::data::make_data_loader takes its sampler by value, while PyTorch's DataLoader holds a
// reference to the sampler the program created. So that the program's own sampler keeps working
// as in Python - setEpoch() before each epoch reaches the loader, and state() reports what the
// loader has handed out, for a checkpoint - copies of a DistributedSampler share one position
// (epoch, cursor, this epoch's indices, how many were handed out). Not thread-safe, as in PyTorch:
// one thread drives the loader and calls setEpoch()/state().
class DistributedSampler : public torch::data::samplers::Sampler<std::vector<size_t>> {
 public:
  // PyTorch's argument order, numReplicas (the world size) BEFORE rank, as in libtorch's
  // DistributedRandomSampler(size, num_replicas, rank) and Python's
  // DistributedSampler(dataset, num_replicas, rank):
  //
  //   DistributedSampler sampler(dataset.size().value(), group->size(), group->rank());
  //
  // A call with the two swapped is refused (InvalidArgument saying so): the rank is always below
  // the world size, so swapped values make rank >= numReplicas. numReplicas >= 1,
  // 0 <= rank < numReplicas.
  DistributedSampler(size_t datasetSize, int numReplicas, int rank, SamplerOptions options = {});

  // Starts `epoch` from its beginning (drops a resumed position).
  void setEpoch(int64_t epoch);
  int64_t epoch() const { return pos_->epoch; }

  // This rank's samples of the current epoch, from its beginning or from the resumed position.
  const std::vector<size_t>& indices() const { return pos_->indices; }
  // PyTorch's len(sampler): indices().size().
  size_t size() const { return pos_->indices.size(); }

  // torch::data::samplers::Sampler. reset() rewinds next() to the start of indices() (the data
  // loader calls it at the start of each pass); with a new dataset size the epoch restarts.
  void reset(std::optional<size_t> newSize = {}) override;
  std::optional<std::vector<size_t>> next(size_t batchSize) override;
  // The step-wise alternative to next() for a job whose world may change size (after a lost
  // node: TrainingState::tryStep): this rank's share of the next `globalBatch` entries of the
  // epoch's order, those the world consumes together -- the window's positions p with
  // p % numReplicas == rank, so ceil((globalBatch - rank) / numReplicas) of them and the split is
  // uneven when numReplicas does not divide globalBatch (weight the loss with sampleWeight()).
  // Every rank advances the epoch's cursor by the whole window, so state() and a re-shard for
  // another world size continue exactly. The epoch's last window may be shorter (with dropLast:
  // nullopt instead); nullopt at the end. Do not mix it with next() within an epoch.
  std::optional<std::vector<size_t>> nextShare(size_t globalBatch);
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  // The position after the samples next() has handed out (on every rank alike, when the ranks
  // step in lockstep).
  SamplerState state() const { return state(pos_->handedOut); }
  // The position after this rank consumed `consumed` entries of indices(): use it when a
  // prefetching loader runs ahead of training (Checkpointer::addSampler takes a function that
  // returns that count, and saves this).
  SamplerState state(size_t consumed) const;
  // Continues from `state`. Throws InvalidArgument when the state belongs to another dataset size,
  // seed, or shuffle/dropLast setting.
  void loadState(const SamplerState& state);
  // Serves another world from `state` on: rank `rank` of `numReplicas` (after a re-form among the
  // survivors of a lost node: TrainingState::tryStep). The same checks as loadState(); copies of
  // this sampler (a data loader's) keep their own world: make the loader again.
  void reshard(int numReplicas, int rank, const SamplerState& state);

 private:
  // Shared by copies (Note [Sampler copies share their position]).
  struct Position {
    size_t datasetSize = 0;
    int64_t epoch = 0;
    uint64_t start = 0;  // entries of the epoch's order consumed before indices begin
    std::vector<size_t> indices;
    size_t handedOut = 0;
    uint64_t shared = 0;         // entries of the order handed out by nextShare() since start
    std::vector<int64_t> order;  // the epoch's order, kept once nextShare() needs it
  };

  void rebuild();

  int numReplicas_;
  int rank_;
  SamplerOptions options_;
  std::shared_ptr<Position> pos_;
};

// The factor for the loss of a rank that trains `localSamples` of a global batch of
// `globalSamples` over `worldSize` ranks: DDP averages the ranks' gradients, each the mean over
// its own samples, so with uneven shares (nextShare) a mean over samples needs each rank's loss
// scaled by localSamples * worldSize / globalSamples. 1 when the split is even.
double sampleWeight(size_t localSamples, size_t globalSamples, int worldSize);

}  // namespace dtrain
