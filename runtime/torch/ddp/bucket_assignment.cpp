#include "dtrain/torch/detail/bucket_assignment.h"

#include <algorithm>
#include <map>

namespace dtrain {

namespace {

struct OpenBucket {
  std::vector<size_t> indices;
  size_t bytes = 0;
  size_t limit = 0;
};

}  // namespace

std::vector<std::vector<size_t>> assignBucketsInOrder(const std::vector<BucketInput>& inputs,
                                                      const std::vector<size_t>& order,
                                                      size_t firstBucketBytes, size_t bucketBytes) {
  std::vector<size_t> position(inputs.size(), 0);
  for (size_t k = 0; k < order.size(); ++k) position[order[k]] = k;
  std::vector<std::vector<size_t>> closed;
  std::map<int, OpenBucket> open;  // by group
  for (size_t i : order) {
    auto [it, fresh] = open.try_emplace(inputs[i].group);
    OpenBucket& bucket = it->second;
    if (fresh) bucket.limit = firstBucketBytes;
    bucket.indices.push_back(i);
    bucket.bytes += inputs[i].bytes;
    if (bucket.bytes >= bucket.limit) {
      closed.push_back(std::move(bucket.indices));
      bucket.indices.clear();
      bucket.bytes = 0;
      bucket.limit = bucketBytes;
    }
  }
  for (auto& [group, bucket] : open) {
    if (!bucket.indices.empty()) closed.push_back(std::move(bucket.indices));
  }
  // See Note [Bucket order]: a bucket whose first gradient is walked earlier becomes ready first.
  std::stable_sort(closed.begin(), closed.end(), [&](const auto& a, const auto& b) {
    return position[a.front()] < position[b.front()];
  });
  return closed;
}

std::vector<std::vector<size_t>> assignBuckets(const std::vector<BucketInput>& inputs,
                                               size_t firstBucketBytes, size_t bucketBytes) {
  std::vector<size_t> descending(inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k) descending[k] = inputs.size() - 1 - k;
  return assignBucketsInOrder(inputs, descending, firstBucketBytes, bucketBytes);
}

}  // namespace dtrain
