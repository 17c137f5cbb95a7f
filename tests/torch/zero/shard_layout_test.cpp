// planShards(): units as DDP's buckets are formed, each padded to a multiple of the world size,
// and every element of every parameter owned by exactly one rank (Note [Shard layout]).
#include <gtest/gtest.h>

#include <map>

#include "dtrain/base/error.h"
#include "dtrain/torch/detail/shard_layout.h"

namespace dtrain::shard_layout_test {
namespace {

std::vector<ShardInput> floats(std::vector<int64_t> numels, std::vector<int> keys = {}) {
  std::vector<ShardInput> out;
  for (size_t i = 0; i < numels.size(); ++i) {
    out.push_back({numels[i], 4, keys.empty() ? 0 : keys[i]});
  }
  return out;
}

struct Case {
  const char* name;
  std::vector<ShardInput> inputs;
  int ranks;
  size_t first;
  size_t cap;
  std::vector<std::vector<size_t>> units;  // parameter indices, unit by unit
  std::vector<int64_t> shard;              // each unit's block
};

TEST(ShardLayout, UnitsAndBlocks) {
  const std::vector<Case> cases = {
      {"nothing", {}, 2, 16, 64, {}, {}},
      {"one parameter", floats({10}), 4, 16, 64, {{0}}, {3}},
      {"walks from the last registered, units in parameter order",
       floats({4, 4, 4, 4}),
       2,
       16,
       40,
       {{3}, {0, 1, 2}},
       {2, 6}},
      {"a parameter larger than the limit is a unit alone",
       floats({3, 100, 3}),
       3,
       12,
       40,
       {{2}, {1}, {0}},
       {1, 34, 1}},
      {"keys never share a unit",
       floats({5, 5, 5, 5}, {0, 1, 0, 1}),
       2,
       1000,
       1000,
       {{1, 3}, {0, 2}},
       {5, 5}},
      {"one rank owns everything", floats({7, 9}), 1, 1000, 1000, {{0, 1}}, {16}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    ShardLayout layout = planShards(c.inputs, c.ranks, c.first, c.cap);
    ASSERT_EQ(layout.units.size(), c.units.size());
    for (size_t k = 0; k < c.units.size(); ++k) {
      EXPECT_EQ(layout.units[k].params, c.units[k]) << "unit " << k;
      EXPECT_EQ(layout.units[k].shardNumel, c.shard[k]) << "unit " << k;
      int64_t offset = 0;
      for (size_t j = 0; j < layout.units[k].params.size(); ++j) {
        EXPECT_EQ(layout.units[k].offsets[j], offset);
        offset += c.inputs[layout.units[k].params[j]].numel;
      }
      EXPECT_EQ(layout.units[k].numel, offset);
    }
  }
}

TEST(ShardLayout, PaddingIsReportedAndBelowRanksPerUnit) {
  ShardLayout layout = planShards(floats({7, 13, 91, 13, 169, 13, 65, 5}), 4, 64, 256);
  EXPECT_EQ(layout.numel(), 376);
  int64_t padding = 0;
  for (const auto& u : layout.units) {
    EXPECT_LT(u.paddedNumel(4) - u.numel, 4);
    padding += u.paddedNumel(4) - u.numel;
  }
  EXPECT_EQ(layout.padding(), padding);
  EXPECT_EQ(layout.shardNumel() * 4, layout.numel() + layout.padding());
}

// Every element of every parameter belongs to exactly one rank's record; the records of one rank
// lie in its blocks without overlapping.
TEST(ShardLayout, RanksOwnEveryElementExactlyOnce) {
  const auto inputs = floats({7, 13, 91, 13, 169, 13, 65, 5, 1, 0, 333},
                             {0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1});
  for (int ranks : {1, 2, 3, 4, 7}) {
    SCOPED_TRACE(ranks);
    ShardLayout layout = planShards(inputs, ranks, 64, 400);
    std::vector<std::vector<int>> owner(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i)
      owner[i].assign(static_cast<size_t>(inputs[i].numel), -1);
    for (int r = 0; r < ranks; ++r) {
      std::map<size_t, std::vector<bool>> used;  // per unit: the block's elements
      for (const auto& range : layout.ownedBy(r)) {
        auto& block = used[range.unit];
        block.resize(static_cast<size_t>(layout.units[range.unit].shardNumel));
        for (int64_t e = range.begin; e < range.end; ++e) {
          ASSERT_EQ(owner[range.param][static_cast<size_t>(e)], -1) << "element owned twice";
          owner[range.param][static_cast<size_t>(e)] = r;
          const auto at = static_cast<size_t>(range.shardOffset + e - range.begin);
          ASSERT_LT(at, block.size());
          ASSERT_FALSE(block[at]) << "two records overlap in the block";
          block[at] = true;
        }
      }
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      for (int who : owner[i]) ASSERT_GE(who, 0) << "an element nobody owns, parameter " << i;
    }
  }
}

TEST(ShardLayout, RefusesNonsense) {
  EXPECT_THROW(planShards(floats({1}), 0), InvalidArgument);
  EXPECT_THROW(planShards(floats({-1}), 2), InvalidArgument);
}

}  // namespace
}  // namespace dtrain::shard_layout_test
