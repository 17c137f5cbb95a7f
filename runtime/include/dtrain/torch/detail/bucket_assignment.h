#pragma once
// Not API (detail/): an internal that dtrain/torch/ddp_options.h (its default bucket sizes) needs.
// It may change in any release; programs include <dtrain/dtrain.h>.
// Bucket assignment for DistributedDataParallel: which gradients share one allreduce. A pure
// function of the gradients' sizes and groups, so it is tested on tables rather than on models.
//
// See Note [Bucket order].

#include <cstddef>
#include <vector>

namespace dtrain {

// Gradients of the last-registered parameters, the first to be ready in backward, go into a small
// first bucket so that communication starts early; the rest go into large buckets, few enough that
// per-collective latency does not matter. PyTorch's DDP uses the same two sizes.
constexpr size_t kDefaultFirstBucketBytes = size_t{1} << 20;
constexpr size_t kDefaultBucketBytes = size_t{25} << 20;

// One gradient as bucket assignment sees it.
struct BucketInput {
  size_t bytes = 0;
  // Gradients of different groups (dtype, device) never share a bucket: a bucket is one flat
  // buffer of one dtype on one device.
  int group = 0;
};

// Note [Bucket order]
// Autograd produces gradients roughly in reverse order of the forward pass, and modules register
// their parameters roughly in forward order. So parameters are walked from the last registered to
// the first; each group keeps one open bucket, which is closed once it holds at least its limit
// (firstBucketBytes for a group's first bucket, bucketBytes afterwards; a bucket may exceed its
// limit by its last gradient). Buckets are returned in the order their first gradient is walked,
// which is the order in which they are expected to become ready and the order in which every rank
// launches their allreduces (collectives must be issued in the same order on every rank).
//
// Returns the buckets as lists of indices into `inputs`, each list in walk order (descending).
std::vector<std::vector<size_t>> assignBuckets(const std::vector<BucketInput>& inputs,
                                               size_t firstBucketBytes = kDefaultFirstBucketBytes,
                                               size_t bucketBytes = kDefaultBucketBytes);

// Note [Bucket rebuild]
// The same walk over the gradients in the order `order` gives (a permutation of the indices of
// `inputs`), buckets returned in the order their first gradient is walked. assignBuckets() is this
// with the indices descending. After its first synchronised backward, DDP rebuilds its buckets
// with `order` = the order in which the gradients actually arrived, as PyTorch's Reducer does: a
// model that registers its layers in another order than it uses them then still launches its
// first, small bucket as soon as backward starts. The order is rank 0's, broadcast to all, so every
// rank buckets and launches alike.
std::vector<std::vector<size_t>> assignBucketsInOrder(const std::vector<BucketInput>& inputs,
                                                      const std::vector<size_t>& order,
                                                      size_t firstBucketBytes, size_t bucketBytes);

}  // namespace dtrain
