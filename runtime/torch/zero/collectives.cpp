#include "collectives.h"

#include <cmath>
#include <limits>

#include <ATen/ATen.h>

#include "../torch_compat.h"
#include "dtrain/base/error.h"
#include "dtrain/torch/process_group.h"

namespace dtrain::zero {

bool averagedByCollective(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kDouble;
}

std::shared_ptr<comm::Work> reduceScatterUnit(comm::Communicator& comm, ShardUnit& unit,
                                              const comm::CallOptions& call,
                                              const at::Tensor& out) {
  const bool avg = averagedByCollective(unit.gradType());
  void* to = out.defined() ? out.data_ptr() : unit.reduced().data_ptr();
  return comm.reduceScatterAsync(
      unit.fullGrads().data_ptr(), to, static_cast<size_t>(unit.shardNumel()),
      toDataType(unit.fullGrads()), avg ? comm::ReduceOp::Avg : comm::ReduceOp::Sum, call);
}

std::shared_ptr<comm::Work> allgatherUnit(comm::Communicator& comm, ShardUnit& unit,
                                          const comm::CallOptions& call) {
  return comm.allgatherAsync(unit.sendBlock().data_ptr(), unit.fullParams().data_ptr(),
                             static_cast<size_t>(unit.shardNumel()), toDataType(unit.fullParams()),
                             call);
}

double globalNorm(comm::Communicator& comm, const std::vector<at::Tensor>& grads, double normType,
                  const c10::Device& device, comm::Millis timeout) {
  const bool infinity = std::isinf(normType);
  at::Tensor total = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device));
  for (const auto& g : grads) {
    if (!g.defined() || g.numel() == 0) continue;
    // Per tensor first, as torch::nn::utils::clip_grad_norm_ does, without a float64 copy.
    at::Tensor norm = at::linalg_vector_norm(g, normType, c10::nullopt, false, at::kDouble);
    if (infinity) {
      total = at::maximum(total, norm.reshape({1}).to(device));
    } else {
      total.add_(norm.pow(normType).to(device));  // offloaded shards' norms are on the host
    }
  }
  comm::CallOptions call;
  call.timeout = timeout;
  call.stream = compat::currentStream(device);
  comm.allreduce(total.data_ptr(), 1, comm::DataType::Float64,
                 infinity ? comm::ReduceOp::Max : comm::ReduceOp::Sum, call);
  const double value = total.item<double>();
  return infinity ? value : std::pow(value, 1.0 / normType);
}

std::shared_ptr<comm::Buffer> GradientPool::takeFree(size_t bytes) {
  size_t best = free_.size();
  for (size_t k = 0; k < free_.size(); ++k) {
    const size_t have = free_[k].bucket->bytes();
    if (have >= bytes && (best == free_.size() || have < free_[best].bucket->bytes())) best = k;
  }
  if (best == free_.size()) return nullptr;
  auto bucket = std::move(free_[best].bucket);
  free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
  ++leased_;
  leasedBytes_ += bucket->bytes();
  leasedPeak_ = std::max(leasedPeak_, leasedBytes_);
  return bucket;
}

std::shared_ptr<comm::Buffer> GradientPool::allocate(size_t bytes) {
  // See Note [Communication buffers of a step].
  for (auto it = free_.begin(); it != free_.end();) {
    if (it->bucket->bytes() < bytes) {
      capacity_ -= it->bucket->bytes();
      it = free_.erase(it);
    } else {
      ++it;
    }
  }
  auto bucket = comm_.allocate(std::max<size_t>(1, bytes));
  capacity_ += bucket->bytes();
  ++leased_;
  leasedBytes_ += bucket->bytes();
  leasedPeak_ = std::max(leasedPeak_, leasedBytes_);
  return bucket;
}

void GradientPool::give(std::shared_ptr<comm::Buffer> bucket) {
  DTRAIN_CHECK(bucket != nullptr && leased_ > 0, "GradientPool: a bucket given back twice");
  --leased_;
  leasedBytes_ -= bucket->bytes();
  if (keepFree_) {
    free_.push_back({std::move(bucket), generation_});
  } else {
    capacity_ -= bucket->bytes();  // to the communicator's cache, when the last view goes
  }
}

void GradientPool::trim() {
  for (auto it = free_.begin(); it != free_.end();) {
    if (it->generation < generation_) {
      capacity_ -= it->bucket->bytes();
      it = free_.erase(it);
    } else {
      ++it;
    }
  }
  ++generation_;
  lastLeasedPeak_ = leasedPeak_;
  leasedPeak_ = leasedBytes_;
}

}  // namespace dtrain::zero
