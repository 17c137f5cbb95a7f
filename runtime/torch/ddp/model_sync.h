#pragma once
// Model-wide collectives of DistributedDataParallel outside backward: checking that every rank
// built the same model, and broadcasting parameters and buffers from one rank.

#include <vector>

#include <ATen/core/Tensor.h>

#include "dtrain/torch/process_group.h"
#include "reducer.h"

namespace dtrain::ddp {

// Throws dtrain::Error on every rank when the ranks' parameters or buffers differ in name, shape or
// dtype (or in number), naming the first entry that differs and which ranks have what. One
// 8-byte allgather when they agree.
void verifySameModel(ProcessGroup& group, const std::vector<NamedTensor>& params,
                     const std::vector<NamedTensor>& buffers);

// What the one-time broadcast of a model's state packs at once: c10d's DDP syncs module states
// in buckets of 250 MiB for the same reason -- a model as large as the memory left cannot be
// copied whole into one more buffer.
constexpr size_t kStateBroadcastBucketBytes = size_t{32} << 20;

// Broadcasts a fixed list of tensors: packed into flat buffers per dtype on the root, unpacked on
// the others. Built once, run as often as needed.
// - Kept (`bucketBytes` 0, for what is broadcast every step): one flat buffer per dtype, allocated
//   once, the collectives of every dtype in flight together.
// - Bucketed: runs of tensors of at most `bucketBytes`, one after another, each packed into a
//   buffer that lives only through its collective, so the memory beside the tensors is one
//   bucket; a contiguous tensor of a bucket of its own is broadcast in place, not copied.
class CoalescedBroadcast {
 public:
  CoalescedBroadcast(ProcessGroup& group, const std::vector<at::Tensor>& tensors,
                     size_t bucketBytes = 0);
  void run(int root, comm::Millis timeout);
  bool empty() const { return groups_.empty(); }

 private:
  struct Group {
    std::vector<at::Tensor> tensors;
    int64_t numel = 0;
    at::Tensor flat;  // kept only
  };
  void runBucketed(int root, comm::Millis timeout);

  ProcessGroup& group_;
  const bool kept_;
  std::vector<Group> groups_;
};

}  // namespace dtrain::ddp
