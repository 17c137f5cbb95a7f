#include "dtrain/process_group.h"

#include <ATen/ATen.h>

#include "dtrain/error.h"

namespace dtrain {

namespace {

// A contiguous tensor the communicator can work on in place, and how to put results back.
struct Staged {
  at::Tensor original;
  at::Tensor contiguous;
  bool copied = false;

  explicit Staged(at::Tensor& t) : original(t) {
    if (t.is_contiguous()) {
      contiguous = t;
    } else {
      contiguous = t.contiguous();
      copied = true;
    }
  }
  void writeBack() {
    if (copied) original.copy_(contiguous);
  }
};

// Wraps a Work so that wait() also copies a non-contiguous tensor's result back.
class WriteBackWork : public comm::Work {
 public:
  WriteBackWork(std::shared_ptr<comm::Work> inner, Staged staged)
      : inner_(std::move(inner)), staged_(std::move(staged)) {}
  bool isCompleted() override { return inner_->isCompleted(); }
  void wait(comm::Millis timeout) override {
    inner_->wait(timeout);
    if (!done_) {
      staged_.writeBack();
      done_ = true;
    }
  }

 private:
  std::shared_ptr<comm::Work> inner_;
  Staged staged_;
  bool done_ = false;
};

std::shared_ptr<comm::Work> withWriteBack(std::shared_ptr<comm::Work> work, Staged staged) {
  if (!staged.copied) return work;
  return std::make_shared<WriteBackWork>(std::move(work), std::move(staged));
}

}  // namespace

comm::DataType toDataType(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat: return comm::DataType::Float32;
    case at::kDouble: return comm::DataType::Float64;
    case at::kHalf: return comm::DataType::Float16;
    case at::kBFloat16: return comm::DataType::BFloat16;
    case at::kInt: return comm::DataType::Int32;
    case at::kLong: return comm::DataType::Int64;
    case at::kByte: return comm::DataType::UInt8;
    case at::kChar: return comm::DataType::Int8;
    case at::kBool: return comm::DataType::UInt8;
    default:
      DTRAIN_THROW(InvalidArgument, "collectives do not support tensors of type {}",
                   c10::toString(tensor.scalar_type()));
  }
}

ProcessGroup::ProcessGroup(std::shared_ptr<comm::Communicator> communicator, int localRank,
                           c10::Device device)
    : communicator_(std::move(communicator)), localRank_(localRank), device_(device) {
  DTRAIN_CHECK_ARG(communicator_ != nullptr, "ProcessGroup needs a communicator");
}

ProcessGroup::~ProcessGroup() = default;

void ProcessGroup::allreduce(at::Tensor& tensor, ReduceOp op) { allreduceAsync(tensor, op)->wait(); }

std::shared_ptr<comm::Work> ProcessGroup::allreduceAsync(at::Tensor& tensor, ReduceOp op) {
  Staged staged(tensor);
  auto work = communicator_->allreduceAsync(staged.contiguous.data_ptr(),
                                            static_cast<size_t>(staged.contiguous.numel()),
                                            toDataType(tensor), op);
  return withWriteBack(std::move(work), std::move(staged));
}

void ProcessGroup::broadcast(at::Tensor& tensor, int root) { broadcastAsync(tensor, root)->wait(); }

std::shared_ptr<comm::Work> ProcessGroup::broadcastAsync(at::Tensor& tensor, int root) {
  DTRAIN_CHECK_ARG(root >= 0 && root < size(), "broadcast root {} is outside 0..{}", root,
                   size() - 1);
  Staged staged(tensor);
  auto work = communicator_->broadcastAsync(staged.contiguous.data_ptr(),
                                            static_cast<size_t>(staged.contiguous.numel()),
                                            toDataType(tensor), root);
  return withWriteBack(std::move(work), std::move(staged));
}

std::vector<at::Tensor> ProcessGroup::allgather(const at::Tensor& input) {
  at::Tensor in = input.contiguous();
  std::vector<int64_t> shape{size()};
  shape.insert(shape.end(), in.sizes().begin(), in.sizes().end());
  at::Tensor out = at::empty(shape, in.options());
  communicator_->allgather(in.data_ptr(), out.data_ptr(), static_cast<size_t>(in.numel()),
                           toDataType(in));
  return out.unbind(0);
}

void ProcessGroup::reduceScatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  DTRAIN_CHECK_ARG(input.numel() == output.numel() * size(),
                   "reduceScatter: input has {} elements, expected size() * output = {} * {}",
                   input.numel(), size(), output.numel());
  DTRAIN_CHECK_ARG(input.scalar_type() == output.scalar_type(),
                   "reduceScatter: input is {}, output is {}", c10::toString(input.scalar_type()),
                   c10::toString(output.scalar_type()));
  at::Tensor in = input.contiguous();
  Staged staged(output);
  communicator_->reduceScatter(in.data_ptr(), staged.contiguous.data_ptr(),
                               static_cast<size_t>(output.numel()), toDataType(output), op);
  staged.writeBack();
}

void ProcessGroup::barrier() { communicator_->barrier(); }

void ProcessGroup::shutdown() { communicator_->shutdown(); }

}  // namespace dtrain
