#pragma once
// ProcessGroup: the training program's handle on the job: its rank, the world, and collectives on
// tensors. Created by dtrain::init() (dtrain/init.h) from the launcher's environment, or directly
// over a Communicator (tests, ranks as threads). A thin facade: it checks tensors, maps dtypes and
// hands raw buffers to the Communicator; non-contiguous tensors go through a contiguous copy.

#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "dtrain/comm.h"

namespace dtrain {

using comm::ReduceOp;

class ProcessGroup {
 public:
  ProcessGroup(std::shared_ptr<comm::Communicator> communicator, int localRank,
               c10::Device device);
  ~ProcessGroup();

  int rank() const { return communicator_->rank(); }
  int size() const { return communicator_->size(); }
  int localRank() const { return localRank_; }
  // cuda:LOCAL_RANK for NCCL, cpu for Gloo.
  c10::Device device() const { return device_; }
  comm::Communicator& communicator() { return *communicator_; }
  const std::shared_ptr<comm::Communicator>& communicatorPtr() const { return communicator_; }

  // In place on `tensor` (any layout; on this group's device type).
  void allreduce(at::Tensor& tensor, ReduceOp op = ReduceOp::Sum);
  std::shared_ptr<comm::Work> allreduceAsync(at::Tensor& tensor, ReduceOp op = ReduceOp::Sum);
  void broadcast(at::Tensor& tensor, int root = 0);
  std::shared_ptr<comm::Work> broadcastAsync(at::Tensor& tensor, int root = 0);
  // Returns size() tensors shaped like `input`, rank r's at index r.
  std::vector<at::Tensor> allgather(const at::Tensor& input);
  // `input` has size() * output.numel() elements; `output` receives op over all ranks' block rank().
  void reduceScatter(at::Tensor& output, const at::Tensor& input, ReduceOp op = ReduceOp::Sum);
  void barrier();
  // Idempotent; collectives after it fail.
  void shutdown();

 private:
  std::shared_ptr<comm::Communicator> communicator_;
  int localRank_;
  c10::Device device_;
};

// Maps a tensor's scalar type to the Communicator's; throws InvalidArgument for unsupported ones.
comm::DataType toDataType(const at::Tensor& tensor);

}  // namespace dtrain
