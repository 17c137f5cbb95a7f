#pragma once
// DistributedDataParallel: data-parallel training of a libtorch module across the ranks of a
// ProcessGroup, like PyTorch's torch.nn.parallel.DistributedDataParallel.
//
// Wrap the module once every rank has built it; call the wrapper's forward (not the module's),
// then backward() and the optimizer as usual. When backward() returns, every parameter's .grad
// holds the average of the ranks' gradients, so the ranks stay in lockstep:
//
//   auto group = dtrain::init();
//   Net net;
//   dtrain::DistributedDataParallel<Net> ddp(net, group);
//   torch::optim::SGD sgd(ddp.parameters(), 0.1);
//   for (auto& batch : *loader) {
//     sgd.zero_grad();
//     auto loss = torch::nll_loss(ddp(batch.data), batch.target);
//     loss.backward();   // gradients averaged across ranks when this returns
//     sgd.step();
//   }
//
// Construction is collective: it checks that every rank has the same parameters and buffers
// (names, shapes, dtypes) and broadcasts them from rank 0. Gradients travel in buckets whose
// allreduces overlap with the rest of backward (docs/design.md "DDP"). Every
// forward through the wrapper is a collective too when buffers are broadcast (the default): call
// it on every rank, or call the module itself for rank-local evaluation.
//
// Gradient accumulation: forwards inside `auto guard = ddp.noSync();` are followed by backwards
// that only accumulate into .grad, without communication; the first forward + backward after the
// guard synchronises the accumulated gradients. Whether a backward synchronises is decided by the
// forward before it.

#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "dtrain/base/error.h"
#include "dtrain/torch/ddp_options.h"
#include "dtrain/torch/ddp_stats.h"
#include "dtrain/torch/detail/ddp_core.h"
#include "dtrain/torch/process_group.h"

namespace dtrain {

namespace detail {

template <typename Impl>
std::shared_ptr<torch::nn::Module> modulePtr(const torch::nn::ModuleHolder<Impl>& holder) {
  return holder.ptr();
}
template <typename T>
std::shared_ptr<torch::nn::Module> modulePtr(const std::shared_ptr<T>& module) {
  return module;
}

// The tensors inside a forward's output, for findUnusedParameters. Types it does not know
// contribute nothing. All overloads are declared first so that nested containers find each other.
template <typename T>
void collectTensors(const T&, std::vector<at::Tensor>&) {}
inline void collectTensors(const at::Tensor& t, std::vector<at::Tensor>& out) { out.push_back(t); }
template <typename T>
void collectTensors(const std::vector<T>& v, std::vector<at::Tensor>& out);
template <typename A, typename B>
void collectTensors(const std::pair<A, B>& p, std::vector<at::Tensor>& out);
template <typename... Ts>
void collectTensors(const std::tuple<Ts...>& t, std::vector<at::Tensor>& out);
template <typename K, typename V>
void collectTensors(const std::map<K, V>& m, std::vector<at::Tensor>& out);
template <typename K, typename V>
void collectTensors(const std::unordered_map<K, V>& m, std::vector<at::Tensor>& out);

template <typename T>
void collectTensors(const std::vector<T>& v, std::vector<at::Tensor>& out) {
  for (const auto& x : v) collectTensors(x, out);
}
template <typename A, typename B>
void collectTensors(const std::pair<A, B>& p, std::vector<at::Tensor>& out) {
  collectTensors(p.first, out);
  collectTensors(p.second, out);
}
template <typename... Ts>
void collectTensors(const std::tuple<Ts...>& t, std::vector<at::Tensor>& out) {
  std::apply([&](const auto&... x) { (collectTensors(x, out), ...); }, t);
}
template <typename K, typename V>
void collectTensors(const std::map<K, V>& m, std::vector<at::Tensor>& out) {
  for (const auto& kv : m) collectTensors(kv.second, out);
}
template <typename K, typename V>
void collectTensors(const std::unordered_map<K, V>& m, std::vector<at::Tensor>& out) {
  for (const auto& kv : m) collectTensors(kv.second, out);
}

}  // namespace detail

// While alive, forwards through the wrapper prepare backwards that accumulate gradients locally.
// Restores the previous setting when it dies, so guards nest.
class NoSyncGuard {
 public:
  explicit NoSyncGuard(DdpCore& core) : core_(core), previous_(core.syncEnabled()) {
    core_.setSyncEnabled(false);
  }
  ~NoSyncGuard() { core_.setSyncEnabled(previous_); }
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;

