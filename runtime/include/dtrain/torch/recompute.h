#pragma once
// Activation recompute (PyTorch's "gradient checkpointing"): run part of a forward pass without
// keeping its intermediate activations and run it again during backward, trading about one more
// forward for memory. Not to be confused with dtrain::Checkpointer, which saves training state to
// disk: "recompute" is about activations in memory during one step.
//
//   // One module's forward (any arguments), recomputed in backward:
//   x = dtrain::recompute(block, x);
//   // Any function of tensors and other values; the segment names the modules it reads:
//   auto [h, gate] = dtrain::recompute(dtrain::RecomputeSegment(*layer),
//                                      [layer](const torch::Tensor& x, double scale) {
//                                        return std::make_tuple(layer->forward(x) * scale, x);
//                                      }, x, 0.5);
//   // A Sequential in segments of consecutive children (torch.utils.checkpoint_sequential):
//   x = dtrain::recomputeSequential(stack, /*segments=*/8, x);
//
// During forward the function runs once; its graph is walked for the tensors it reads that
// require grad (a parameter of a module the segment does not name, a learned scale it captures:
// they become inputs like the segment's parameters) and then dropped; only its tensor arguments
// are kept. During backward it runs again under the forward's random-generator state and autocast
// settings, BatchNorm's running statistics are left as the forward set them, and the gradients
// of the arguments and of every tensor it read that requires grad come back to the caller's
// backward pass: each parameter's gradient is accumulated once, by the ordinary autograd
// machinery, so DistributedDataParallel's hooks, noSync(), findUnusedParameters and GradScaler
// work unchanged (see Notes [Recompute] and [Tensors a segment reads] in the library and
// docs/design.md#recompute).
//
// The function runs twice: capture by value what it needs (module holders, scalars), since a
// reference to a local would dangle by the time backward runs. A module holder's call operator is
// not const: capture holders in a `mutable` lambda, or capture `holder.ptr()`.
// It must not modify its tensor
// arguments in place, nor capture a tensor computed before it that requires grad (x * w: pass it
// as an argument); errors say so. Results: a tensor, a std::vector of tensors or a std::tuple of
// tensors.

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

namespace dtrain {

constexpr bool kRecomputePreserveRngState = true;

struct RecomputeOptions {
  // Stash the CPU generator's state (and the CUDA generators' of the devices the segment's
  // tensors live on) before the forward and run the recompute from it, so that Dropout draws the
  // same mask twice. Off: the recompute draws fresh numbers (cheaper, and wrong for Dropout).
  bool preserveRngState = kRecomputePreserveRngState;
};

// What a recomputed function reads besides its tensor arguments: the parameters whose gradients
// it must return (they become inputs of the autograd node; a parameter it reads that is not listed
// here is found in forward and becomes one too) and the buffers its forward updates in place
// (BatchNorm's running statistics), which the recompute must leave as the forward set them, and
// only this list names. Built from the modules the function calls.
class RecomputeSegment {
 public:
  struct NamedBuffer {
    std::string name;
    at::Tensor tensor;
  };

  RecomputeSegment() = default;
  explicit RecomputeSegment(const torch::nn::Module& module, RecomputeOptions options = {});

  // The module's parameters that require grad (each once, however often added), its running
  // statistics (buffers named running_mean, running_var, num_batches_tracked: BatchNorm's and
  // InstanceNorm's) and its other buffers, which the recompute must not change (an error names
  // one that it did).
  RecomputeSegment& add(const torch::nn::Module& module);
  // A tensor the function reads that is neither an argument nor a module's parameter (a leaf is
  // found without it; a tensor computed before the function must be added or passed).
  RecomputeSegment& addParameter(const at::Tensor& parameter);
  // A buffer the function's forward updates in place, restored after the recompute.
  RecomputeSegment& addStatistic(std::string name, const at::Tensor& buffer);

  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  const std::vector<NamedBuffer>& statistics() const { return statistics_; }
  const std::vector<NamedBuffer>& otherBuffers() const { return otherBuffers_; }

  RecomputeOptions options;

