#include "dtrain/torch/shard_layout.h"

#include <algorithm>

#include "dtrain/base/error.h"
#include "dtrain/torch/bucket_assignment.h"

namespace dtrain {

int64_t ShardLayout::numel() const {
  int64_t total = 0;
  for (const auto& u : units) total += u.numel;
  return total;
}

int64_t ShardLayout::padding() const {
  int64_t total = 0;
  for (const auto& u : units) total += u.paddedNumel(ranks) - u.numel;
  return total;
}

int64_t ShardLayout::shardNumel() const {
  int64_t total = 0;
  for (const auto& u : units) total += u.shardNumel;
  return total;
}

std::vector<OwnedRange> ShardLayout::ownedBy(int rank) const {
  std::vector<OwnedRange> out;
  for (size_t k = 0; k < units.size(); ++k) {
    const UnitLayout& u = units[k];
    const int64_t blockBegin = u.shardNumel * rank;
    const int64_t blockEnd = blockBegin + u.shardNumel;
    for (size_t j = 0; j < u.params.size(); ++j) {
      const int64_t first = u.offsets[j];
      const int64_t last = j + 1 < u.params.size() ? u.offsets[j + 1] : u.numel;
      const int64_t begin = std::max(first, blockBegin);
      const int64_t end = std::min(last, blockEnd);
      if (begin >= end) continue;
      out.push_back({u.params[j], k, begin - first, end - first, begin - blockBegin});
    }
  }
  return out;
}

ShardLayout planShards(const std::vector<ShardInput>& params, int ranks, size_t firstUnitBytes,
                       size_t unitBytes) {
  DTRAIN_CHECK_ARG(ranks >= 1, "planShards: {} ranks", ranks);
  std::vector<BucketInput> inputs;
  for (const auto& p : params) {
    DTRAIN_CHECK_ARG(p.numel >= 0 && p.elementSize > 0, "planShards: a parameter of {} elements "
                     "of {} bytes", p.numel, p.elementSize);
    inputs.push_back({static_cast<size_t>(p.numel) * p.elementSize, p.key});
  }
  ShardLayout layout;
  layout.ranks = ranks;
  for (auto& indices : assignBuckets(inputs, firstUnitBytes, unitBytes)) {
    std::sort(indices.begin(), indices.end());
    UnitLayout unit;
    unit.key = params[indices.front()].key;
    unit.elementSize = params[indices.front()].elementSize;
    for (size_t i : indices) {
      unit.params.push_back(i);
      unit.offsets.push_back(unit.numel);
      unit.numel += params[i].numel;
    }
    unit.shardNumel = (unit.numel + ranks - 1) / ranks;
    layout.units.push_back(std::move(unit));
  }
  return layout;
}

}  // namespace dtrain
