#include "dtrain/torch/detail/shard_layout.h"

#include <algorithm>

#include "dtrain/base/error.h"
#include "dtrain/torch/detail/bucket_assignment.h"
#include "dtrain/torch/detail/unit_layout.h"

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

namespace {

UnitLayout unitOf(const std::vector<ShardInput>& params, std::vector<size_t> indices, int ranks) {
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
  return unit;
}

}  // namespace

ShardLayout layoutUnits(const std::vector<ShardInput>& params,
                        const std::vector<std::vector<size_t>>& groups, int ranks) {
  DTRAIN_CHECK_ARG(ranks >= 1, "layoutUnits: {} ranks", ranks);
  std::vector<int> seen(params.size(), 0);
  ShardLayout layout;
  layout.ranks = ranks;
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<int> keys;  // in order of their first parameter in the group
    std::vector<std::vector<size_t>> byKey;
    for (size_t i : groups[g]) {
      DTRAIN_CHECK_ARG(i < params.size(), "layoutUnits: group {} names parameter {} of {}", g, i,
                       params.size());
      DTRAIN_CHECK_ARG(seen[i]++ == 0, "layoutUnits: parameter {} is in two groups", i);
      auto it = std::find(keys.begin(), keys.end(), params[i].key);
      if (it == keys.end()) {
        keys.push_back(params[i].key);
        byKey.emplace_back();
        it = keys.end() - 1;
      }
      byKey[static_cast<size_t>(it - keys.begin())].push_back(i);
    }
    for (auto& indices : byKey) layout.units.push_back(unitOf(params, std::move(indices), ranks));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    DTRAIN_CHECK_ARG(seen[i] == 1, "layoutUnits: parameter {} is in no group", i);
  }
  return layout;
}

ShardLayout planShards(const std::vector<ShardInput>& params, int ranks, size_t firstUnitBytes,
                       size_t unitBytes) {
  DTRAIN_CHECK_ARG(ranks >= 1, "planShards: {} ranks", ranks);
  std::vector<BucketInput> inputs;
  for (const auto& p : params) {
    DTRAIN_CHECK_ARG(p.numel >= 0 && p.elementSize > 0,
                     "planShards: a parameter of {} elements "
                     "of {} bytes",
                     p.numel, p.elementSize);
    inputs.push_back({static_cast<size_t>(p.numel) * p.elementSize, p.key});
  }
  ShardLayout layout;
  layout.ranks = ranks;
  for (auto& indices : assignBuckets(inputs, firstUnitBytes, unitBytes)) {
    layout.units.push_back(unitOf(params, std::move(indices), ranks));
  }
  return layout;
}

}  // namespace dtrain
