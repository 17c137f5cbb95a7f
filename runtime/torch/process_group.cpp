#include "dtrain/torch/process_group.h"

#include <ATen/ATen.h>

#include "dtrain/base/error.h"
#include "dtrain/config.h"
#include "torch_compat.h"

#if DTRAIN_WITH_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

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

// Wraps a Work: keeps the tensors alive while the collective may still use them, and copies a
// non-contiguous tensor's result back once it has finished. On CUDA, waiting orders torch's
// current stream at wait time after the collective (as c10d does), so the write-back and
// whatever the caller queues next on that stream see the result.
class TensorWork : public comm::Work {
 public:
  TensorWork(std::shared_ptr<comm::Work> inner, Staged staged)
      : inner_(std::move(inner)), staged_(std::move(staged)) {}
  bool isCompleted() override { return inner_->isCompleted(); }
  void wait(comm::Millis timeout) override {
    waitOnStream(compat::currentStream(staged_.original.device()), timeout);
  }
  void waitOnStream(void* stream, comm::Millis timeout) override {
    inner_->waitOnStream(stream, timeout);
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

std::vector<int64_t> shapeOf(const at::Tensor& t) {
  return std::vector<int64_t>(t.sizes().begin(), t.sizes().end());
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

ReduceOp reduceOpFor(at::ScalarType type, ReduceOp op) {
  if (type != at::kBool) return op;
  DTRAIN_CHECK_ARG(op != ReduceOp::Avg,
                   "the average of a bool tensor is not a bool: use Sum "
                   "(logical or), Min (and) or Max (or), or convert the tensor first");
  return op == ReduceOp::Sum ? ReduceOp::Max : op;
}

void checkTensorDevice(const c10::Device& tensor, const c10::Device& group, const char* backend,
                       const char* what) {
  const bool sameType = tensor.type() == group.type();
  const bool sameIndex = !group.has_index() || tensor.index() == group.index();
  DTRAIN_CHECK_ARG(sameType && sameIndex,
                   "{}: the tensor is on {}, but this {} process group works on {} tensors{}", what,
                   tensor.str(), backend, group.str(),
                   sameType ? " (each rank uses one device: move the tensor there, or create the "
                              "tensor on group->device())"
                            : "");
}

ProcessGroup::ProcessGroup(std::shared_ptr<comm::Communicator> communicator, int localRank,
                           c10::Device device)
    : communicator_(std::move(communicator)), localRank_(localRank), device_(device) {
  DTRAIN_CHECK_ARG(communicator_ != nullptr, "ProcessGroup needs a communicator");
}

ProcessGroup::ProcessGroup(comm::World world, c10::Device device)
    : communicator_(world.communicator),
      localRank_(world.env.localRank),
      device_(device),
      world_(std::make_unique<comm::World>(std::move(world))) {
  DTRAIN_CHECK_ARG(communicator_ != nullptr, "ProcessGroup needs a communicator");
}

ProcessGroup::~ProcessGroup() {
  // A group built over someone else's communicator leaves it alone; one built by init() owns
  // its world and closes it.
  if (!world_) return;
  try {
    shutdown();
  } catch (...) {
    // Destructors do not throw; shutdown() errors were logged by the communicator.
  }
}

void ProcessGroup::broadcastHost(at::Tensor& host, int root) {
  DTRAIN_CHECK_ARG(host.device().is_cpu(), "broadcastHost: a {} tensor, expected a host (cpu) one",
                   host.device().str());
  if (device_.is_cpu()) {
    broadcast(host, root);
    return;
  }
  at::Tensor onDevice = host.to(device_);
  broadcast(onDevice, root);
  host.copy_(onDevice);
}

std::vector<at::Tensor> ProcessGroup::allgatherHost(const at::Tensor& host) {
  DTRAIN_CHECK_ARG(host.device().is_cpu(), "allgatherHost: a {} tensor, expected a host (cpu) one",
                   host.device().str());
  std::vector<at::Tensor> all = allgather(host.to(device_));
  for (auto& t : all) t = t.cpu();
  return all;
}

bool ProcessGroup::reform() {
  if (!world_ || !comm::reformWorld(*world_)) return false;
  communicator_ = world_->communicator;
  return true;
}

void ProcessGroup::admit() {
  if (!world_ || !world_->awaitingAdmission) return;
  comm::admitWorld(*world_);
  communicator_ = world_->communicator;
}

std::shared_ptr<store::Store> ProcessGroup::store() const {
  return world_ ? world_->store : nullptr;
}

void ProcessGroup::checkTensor(const at::Tensor& tensor, const char* what) const {
  DTRAIN_CHECK_ARG(tensor.defined(), "{}: undefined tensor", what);
  checkTensorDevice(tensor.device(), device_, communicator_->backendName(), what);
  DTRAIN_CHECK_ARG(!tensor.is_sparse(), "{}: sparse tensors are not supported", what);
}

comm::CallOptions ProcessGroup::callOptions(const at::Tensor& tensor, bool synchronous) const {
  comm::CallOptions o;
  o.shape = shapeOf(tensor);
  o.synchronous = synchronous;
#if DTRAIN_WITH_TORCH_CUDA
  if (tensor.is_cuda()) {
    o.stream = c10::cuda::getCurrentCUDAStream(tensor.device().index()).stream();
  }
#endif
  return o;
}

void ProcessGroup::allreduce(at::Tensor& tensor, ReduceOp op) {
  startAllreduce(tensor, op, /*synchronous=*/true)->wait();
}

std::shared_ptr<comm::Work> ProcessGroup::allreduceAsync(at::Tensor& tensor, ReduceOp op) {
  return startAllreduce(tensor, op, /*synchronous=*/false);
}

std::shared_ptr<comm::Work> ProcessGroup::startAllreduce(at::Tensor& tensor, ReduceOp op,
                                                         bool synchronous) {
  checkTensor(tensor, "allreduce");
  Staged staged(tensor);
  auto work = communicator_->allreduceAsync(
      staged.contiguous.data_ptr(), static_cast<size_t>(staged.contiguous.numel()),
      toDataType(tensor), reduceOpFor(tensor.scalar_type(), op), callOptions(tensor, synchronous));
  return std::make_shared<TensorWork>(std::move(work), std::move(staged));
}

void ProcessGroup::broadcast(at::Tensor& tensor, int root) {
  startBroadcast(tensor, root, /*synchronous=*/true)->wait();
}

std::shared_ptr<comm::Work> ProcessGroup::broadcastAsync(at::Tensor& tensor, int root) {
  return startBroadcast(tensor, root, /*synchronous=*/false);
}

std::shared_ptr<comm::Work> ProcessGroup::startBroadcast(at::Tensor& tensor, int root,
                                                         bool synchronous) {
  checkTensor(tensor, "broadcast");
  DTRAIN_CHECK_ARG(root >= 0 && root < size(), "broadcast root {} is outside 0..{}", root,
                   size() - 1);
  Staged staged(tensor);
  auto work = communicator_->broadcastAsync(
      staged.contiguous.data_ptr(), static_cast<size_t>(staged.contiguous.numel()),
      toDataType(tensor), root, callOptions(tensor, synchronous));
  return std::make_shared<TensorWork>(std::move(work), std::move(staged));
}

std::vector<at::Tensor> ProcessGroup::allgather(const at::Tensor& input) {
  checkTensor(input, "allgather");
  at::Tensor in = input.contiguous();
  std::vector<int64_t> shape{size()};
  shape.insert(shape.end(), in.sizes().begin(), in.sizes().end());
  at::Tensor out = at::empty(shape, in.options());
  communicator_->allgather(in.data_ptr(), out.data_ptr(), static_cast<size_t>(in.numel()),
                           toDataType(in), callOptions(in, /*synchronous=*/true));
  return out.unbind(0);
}

void ProcessGroup::reduceScatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  checkTensor(output, "reduceScatter");
  checkTensor(input, "reduceScatter");
  DTRAIN_CHECK_ARG(input.numel() == output.numel() * size(),
                   "reduceScatter: input has {} elements, expected size() * output = {} * {}",
                   input.numel(), size(), output.numel());
  DTRAIN_CHECK_ARG(input.scalar_type() == output.scalar_type(),
                   "reduceScatter: input is {}, output is {}", c10::toString(input.scalar_type()),
                   c10::toString(output.scalar_type()));
  at::Tensor in = input.contiguous();
  Staged staged(output);
  communicator_->reduceScatter(in.data_ptr(), staged.contiguous.data_ptr(),
                               static_cast<size_t>(output.numel()), toDataType(output),
                               reduceOpFor(output.scalar_type(), op),
                               callOptions(output, /*synchronous=*/true));
  staged.writeBack();
}

void ProcessGroup::barrier() { communicator_->barrier(); }

std::shared_ptr<ProcessGroup> ProcessGroup::newGroup(const std::vector<int>& ranks,
                                                     const comm::GroupOptions& options) {
  auto group = communicator_->newGroup(ranks, options);
  return group ? std::make_shared<ProcessGroup>(std::move(group), localRank_, device_) : nullptr;
}

std::shared_ptr<ProcessGroup> ProcessGroup::split(int color, int key,
                                                  const comm::GroupOptions& options) {
  auto group = communicator_->split(color, key, options);
  return group ? std::make_shared<ProcessGroup>(std::move(group), localRank_, device_) : nullptr;
}

void ProcessGroup::shutdown() {
  if (world_) {
    comm::shutdownWorld(*world_);
  } else {
    communicator_->shutdown();
  }
}

}  // namespace dtrain
