#pragma once
// Not API (detail/): an internal that dtrain/torch/zero.h needs.
// It may change in any release; programs include <dtrain/dtrain.h>.
// Shard layout of ZeRO (dtrain/torch/zero.h): which parameters share a unit -- one flat buffer
// that is reduce-scattered and all-gathered as one -- and which elements of each unit every rank
// owns. A pure function of the parameters' sizes, their (parameter group, dtype) and the world
// size, so it is tested on tables; it is fixed before the optimizer is built and nothing moves it
// afterwards (DDP's bucket rebuild does not apply to it).
//
// See Note [Shard layout].

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dtrain {

// Units are as large as DDP's buckets: the first, whose gradients are complete first in
// backward, small so that the first reduce-scatter starts early; the others large enough that
// the per-collective latency does not matter, small enough that the all-gather of one overlaps
// the optimizer step of the next.
constexpr size_t kDefaultFirstUnitBytes = size_t{1} << 20;
constexpr size_t kDefaultUnitBytes = size_t{25} << 20;

// One parameter as the layout sees it, in parameter order (the module's registration order).
struct ShardInput {
  int64_t numel = 0;
  size_t elementSize = 4;
  // Parameters of different keys -- (parameter group, dtype) -- never share a unit: a unit is one
  // flat buffer of one dtype, stepped by the optimizer of one group.
  int key = 0;
};

// Note [Shard layout]
// Units are formed as DDP forms its buckets (Note [Bucket order], assignBuckets()): parameters
// walked from the last registered, one open unit per key, closed once it holds its limit. A
// unit holds its parameters in parameter order, flattened and concatenated, padded at the end to
// a multiple of the world size N; rank r owns the contiguous block [r S, (r+1) S) of it, S =
// ceil(numel / N). The padding (at most N - 1 elements per unit) is reported.
//
// Why per unit and not a contiguous 1/N of a whole parameter group (DeepSpeed's partitions): a
// reduce-scatter hands every rank the same number of elements, and a unit's gradients are
// complete at one moment of backward. With the group cut into N contiguous pieces, a bucket of
// gradients that are complete together belongs to one or two ranks, so its reduce-scatter could
// start only once the whole backward had ended (or would pad by N). Cut per unit, every unit's
// reduce-scatter starts the moment its last gradient is complete, and every rank's block of it
// arrives in place. PyTorch's FSDP1 cuts its flat parameters the same way.
struct UnitLayout {
  int key = 0;
  std::vector<size_t> params;    // indices into the inputs, ascending (parameter order)
  std::vector<int64_t> offsets;  // each parameter's first element in the unit's flat buffer
  int64_t numel = 0;             // the parameters' elements, without padding
  int64_t shardNumel = 0;        // the block each rank owns: ceil(numel / ranks)
  size_t elementSize = 4;

  int64_t paddedNumel(int ranks) const { return shardNumel * ranks; }
};

// The elements of one parameter a rank owns: [begin, end) of its flattened elements, found at
// `shardOffset` of the rank's block of unit `unit`.
struct OwnedRange {
  size_t param = 0;
  size_t unit = 0;
  int64_t begin = 0;
  int64_t end = 0;
  int64_t shardOffset = 0;
};

struct ShardLayout {
  int ranks = 1;
  // In launch order: the order in which their gradients are expected to be complete, the order
  // every rank issues their reduce-scatters.
  std::vector<UnitLayout> units;

  int64_t numel() const;    // every parameter's elements
  int64_t padding() const;  // elements added so that every unit divides into `ranks` blocks
  // Elements each rank owns, padding included: sum of shardNumel.
  int64_t shardNumel() const;
  // What rank `rank` owns of each parameter, in unit order and, within a unit, parameter order.
  // Parameters (or their parts) that fall into other ranks' blocks are not listed.
  std::vector<OwnedRange> ownedBy(int rank) const;
};

// `ranks` >= 1. Limits as assignBuckets' (a unit may exceed its limit by its last parameter).
ShardLayout planShards(const std::vector<ShardInput>& params, int ranks,
                       size_t firstUnitBytes = kDefaultFirstUnitBytes,
                       size_t unitBytes = kDefaultUnitBytes);

}  // namespace dtrain
