#pragma once
// Model-wide collectives of DistributedDataParallel outside backward: checking that every rank
// built the same model, and broadcasting parameters and buffers from one rank.

#include <vector>

#include <ATen/core/Tensor.h>

#include "ddp_reducer.h"
#include "dtrain/torch/process_group.h"

namespace dtrain::ddp {

// Throws dtrain::Error on every rank when the ranks' parameters or buffers differ in name, shape or
// dtype (or in number), naming the first entry that differs and which ranks have what. One
// 8-byte allgather when they agree.
void verifySameModel(ProcessGroup& group, const std::vector<NamedTensor>& params,
                     const std::vector<NamedTensor>& buffers);

// Broadcasts a fixed list of tensors with one collective per dtype: the tensors are packed into a
// flat buffer on the root and unpacked on the others. Built once, run as often as needed.
class CoalescedBroadcast {
 public:
  CoalescedBroadcast(ProcessGroup& group, const std::vector<at::Tensor>& tensors);
  void run(int root, comm::Millis timeout);
  bool empty() const { return groups_.empty(); }

 private:
  struct Group {
    std::vector<at::Tensor> tensors;
    at::Tensor flat;
  };
  ProcessGroup& group_;
  std::vector<Group> groups_;
};

}  // namespace dtrain::ddp
