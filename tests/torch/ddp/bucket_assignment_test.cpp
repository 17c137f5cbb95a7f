#include <gtest/gtest.h>

#include "dtrain/torch/detail/bucket_assignment.h"

namespace dtrain::bucket_assignment_test {
namespace {

using Buckets = std::vector<std::vector<size_t>>;

struct Case {
  const char* name;
  std::vector<BucketInput> inputs;
  size_t first;
  size_t cap;
  Buckets expected;
};

constexpr size_t KiB = 1024;
constexpr size_t MiB = 1024 * 1024;

std::vector<BucketInput> sized(std::vector<size_t> bytes) {
  std::vector<BucketInput> out;
  for (size_t b : bytes) out.push_back({b, 0});
  return out;
}

void checkTable() {
  const std::vector<Case> cases = {
      {"nothing", {}, 4, 10, {}},
      {"one tensor", sized({3}), 4, 10, {{0}}},
      {"walks from the last registered; first bucket small",
       sized({4, 4, 4, 4}),
       4,
       10,
       {{3}, {2, 1, 0}}},
      {"a bucket closes once it reaches its limit",
       sized({5, 5, 5, 5, 5}),
       4,
       10,
       {{4}, {3, 2}, {1, 0}}},
      {"a bucket may exceed its limit by its last tensor", sized({2, 2, 20}), 4, 10, {{2}, {1, 0}}},
      {"defaults: 1 MiB first, then 25 MiB",
       sized({30 * MiB, 1 * KiB, 512 * KiB, 600 * KiB}),
       kDefaultFirstBucketBytes,
       kDefaultBucketBytes,
       {{3, 2}, {1, 0}}},
      {"defaults: small model in one bucket",
       sized({100, 200, 300}),
       kDefaultFirstBucketBytes,
       kDefaultBucketBytes,
       {{2, 1, 0}}},
      {"zero limits: one tensor per bucket", sized({1, 2, 3}), 0, 0, {{2}, {1}, {0}}},
      {"empty tensors share a bucket", sized({0, 0}), 4, 10, {{1, 0}}},
      {"groups never share a bucket; each starts with the small limit",
       {{4, 0}, {4, 1}, {4, 0}, {4, 1}},
       4,
       10,
       {{3}, {2}, {1}, {0}}},
      {"open buckets of several groups come out in walk order",
       {{1, 0}, {1, 1}, {1, 0}, {1, 1}, {1, 2}},
       100,
       100,
       {{4}, {3, 1}, {2, 0}}},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(assignBuckets(c.inputs, c.first, c.cap), c.expected) << c.name;
  }
}

void checkEveryIndexExactlyOnce() {
  std::vector<BucketInput> inputs;
  for (size_t i = 0; i < 50; ++i) inputs.push_back({(i * 37) % 11 * KiB, static_cast<int>(i % 3)});
  auto buckets = assignBuckets(inputs, 4 * KiB, 16 * KiB);
  std::vector<int> seen(inputs.size(), 0);
  for (const auto& b : buckets) {
    for (size_t i : b) {
      ++seen[i];
      EXPECT_EQ(inputs[i].group, inputs[b.front()].group);
    }
  }
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << "index " << i;
}

TEST(BucketAssignment, TableAndInvariants) {
  checkTable();
  checkEveryIndexExactlyOnce();
}

TEST(BucketAssignment, InTheOrderGradientsArrived) {
  struct OrderCase {
    const char* name;
    std::vector<BucketInput> inputs;
    std::vector<size_t> order;
    Buckets expected;
  };
  const std::vector<OrderCase> cases = {
      {"registration order reversed: the same as assignBuckets",
       sized({4, 4, 4, 4}),
       {3, 2, 1, 0},
       {{3}, {2, 1, 0}}},
      {"used in registration order: the first registered arrive last",
       sized({4, 4, 4, 4}),
       {0, 1, 2, 3},
       {{0}, {1, 2, 3}}},
      {"any permutation; buckets in the order their first gradient arrives",
       sized({5, 5, 5, 5, 5}),
       {2, 4, 0, 3, 1},
       {{2}, {4, 0}, {3, 1}}},
      {"groups keep apart", {{4, 0}, {4, 1}, {4, 0}, {4, 1}}, {1, 0, 3, 2}, {{1}, {0}, {3}, {2}}},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(assignBucketsInOrder(c.inputs, c.order, 4, 10), c.expected) << c.name;
  }
}

}  // namespace
}  // namespace dtrain::bucket_assignment_test
