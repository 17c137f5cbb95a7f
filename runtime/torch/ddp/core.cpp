#include "dtrain/torch/detail/ddp_core.h"

#include <unordered_set>

#include <torch/nn/module.h>

#include "../zero/built_unit.h"
#include "dtrain/base/error.h"
#include "model_sync.h"
#include "reducer.h"

namespace dtrain {

namespace {

std::vector<ddp::NamedTensor> named(const torch::OrderedDict<std::string, at::Tensor>& dict) {
  // A tensor registered under two names (tied weights) takes part once, under its first name.
  std::unordered_set<const void*> seen;
  std::vector<ddp::NamedTensor> out;
  for (const auto& item : dict) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) {
      out.push_back({item.key(), item.value()});
    }
  }
  return out;
}

void checkDevice(const ProcessGroup& group, const ddp::NamedTensor& t, const char* kind) {
  c10::Device want = group.device();
  c10::Device have = t.tensor.device();
  bool ok = have.type() == want.type() && (!want.has_index() || have.index() == want.index());
  DTRAIN_CHECK_ARG(ok,
                   "DistributedDataParallel: {} {} is on {} but the process group works on {}. "
                   "HINT: move the module there before wrapping it: module->to(group->device())",
                   kind, t.name, have.str(), want.str());
}

}  // namespace

const char* gradientCompressionName(GradientCompression compression) {
  switch (compression) {
    case GradientCompression::None: return "none";
    case GradientCompression::Fp16: return "fp16";
    case GradientCompression::Bf16: return "bf16";
  }
  return "unknown";
}

DdpCore::DdpCore(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ProcessGroup> group,
                 DdpOptions options, const std::unordered_set<const void*>& loadedLater)
    : module_(std::move(module)), group_(std::move(group)), options_(options) {
  DTRAIN_CHECK_ARG(module_ != nullptr, "DistributedDataParallel needs a module");
  DTRAIN_CHECK_ARG(group_ != nullptr, "DistributedDataParallel needs a process group");
  epoch_ = group_->epoch();
  // A rank taken into a running round (ProcessGroup::joinPending) builds nothing collective yet:
  // its first step settles with the members (TrainingState::tryStep), and the first forward
  // after it makes this core again as theirs is made after their re-form -- the model compared
  // and broadcast then, in the same order on every rank.
  const bool deferred = group_->joinPending();
  if (deferred) epoch_ = -1;
  auto params = named(module_->named_parameters(/*recurse=*/true));
  auto buffers = named(module_->named_buffers(/*recurse=*/true));
  for (const auto& p : params) checkDevice(*group_, p, "parameter");
  for (const auto& b : buffers) checkDevice(*group_, b, "buffer");

  if (!deferred) ddp::verifySameModel(*group_, params, buffers);

  // Parameters of units sharded when built have no memory: no rank holds rank 0's values to
  // broadcast, and the stage-3 optimizer compares what the ranks built instead (Note [Units
  // sharded when built]).
  const std::vector<const void*> builtList = zero::builtParameters(*module_);
  const std::unordered_set<const void*> built(builtList.begin(), builtList.end());
  std::vector<at::Tensor> everything;
  for (const auto& p : params) {
    // Nor those of resharded units bound before (a wrapper re-made after a re-form under
    // ZeRO-3: their values are in the units' blocks, restored from the mirrors).
    const bool memoryless = p.tensor.numel() > 0 && p.tensor.storage().data() == nullptr;
    const void* impl = p.tensor.unsafeGetTensorImpl();
    if (!built.count(impl) && !memoryless && !loadedLater.count(impl)) {
      everything.push_back(p.tensor);
    }
  }
  for (const auto& b : buffers) everything.push_back(b.tensor);
  // In buckets: a model as large as the memory left must not need a second copy of itself.
  if (!deferred) {
    ddp::CoalescedBroadcast(*group_, everything, ddp::kStateBroadcastBucketBytes)
        .run(0, options_.timeout);
  }

  for (const auto& p : params) {
    if (p.tensor.requires_grad()) trained_.emplace_back(p.name, p.tensor);
  }
  if (!buffers.empty()) {
    std::vector<at::Tensor> tensors;
    for (const auto& b : buffers) tensors.push_back(b.tensor);
    buffers_ = std::make_unique<ddp::CoalescedBroadcast>(*group_, tensors);
  }
}

DdpCore::~DdpCore() = default;

bool DdpCore::stale() const { return group_->epoch() != epoch_; }

void DdpCore::beforeForward() {
  if (sync_) sync_->beforeForward();  // not sync(): a forward without gradients makes no reducer
  if (options_.broadcastBuffers && syncEnabled_ && buffers_ && group_->size() > 1) {
    buffers_->run(0, options_.timeout);
  }
}

bool DdpCore::wantsOutputs() const {
  return options_.findUnusedParameters && (syncEnabled_ || sync().armsUnderNoSync()) &&
         at::GradMode::is_enabled();
}

void DdpCore::afterForward(const std::vector<at::Tensor>& outputs, bool outputsSearchable) {
  if (!at::GradMode::is_enabled()) return;  // no backward can follow this forward
  if (!syncEnabled_) {
    if (sync().armsUnderNoSync()) {
      sync().armAccumulating(outputs);
    } else {
      sync().disarm();
    }
    return;
  }
  DTRAIN_CHECK_ARG(
      !options_.findUnusedParameters || outputsSearchable,
      "DistributedDataParallel: findUnusedParameters searches the autograd graph from the "
      "forward's outputs, but the module's forward returned a type the wrapper cannot search for "
      "tensors. HINT: return a torch::Tensor, or a std::vector, std::tuple or std::pair of them");
  sync().arm(outputs);
}

void DdpCore::syncBuffers() {
  if (buffers_ && group_->size() > 1) buffers_->run(0, options_.timeout);
}

const DdpIterationStats& DdpCore::lastIteration() const { return sync().lastIteration(); }

std::vector<std::vector<std::string>> DdpCore::bucketNames() const { return sync().bucketNames(); }

ddp::GradientSync& DdpCore::sync() const {
  if (!sync_) sync_ = makeReducer();
  return *sync_;
}

std::shared_ptr<ddp::GradientSync> DdpCore::makeReducer() const {
  // Without the parameters of units sharded when built: a stage-3 optimizer replaces this
  // reducer before any backward, and their full-size buckets are what no rank can hold.
  const std::vector<const void*> builtList = zero::builtParameters(*module_);
  const std::unordered_set<const void*> built(builtList.begin(), builtList.end());
  std::vector<ddp::NamedTensor> trained;
  for (const auto& [name, tensor] : trained_) {
    if (!built.count(tensor.unsafeGetTensorImpl())) trained.push_back({name, tensor});
  }
  return std::make_shared<ddp::Reducer>(group_, std::move(trained), options_);
}

void DdpCore::replaceGradientSync(const std::function<std::shared_ptr<ddp::GradientSync>()>& make) {
  DTRAIN_CHECK_ARG(!replaced_,
                   "rank {}: DistributedDataParallel: its gradients are handled by another object "
                   "already (one ShardedOptimizer per DistributedDataParallel). HINT: put every "
                   "parameter group into that one optimizer",
                   group_->rank());
  sync_.reset();  // DDP's reducer, if made, goes first: its hooks are removed, its buckets freed
  try {
    sync_ = make();
  } catch (...) {
    sync_.reset();  // made again when next needed
    throw;
  }
  DTRAIN_CHECK(sync_ != nullptr, "DistributedDataParallel: replaceGradientSync made nothing");
  replaced_ = true;
}

}  // namespace dtrain
