#include "shard_unit.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/optim/optimizer.h>

#include "../ddp/buffer_tensor.h"
#include "dtrain/base/error.h"

namespace dtrain::zero {

namespace {

size_t storageBytes(const at::Tensor& t) { return t.defined() ? t.storage().nbytes() : 0; }

// A storage's data pointer over `buffer`, keeping it alive until the storage lets go of it.
at::DataPtr dataPtrOver(std::shared_ptr<comm::Buffer> buffer, const c10::Device& device) {
  void* data = buffer->data();
  auto* keep = new std::shared_ptr<comm::Buffer>(std::move(buffer));
  return at::DataPtr(
      data, keep, [](void* ctx) { delete static_cast<std::shared_ptr<comm::Buffer>*>(ctx); },
      device);
}

}  // namespace

ShardUnit::ShardUnit(size_t index, const UnitLayout& layout, std::vector<UnitParam> params,
                     int rank, int ranks, int stage, UnitDtypes types, comm::Communicator& comm,
                     const c10::Device& device, bool resharded, bool offload,
                     at::Tensor ownedAsBuilt, bool frozen)
    : index_(index),
      layout_(layout),
      params_(std::move(params)),
      rank_(rank),
      ranks_(ranks),
      stage_(stage),
      dtype_(types.param),
      givenType_(params_.front().param.scalar_type()),
      gradType_(types.grad),
      resharded_(resharded),
      frozen_(frozen),
      device_(device) {
  DTRAIN_CHECK(params_.size() == layout_.params.size(), "ShardUnit: {} parameters for a unit of {}",
               params_.size(), layout_.params.size());
  DTRAIN_CHECK(stage == 3 || !resharded, "ShardUnit: only stage 3 reshards parameters");
  DTRAIN_CHECK(!frozen || (resharded && types.param == givenType_),
               "ShardUnit: frozen parameters are sharded by resharded stage-3 units, unconverted");
  const at::ScalarType masterType = types.master;
  DTRAIN_CHECK(gradType_ == dtype_ || (stage != 1 && masterType != dtype_),
               "ShardUnit: gradients in {} for {} parameters need stage 2 or 3 and master weights",
               c10::toString(gradType_), c10::toString(dtype_));
  DTRAIN_CHECK(!converted() || (stage == 3 && resharded && masterType == givenType_),
               "ShardUnit: {} parameters held in {} need a resharded stage-3 unit with {} master "
               "weights",
               c10::toString(givenType_), c10::toString(dtype_), c10::toString(givenType_));
  at::NoGradGuard noGrad;
  DTRAIN_CHECK(!ownedAsBuilt.defined() ||
                   (stage == 3 && resharded && ownedAsBuilt.numel() == shardNumel()),
               "ShardUnit: a block as built of {} elements for a unit whose block has {}",
               ownedAsBuilt.numel(), shardNumel());
  // A converted unit's master starts from the values as given, not from their rounding.
  at::Tensor given;
  if (converted()) given = ownedAsBuilt.defined() ? ownedAsBuilt : givenBlock(device);
  if (stage == 3) {
    bindOverStorage(comm, device, std::move(ownedAsBuilt));
  } else {
    bindParameters(comm, device);
  }
  if (frozen_) return;  // no gradient, master or optimizer: Note [Frozen units]
  const at::Tensor& masterFrom = converted() ? given : ownedParams_;
  const auto options = at::TensorOptions().dtype(dtype_).device(device);
  const size_t elem = c10::elementSize(dtype_);
  if (stage == 1) {
    gradMemory_ = comm.allocate(std::max<size_t>(1, paddedNumel() * elem));
    fullGrads_ = ddp::tensorOver(gradMemory_, 0, {paddedNumel()}, options);
    fullGrads_.zero_();
    makeGradViews(gradMemory_);
    for (size_t j = 0; j < params_.size(); ++j) {
      at::Tensor& grad = params_[j].param.mutable_grad();
      if (grad.defined()) gradViews_[j].copy_(grad);
      grad = gradViews_[j];
    }
    reduced_ = ddp::tensorOver(gradMemory_, rank_ * shardNumel(), {shardNumel()}, options);
  }
  // Stages 2 and 3: reduced_ is made by the first reduce-scatter (ensureReduced()).
  if (offload && device.type() != c10::DeviceType::CPU) {
    // Pinned, so that the copies to and from the device run at the link's speed.
    const auto host = at::TensorOptions().device(at::kCPU).pinned_memory(true);
    master_ = at::empty({shardNumel()}, host.dtype(masterType));
    master_.copy_(masterFrom);
    shardGrad_ = at::zeros({shardNumel()}, host.dtype(masterType));
    hostReduced_ = at::empty({shardNumel()}, host.dtype(gradType_));
    optimized_ = master_;
  } else if (masterType != dtype_) {
    master_ = masterFrom.to(masterType).clone();
    // A float32 reduce-scatter (stage 3 under autocast) writes the master's gradient itself;
    // else takeReduced() makes the master's gradient at the first reduce-scatter.
    gradInReduced_ = stage != 1 && gradType_ == masterType;
    optimized_ = master_;
    // A converted unit keeps no rounding of its block: each all-gather rounds the master into
    // the rank's own place of the gathered unit (sendBlock()), as FSDP2's mixed precision casts
    // its float32 shard into the all-gather's input.
    if (converted()) ownedParams_ = at::Tensor();
  } else {
    gradInReduced_ = stage != 1;
    shardGrad_ = reduced_;
    optimized_ = ownedParams_;
  }
  attachShardGrad();
}

ShardUnit::~ShardUnit() = default;

void ShardUnit::bindParameters(comm::Communicator& comm, const c10::Device& device) {
  const auto options = at::TensorOptions().dtype(dtype_).device(device);
  paramMemory_ = comm.allocate(std::max<size_t>(1, paddedNumel() * c10::elementSize(dtype_)));
  fullParams_ = ddp::tensorOver(paramMemory_, 0, {paddedNumel()}, options);
  for (size_t j = 0; j < params_.size(); ++j) {
    at::Tensor& p = params_[j].param;
    DTRAIN_CHECK(p.scalar_type() == dtype_, "ShardUnit: {} is {}, its unit {}", params_[j].name,
                 c10::toString(p.scalar_type()), c10::toString(dtype_));
    at::Tensor place = ddp::tensorOver(paramMemory_, layout_.offsets[j], p.sizes(), options);
    place.copy_(p);
    p.set_data(place);
  }
  fullParams_.narrow(0, layout_.numel, paddedNumel() - layout_.numel).zero_();
  ownedParams_ = ddp::tensorOver(paramMemory_, rank_ * shardNumel(), {shardNumel()}, options);
}

at::Tensor ShardUnit::givenBlock(const c10::Device& device) const {
  const int64_t begin = rank_ * shardNumel();
  const int64_t end = begin + shardNumel();
  at::Tensor block = at::zeros({shardNumel()},
                               at::TensorOptions().dtype(givenType_).device(device));
  for (size_t j = 0; j < params_.size(); ++j) {
    const at::Tensor& p = params_[j].param;
    const int64_t from = std::max(begin, layout_.offsets[j]);
    const int64_t to = std::min(end, layout_.offsets[j] + p.numel());
    if (from >= to) continue;
    block.narrow(0, from - begin, to - from)
        .copy_(p.detach().reshape({-1}).narrow(0, from - layout_.offsets[j], to - from));
  }
  return block;
}

void ShardUnit::bindOverStorage(comm::Communicator& comm, const c10::Device& device,
                                at::Tensor asBuilt) {
  // The values the parameters have now, gathered in a first buffer; a resharded unit keeps only
  // its own block of them. A unit sharded when built has no values to gather: its storage has no
  // memory from the start (sized for set_(), then without bytes) and its block as built is the
  // owned block (Note [Units sharded when built]).
  const bool built = asBuilt.defined();
  const auto options = at::TensorOptions().dtype(dtype_).device(device);
  const size_t bytes = std::max<size_t>(1, paddedNumel() * c10::elementSize(dtype_));
  if (!built) paramMemory_ = comm.allocate(bytes);
  fullStorage_ = at::Storage(at::Storage::use_byte_size_t(), bytes,
                             built ? at::DataPtr(nullptr, device)
                                   : dataPtrOver(paramMemory_, device),
                             /*allocator=*/nullptr, /*resizable=*/false);
  fullParams_ = ddp::tensorIn(fullStorage_, 0, {paddedNumel()}, options);
  for (size_t j = 0; j < params_.size(); ++j) {
    at::Tensor& p = params_[j].param;
    DTRAIN_CHECK(p.scalar_type() == givenType_, "ShardUnit: {} is {}, its unit {}", params_[j].name,
                 c10::toString(p.scalar_type()), c10::toString(givenType_));
    at::Tensor place = ddp::tensorIn(fullStorage_, layout_.offsets[j], p.sizes(), options);
    if (!built) place.copy_(p);
    p.set_data(place);
    // A gradient from before (converted: of the dtype as given) in the parameter's dtype now.
    at::Tensor& grad = p.mutable_grad();
    if (grad.defined() && grad.scalar_type() != dtype_) grad = grad.to(dtype_);
  }
  if (built) {
    fullStorage_.unsafeGetStorageImpl()->set_nbytes(0);
    ownedParams_ = converted() ? asBuilt.to(dtype_) : std::move(asBuilt);
    return;
  }
  fullParams_.narrow(0, layout_.numel, paddedNumel() - layout_.numel).zero_();
  ownedParams_ = fullParams_.narrow(0, rank_ * shardNumel(), shardNumel()).clone();
  if (resharded_) releaseFull();
}

void ShardUnit::releaseForRebuild() {
  if (!resharded_) return;
  at::NoGradGuard noGrad;
  const auto options = at::TensorOptions().dtype(givenType_).device(device_);
  const size_t bytes = std::max<size_t>(1, paddedNumel() * c10::elementSize(givenType_));
  at::Storage storage(at::Storage::use_byte_size_t(), bytes, at::DataPtr(nullptr, device_),
                      /*allocator=*/nullptr, /*resizable=*/false);
  for (size_t j = 0; j < params_.size(); ++j) {
    at::Tensor& p = params_[j].param;
    p.set_data(ddp::tensorIn(storage, layout_.offsets[j], p.sizes(), options));
    p.mutable_grad() = at::Tensor();
  }
  storage.unsafeGetStorageImpl()->set_nbytes(0);
}

void ShardUnit::holdFull(std::shared_ptr<comm::Buffer> buffer) {
  DTRAIN_CHECK(stage_ == 3 && paramMemory_ == nullptr, "{}: full parameters held twice",
               describe());
  const size_t bytes = std::max<size_t>(1, paddedNumel() * c10::elementSize(dtype_));
  DTRAIN_CHECK(buffer->bytes() >= bytes, "{}: a buffer of {} bytes for {}", describe(),
               buffer->bytes(), bytes);
  paramMemory_ = std::move(buffer);
  c10::StorageImpl* impl = fullStorage_.unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(dataPtrOver(paramMemory_, device_));
  impl->set_nbytes(bytes);
}

std::shared_ptr<comm::Buffer> ShardUnit::releaseFull() {
  DTRAIN_CHECK(stage_ == 3 && paramMemory_ != nullptr, "{}: full parameters freed twice",
               describe());
  c10::StorageImpl* impl = fullStorage_.unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(at::DataPtr(nullptr, device_));
  impl->set_nbytes(0);
  return std::move(paramMemory_);
}

void ShardUnit::makeGradViews(const std::shared_ptr<comm::Buffer>& memory) {
  const auto options = fullParams_.options().dtype(gradType_);
  gradViews_.clear();
  for (size_t j = 0; j < params_.size(); ++j) {
    gradViews_.push_back(
        ddp::tensorOver(memory, layout_.offsets[j], params_[j].param.sizes(), options));
  }
}

std::string ShardUnit::describe() const {
  const std::string& first = params_.front().name;
  if (params_.size() == 1) return fmt::format("unit {} ({})", index_, first);
  return fmt::format("unit {} ({} .. {}, {} parameters)", index_, first, params_.back().name,
                     params_.size());
}

at::Tensor ShardUnit::sendBlock() {
  if (ownedParams_.defined()) return ownedParams_;
  DTRAIN_CHECK(converted() && master_.defined() && paramMemory_ != nullptr,
               "{}: no block to send: neither its own nor the full parameters held", describe());
  at::Tensor mine = fullParams_.narrow(0, rank_ * shardNumel(), shardNumel());
  mine.copy_(master_);  // the rounding the block would keep: the same values, bitwise
  return mine;
}

bool ShardUnit::shardGradAttached() const {
  const at::Tensor& grad = optimized_.grad();
  return grad.defined() && attached_ != nullptr && grad.data_ptr() == attached_;
}

void ShardUnit::attachShardGrad() {
  optimized_.mutable_grad() = shardGrad_;
  attached_ = shardGrad_.defined() ? shardGrad_.data_ptr() : nullptr;
}

at::Tensor ShardUnit::shardGrad() const {
  if (shardGrad_.defined()) return shardGrad_;
  return shardGradAttached() ? optimized_.grad() : at::Tensor();
}

void ShardUnit::takeReduced() {
  DTRAIN_CHECK(hasMaster() && !gradInReduced_,
               "{}: no master gradient apart from the reduced one to take it", describe());
  at::Tensor from = reduced_;
  if (offloaded()) {
    hostReduced_.copy_(reduced_);  // synchronous: ordered after the collective on this stream
    from = hostReduced_;
  }
  if (shardGradAttached()) {
    shardGrad().add_(from);
  } else {
    if (!shardGrad_.defined()) shardGrad_ = at::empty_like(master_);
    shardGrad_.copy_(from);
    attachShardGrad();
  }
}

void ShardUnit::ensureReduced() {
  if (stage_ == 1 || frozen_ || reduced_.defined()) return;
  if (gradInReduced_ && shardGradAttached()) {
    reduced_ = optimized_.grad();  // the reduce-scatter adds into the gradient accumulated so far
  } else {
    reduced_ = at::empty({shardNumel()}, at::TensorOptions().dtype(gradType_).device(device_));
  }
  if (gradInReduced_) shardGrad_ = reduced_;
}

void ShardUnit::letGoOfGradient() {
  // Stage 1's reduced_ is a block of its gradient buffer; an offloaded master's gradient and
  // its host buffer are pinned memory, costly to make again: they stay.
  if (stage_ == 1 || frozen_ || offloaded()) return;
  reduced_ = at::Tensor();
  shardGrad_ = at::Tensor();
}

void ShardUnit::leaseGrads(std::shared_ptr<comm::Buffer> bucket) {
  DTRAIN_CHECK(!fullGrads_.defined(), "{}: a second gradient bucket", describe());
  const size_t need = paddedNumel() * c10::elementSize(gradType_);
  DTRAIN_CHECK(bucket->bytes() >= need, "{}: a bucket of {} bytes for {}", describe(),
               bucket->bytes(), need);
  gradMemory_ = std::move(bucket);
  fullGrads_ = ddp::tensorOver(gradMemory_, 0, {paddedNumel()},
                               fullParams_.options().dtype(gradType_));
  fullGrads_.narrow(0, layout_.numel, paddedNumel() - layout_.numel).zero_();
  makeGradViews(gradMemory_);
}

std::shared_ptr<comm::Buffer> ShardUnit::returnGrads() {
  fullGrads_ = at::Tensor();
  gradViews_.clear();
  return std::move(gradMemory_);
}

size_t ShardUnit::parameterBytes() const {
  // Stage 3: the owned block has memory of its own; the full storage counts while held.
  return storageBytes(fullParams_) + (stage_ == 3 ? storageBytes(ownedParams_) : 0);
}

size_t ShardUnit::gradientBytes() const {
  // Stage 1: the full buffer, of which reduced is a block; stage 2: reduced. Master: its gradient.
  size_t bytes = 0;
  if (stage_ == 1) {
    bytes = storageBytes(fullGrads_);
  } else if (!gradInReduced_) {
    bytes = storageBytes(reduced_);  // the reduce-scatter's output, while it is held
  }
  if (gradInReduced_ || master_.defined()) bytes += storageBytes(shardGrad());
  return bytes;
}

size_t ShardUnit::masterBytes() const { return storageBytes(master_); }

size_t ShardUnit::offloadedBytes() const {
  if (!offloaded()) return 0;
  return storageBytes(master_) + storageBytes(shardGrad_) + storageBytes(hostReduced_);
}

void ShardUnit::setOptimizer(std::unique_ptr<torch::optim::Optimizer> optimizer) {
  optimizer_ = std::move(optimizer);
}

}  // namespace dtrain::zero