 private:
  std::vector<at::Tensor> parameters_;
  std::vector<NamedBuffer> statistics_;
  std::vector<NamedBuffer> otherBuffers_;
};

// True while the calling thread runs a function again for the backward pass (a module can skip
// side effects such as logging; a sharded module gathers its parameters as in forward).
bool isRecomputing();

namespace detail {

using SegmentFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// The type-erased core: fn(inputs) under autograd's RecomputeFunction (docs/design.md
// "Recompute").
std::vector<at::Tensor> runRecomputed(const RecomputeSegment& segment, SegmentFn fn,
                                      std::vector<at::Tensor> inputs);

template <typename T>
constexpr bool kIsTensor = std::is_same_v<std::decay_t<T>, at::Tensor>;

// Arguments kept for the recompute: tensors travel through autograd (saved for backward), the
// rest are copied here.
template <typename T>
using Kept = std::conditional_t<kIsTensor<T>, std::monostate, std::decay_t<T>>;

template <typename T>
Kept<T> keep(T&& value) {
  if constexpr (kIsTensor<T>) {
    return {};
  } else {
    return std::forward<T>(value);
  }
}

// Position of each argument among the tensor arguments (unused for the others).
template <typename... Args>
constexpr std::array<size_t, sizeof...(Args) + 1> tensorSlots() {
  constexpr bool isTensor[] = {kIsTensor<Args>..., false};
  std::array<size_t, sizeof...(Args) + 1> slots{};
  size_t next = 0;
  for (size_t i = 0; i < sizeof...(Args); ++i) slots[i] = isTensor[i] ? next++ : 0;
  return slots;
}

template <typename... Args, typename Fn, typename Tuple, size_t... I>
decltype(auto) callWith(Fn& fn, const Tuple& kept, const std::vector<at::Tensor>& tensors,
                        std::index_sequence<I...>) {
  constexpr auto slots = tensorSlots<Args...>();
  auto argument = [&](auto index) -> decltype(auto) {
    constexpr size_t i = decltype(index)::value;
    using Arg = std::tuple_element_t<i, std::tuple<Args...>>;
    if constexpr (kIsTensor<Arg>) {
      return static_cast<const at::Tensor&>(tensors[slots[i]]);
    } else {
      return static_cast<const std::decay_t<Arg>&>(std::get<i>(kept));
    }
  };
  return fn(argument(std::integral_constant<size_t, I>{})...);
}

// A segment's result as a list of tensors, and back.
template <typename R>
struct SegmentResult {
  static_assert(sizeof(R) == 0, "dtrain::recompute: the function must return a torch::Tensor, a "
                                "std::vector<torch::Tensor> or a std::tuple of torch::Tensor");
};
template <>
struct SegmentResult<at::Tensor> {
  static std::vector<at::Tensor> flatten(at::Tensor t) { return {std::move(t)}; }
  static at::Tensor rebuild(std::vector<at::Tensor> v) { return std::move(v.at(0)); }
};
template <>
struct SegmentResult<std::vector<at::Tensor>> {
  static std::vector<at::Tensor> flatten(std::vector<at::Tensor> v) { return v; }
  static std::vector<at::Tensor> rebuild(std::vector<at::Tensor> v) { return v; }
};
template <typename... Ts>
struct SegmentResult<std::tuple<Ts...>> {
  static_assert((kIsTensor<Ts> && ...), "dtrain::recompute: a returned tuple holds tensors only");
  static std::vector<at::Tensor> flatten(std::tuple<Ts...> t) {
    return std::apply([](auto&... x) { return std::vector<at::Tensor>{std::move(x)...}; }, t);
  }
  static std::tuple<Ts...> rebuild(std::vector<at::Tensor> v) {
    return rebuildAt(std::move(v), std::index_sequence_for<Ts...>{});
  }
  template <size_t... I>
  static std::tuple<Ts...> rebuildAt(std::vector<at::Tensor> v, std::index_sequence<I...>) {
    return std::tuple<Ts...>{std::move(v.at(I))...};
  }
};

}  // namespace detail

// Runs fn(args...) now without keeping its activations, and again in backward. Tensor arguments
// are the segment's inputs (their gradients flow back; those not requiring grad get none); the
// other arguments are copied and passed to both runs as they are.
template <typename Fn, typename... Args>
auto recompute(const RecomputeSegment& segment, Fn&& fn, Args&&... args) {
  using Stored = std::decay_t<Fn>;
  using Result = std::decay_t<std::invoke_result_t<Stored&, const std::decay_t<Args>&...>>;
  std::vector<at::Tensor> inputs;
  auto collect = [&inputs](const auto& a) {
    if constexpr (detail::kIsTensor<decltype(a)>) inputs.push_back(a);
  };
  (collect(args), ...);
  detail::SegmentFn run = [f = Stored(std::forward<Fn>(fn)),
                           kept = std::make_tuple(detail::keep(std::forward<Args>(args))...)](
                              const std::vector<at::Tensor>& tensors) mutable {
    return detail::SegmentResult<Result>::flatten(detail::callWith<std::decay_t<Args>...>(
        f, kept, tensors, std::index_sequence_for<Args...>{}));
  };
  return detail::SegmentResult<Result>::rebuild(
      detail::runRecomputed(segment, std::move(run), std::move(inputs)));
}

// A module's forward, recomputed: recompute(RecomputeSegment(*module), module->forward, args...).
template <typename Impl, typename... Args>
auto recompute(const torch::nn::ModuleHolder<Impl>& module, Args&&... args) {
  return recompute(
      RecomputeSegment(*module), [m = module.ptr()](const auto&... a) { return m->forward(a...); },
      std::forward<Args>(args)...);
}
template <typename Impl, typename... Args>
auto recompute(const std::shared_ptr<Impl>& module, Args&&... args) {
  static_assert(std::is_base_of_v<torch::nn::Module, Impl>, "recompute: not a module");
  return recompute(
      RecomputeSegment(*module), [m = module](const auto&... a) { return m->forward(a...); },
      std::forward<Args>(args)...);
}

// Runs the children of `sequential` on x in `segments` segments of consecutive children, each
// recomputed in backward: the first segments - 1 hold size / segments children each, the last the
// rest, as torch.utils.checkpoint.checkpoint_sequential splits them. Unlike checkpoint_sequential,
// the last segment is recomputed too, so after forward only the segments' inputs are kept.
// segments == sequential->size(): every child is its own segment (e.g. each block of a ResNet
// stage).
at::Tensor recomputeSequential(const torch::nn::Sequential& sequential, int64_t segments,
                               const at::Tensor& x, const RecomputeOptions& options = {});

// A Sequential whose forward is recomputeSequential(). Holds the Sequential's children under
// their names there ("0", "1", ...), so a model that swaps a Sequential member for one keeps its
// parameter names (and its checkpoints and state_dicts).
class RecomputeSequentialImpl : public torch::nn::Module {
 public:
  RecomputeSequentialImpl(torch::nn::Sequential sequential, int64_t segments,
                          RecomputeOptions options = {});
  at::Tensor forward(const at::Tensor& x);

  int64_t segments() const { return segments_; }
  const torch::nn::Sequential& sequential() const { return sequential_; }

 private:
  torch::nn::Sequential sequential_;
  int64_t segments_;
  RecomputeOptions options_;
};
TORCH_MODULE(RecomputeSequential);

}  // namespace dtrain