 private:
  DdpCore& core_;
  bool previous_;
};

template <typename ModuleType>
class DistributedDataParallel {
 public:
  // `module`: a module holder (torch::nn::Linear, a TORCH_MODULE type) or a std::shared_ptr to a
  // module, already on group->device(). Collective.
  DistributedDataParallel(ModuleType module, std::shared_ptr<ProcessGroup> group,
                          DdpOptions options = {})
      : module_(std::move(module)),
        group_(group),
        options_(options),
        core_(std::make_unique<DdpCore>(detail::modulePtr(module_), std::move(group), options)) {}

  template <typename... Args>
  auto forward(Args&&... args) {
    if (stale()) reform();
    core_->beforeForward();
    auto output = module_->forward(std::forward<Args>(args)...);
    std::vector<at::Tensor> tensors;
    if (core_->wantsOutputs()) detail::collectTensors(output, tensors);
    core_->afterForward(tensors, !tensors.empty());
    return output;
  }
  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  // See NoSyncGuard. Use as `auto guard = ddp.noSync();`.
  [[nodiscard]] NoSyncGuard noSync() { return NoSyncGuard(core()); }

  // Broadcasts the buffers from rank 0 now (collective), e.g. before saving a checkpoint, since
  // each rank's last forward updated its running statistics with its own batch.
  void syncBuffers() { core().syncBuffers(); }

  ModuleType& module() { return module_; }
  const ModuleType& module() const { return module_; }
  auto* operator->() { return &*module_; }
  // Each parameter once, as PyTorch's Module.parameters(): libtorch's lists a tied parameter
  // under every module that registers it, and an optimizer given it twice steps it twice.
  std::vector<at::Tensor> parameters() const {
    std::vector<at::Tensor> out;
    std::unordered_set<const void*> seen;
    for (auto& p : detail::modulePtr(module_)->parameters(/*recurse=*/true)) {
      if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(std::move(p));
    }
    return out;
  }

  // Makes the buckets again for the group's new world after it re-formed among the survivors of
  // a lost node (ProcessGroup::reform): the next forward does it by itself. Collective over the
  // new members; the parameters are broadcast from the new rank 0 as at construction, but those
  // in `loadedLater` (their TensorImpl), which the caller writes on every rank next.
  // A re-form that fails -- its collectives cut short by a newer membership epoch -- leaves no
  // machinery (stale() stays true), and the next forward, after the group re-formed again, makes
  // it once more.
  void reform(const std::unordered_set<const void*>& loadedLater = {}) {
    core_.reset();  // its hooks go before the new core installs its own
    core_ = std::make_unique<DdpCore>(detail::modulePtr(module_), group_, options_, loadedLater);
  }
  // The machinery belongs to an older membership epoch than the group's, or a re-form failed:
  // the next forward (or reform()) makes it again.
  bool stale() const { return !core_ || core_->stale(); }

  ProcessGroup& processGroup() { return *group_; }
  // The type-independent machinery, for what builds on DDP (dtrain::ShardedOptimizer).
  DdpCore& core() { return machinery(); }
  const DdpOptions& options() const { return options_; }
  const DdpIterationStats& lastIteration() const { return machinery().lastIteration(); }
  std::vector<std::vector<std::string>> bucketNames() const { return machinery().bucketNames(); }

 private:
  DdpCore& machinery() const {
    DTRAIN_CHECK(core_ != nullptr,
                 "DistributedDataParallel: its re-form for the group's new membership epoch "
                 "failed, so it has no machinery until the next forward makes it again");
    return *core_;
  }

  ModuleType module_;
  std::shared_ptr<ProcessGroup> group_;
  DdpOptions options_;
  std::unique_ptr<DdpCore> core_;
};

}  // namespace dtrain
