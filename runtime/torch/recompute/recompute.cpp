#include "dtrain/torch/recompute.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <set>
#include <unordered_set>
#include <utility>

#include <ATen/SequenceNumber.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <c10/core/ScalarType.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#include "dtrain/base/error.h"
#include "state.h"

// Note [Recompute]
// recompute(fn, inputs...) is one autograd node, RecomputeFunction, whose inputs are the tensor
// arguments *and the tensors fn reads that require grad*: the segment's parameters
// (RecomputeSegment) and any other it finds fn reading (Note [Tensors a segment reads]). The
// forward runs fn once, keeps none of its graph and saves only the inputs. Its backward runs
// fn again, under grad mode, on detached copies of the inputs, then asks autograd for the
// gradients of the recomputed outputs with respect to those copies and to the parameters
// (what torch::autograd::grad with explicit inputs does)
// and returns them as the node's input gradients.
//
// Why not the classic reentrant form (Python's use_reentrant=True), which calls backward() on
// the recomputed outputs from inside backward: that inner backward accumulates the segment's
// parameter gradients itself, in a graph task of its own. DistributedDataParallel's hooks then
// fire there; the hook that queues the end-of-backward callback (Note [DDP backward]) binds it to
// that inner task, which ends first; findUnusedParameters' walk from the outputs cannot see the
// parameters, which were used under no-grad, and marks them unused although they receive
// gradients. Here the gradients come from a nested engine task too, but one that only
// *captures* the
// gradients at its inputs: no AccumulateGrad node runs in it, so no hook fires and .grad is not
// touched. The parameters' gradients leave the node like any other node's, in the caller's graph
// task; each parameter's AccumulateGrad runs once (a parameter used in several segments, or
// inside and outside one, gets the contributions summed in its input buffer first, as without
// recompute), right after its segment's backward and before the earlier segments', so DDP's
// buckets fill and launch in overlap with the rest of backward. findUnusedParameters' walk
// reaches the parameters through the node's edges. Parameters get gradients even when no input
// requires grad (the reentrant form's well-known gap), and torch::autograd::grad works through a
// recomputed segment.
//
// What the second run must match:
//   - Random numbers: the default generators' states (CPU, and CUDA for the devices of the inputs
//     and parameters) are captured before the forward; the recompute runs from them and then
//     puts back the states it found (RngFork), so Dropout draws the same mask and the
//     generators continue as if nothing had run twice. The generators are process-wide: another
//     thread drawing from them during a recompute breaks this, as it does for PyTorch.
//   - Autocast: the forward's settings (enabled, dtype for CPU and CUDA, weight cache) are
//     restored around the recompute, as a region of its own, since backward usually runs outside
//     the autocast region. The forward turns autocast's weight cache off: a cast of a weight
//     cached before the segment would reach fn as a tensor with a history of its own, which
//     Note [Tensors a segment reads] refuses; without the cache fn casts the weight itself, once
//     per use. (A forward under no-grad would need it off too: autocast's cache ignores grad
//     mode, a cast cached there has no history and a later use of the weight loses its
//     gradient; Python's reentrant checkpoint gives a wrong gradient that way.)
//   - Running statistics: BatchNorm updates its running mean and variance in every training
//     forward. The recompute would update them a second time; the statistics are copied before
//     and written back after it (BufferGuard), which is exact whatever ran in between (a module
//     used twice, another segment's recompute). The segment's other buffers must not change; a
//     version counter check says so if one does.
//   - Inputs: saved through autograd (version-checked); fn must not modify them in place during
//     the forward (checked: the recompute would start from the modified value).
//
// Note [Tensors a segment reads]
// The node's inputs are fixed when it is made, so everything whose gradient it must return has to
// be known when the forward ends. A tensor fn reads that requires grad but is neither an argument
// nor a parameter of the segment -- a learned scale the function captures, a parameter of a
// module the segment does not name, the parameters of a segment nested in fn -- would otherwise
// get no gradient, silently. So the forward runs fn with grad on, on detached copies of the
// arguments (which do not require grad), and walks the graph that run built, from the outputs to
// where it leaves the run: the nodes this thread made since fn started (sequence numbers) are the
// run's own; an edge to any other node is a tensor fn read. A leaf (AccumulateGrad) the segment
// does not name becomes one more input of the node, so it gets its gradient, once, in the
// caller's graph task, like a named parameter (PyTorch's non-reentrant checkpoint gives it one
// too); an argument fn also captures gets a second input for that use. A tensor fn captures that
// has a history of its own (computed before fn from something that requires grad) is refused:
// the graph holds its node, not the tensor, and the node's inputs must be tensors; passed as an
// argument or added to the segment it works. Then the outputs are detached, the graph freed, and
// the node made (runRecomputed). Cost: the forward builds the segment's graph (autograd's
// per-operation bookkeeping) and holds the segment's activations until fn returns -- what the
// recompute holds in backward, so the step's peak does not grow -- and walks its nodes once
// (recompute_bench's MLP: the recomputed forward 12 % slower than under no-grad, as slow as the
// plain forward; step time and peak bytes unchanged). Since this forward runs with grad on, a
// ZeRO-3 unit in it with reshardAfterForward = false stays gathered until its backward, as
// without recompute.
//
// A sharded (ZeRO-3) unit inside a segment needs nothing of it: the recompute runs the unit's
// forward again, which gathers the unit again (docs/design.md#recompute).

namespace dtrain {

namespace {

thread_local int recomputeDepth = 0;

struct DepthScope {
  DepthScope() { ++recomputeDepth; }
  ~DepthScope() { --recomputeDepth; }
};

bool isStatisticName(const std::string& name) {
  const std::string leaf = name.substr(name.rfind('.') + 1);
  return leaf == "running_mean" || leaf == "running_var" || leaf == "num_batches_tracked";
}

// One recomputed call: the function and what the recompute needs besides the saved tensors.
struct RecomputeRun : torch::CustomClassHolder {
  detail::SegmentFn fn;
  RecomputeSegment segment;
  size_t inputCount = 0;
  std::vector<at::Tensor> firstOutputs;  // from runRecomputed to forward
  std::optional<recompute_state::RngStates> rng;
  recompute_state::AutocastState autocast;
};

std::vector<c10::Device> cudaDevicesOf(at::TensorList a, at::TensorList b) {
  std::vector<c10::Device> devices;
  for (auto list : {a, b}) {
    for (const auto& t : list) {
      if (t.is_cuda() && std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
        devices.push_back(t.device());
      }
    }
  }
  return devices;
}

// Note [Incoming gradients]
// The gradient a recomputed segment receives (a block output's gradient: 25.7 MB for a block
// of ResNet-50's layer2 at batch 16) is needed by the first nodes of its recomputed graph only.
// A C++ autograd function's backward would hold it until the whole recomputed backward returns:
// libtorch's CppNode keeps the list it passes to backward, a by-value parameter is a second copy,
// and the roots' list handed to the engine a third. So backward takes the engine's list by
// reference and gradients() moves the gradients out of it, and a pre-hook on each root node of
// the recomputed graph clears the roots' list when the first of them runs -- the engine has
// taken its own references by then (its input buffer, or GraphRoot's outputs for several roots).
// From there the engine alone holds the gradient, and frees it when the nodes that read it are
// done, as PyTorch's non-reentrant checkpoint does inside its one backward.
// RecomputeMemory.TheIncomingGradientFreesBeforeTheSegmentsBackwardEnds checks it.
// (The hook shares the list: a graph kept for a double backward keeps the hook.)
class ReleaseOnEntry : public torch::autograd::FunctionPreHook {
 public:
  explicit ReleaseOnEntry(std::shared_ptr<torch::autograd::variable_list> held)
      : held_(std::move(held)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    for (auto& g : *held_) g.reset();
    return grads;
  }

 private:
  std::shared_ptr<torch::autograd::variable_list> held_;
};

class RecomputeFunction : public torch::autograd::Function<RecomputeFunction> {
 public:
  using variable_list = torch::autograd::variable_list;

  // The outputs are the first run's (runRecomputed), made before the node.
  static variable_list forward(torch::autograd::AutogradContext* ctx,
                               c10::intrusive_ptr<RecomputeRun> run, at::TensorList inputs,
                               at::TensorList params) {
    ctx->set_materialize_grads(false);
    std::vector<at::Tensor> outputs = std::move(run->firstOutputs);
    std::vector<at::Tensor> saved(inputs.begin(), inputs.end());
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(std::move(saved));
    run->inputCount = inputs.size();
    ctx->saved_data["run"] = c10::IValue::make_capsule(std::move(run));
    return outputs;
  }

  // `grads` is the engine's own list (libtorch passes it as an lvalue): gradients() takes the
  // incoming gradients out of it, so that each frees once the recomputed graph is done with it
  // (Note [Incoming gradients]).
  static variable_list backward(torch::autograd::AutogradContext* ctx, variable_list& grads) {
    auto run = c10::static_intrusive_pointer_cast<RecomputeRun>(ctx->saved_data["run"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    const size_t count = saved.size();
    // One gradient per argument of forward: none for the run, then inputs, then parameters.
    variable_list result(1 + count);
    std::vector<bool> needed(count);
    bool any = false;
    for (size_t k = 0; k < count; ++k) any |= (needed[k] = ctx->needs_input_grad(k));
    bool anyGrad = std::any_of(grads.begin(), grads.end(),
                               [](const auto& g) { return g.defined(); });
    if (!any || !anyGrad) return result;

    std::vector<at::Tensor> inputs;
    for (size_t k = 0; k < run->inputCount; ++k) {
      at::Tensor copy = saved[k].detach();
      copy.requires_grad_(needed[k] && saved[k].requires_grad());
      inputs.push_back(std::move(copy));
    }
    const bool createGraph = c10::GradMode::is_enabled();  // backward(create_graph=true)
    // The statistics go back only once the recomputed graph has run: BatchNorm's backward node
    // saved them (version-checked) and would refuse to run after a write.
    recompute_state::BufferGuard buffers(run->segment);
    try {
      gradients(*run, grads, saved, inputs, needed, createGraph, result);
    } catch (...) {
      buffers.restore();
      throw;
    }
    buffers.finish();
    return result;
  }

 private:
  // Runs fn again and writes the gradients of the inputs and parameters into result. Takes the
  // incoming gradients out of `grads`.
  static void gradients(RecomputeRun& run, variable_list& grads, const variable_list& saved,
                        const std::vector<at::Tensor>& inputs, const std::vector<bool>& needed,
                        bool createGraph, variable_list& result) {
    const size_t count = saved.size();
    std::vector<at::Tensor> outputs = rerun(run, inputs);

    // What torch::autograd::grad(outputs, wrt, grads) does, by edges: the recomputed outputs are
    // not held while their graph runs, so each frees as soon as autograd is done with it.
    torch::autograd::edge_list roots, wrt;
    auto rootGrads = std::make_shared<variable_list>();
    for (size_t i = 0; i < outputs.size() && i < grads.size(); ++i) {
      if (grads[i].defined() && outputs[i].requires_grad()) {
        roots.push_back(torch::autograd::impl::gradient_edge(outputs[i]));
        rootGrads->push_back(std::move(grads[i]));
      }
    }
    grads.clear();
    outputs.clear();
    std::vector<size_t> wrtIndex;
    for (size_t k = 0; k < count; ++k) {
      const at::Tensor& t = k < run.inputCount ? inputs[k] : saved[k];
      if (!needed[k] || !t.requires_grad()) continue;
      wrt.push_back(torch::autograd::impl::gradient_edge(t));
      wrtIndex.push_back(k);
    }
    if (roots.empty() || wrt.empty()) return;
    // The engine holds its own references to rootGrads' tensors from before the first node of
    // the recomputed graph runs: that node's pre-hook lets go of ours (Note [Incoming gradients]).
    for (const auto& root : roots) {
      root.function->add_pre_hook(std::make_unique<ReleaseOnEntry>(rootGrads));
    }
    // accumulate_grad = false: the gradients are captured where the edges end; no AccumulateGrad
    // node runs, so no hook fires and no .grad changes (Note [Recompute]).
    variable_list computed = torch::autograd::Engine::get_default_engine().execute(
        roots, *rootGrads, /*keep_graph=*/createGraph, createGraph, /*accumulate_grad=*/false, wrt);
    for (size_t j = 0; j < wrtIndex.size(); ++j) result[1 + wrtIndex[j]] = std::move(computed[j]);
  }

  // fn again, as the forward ran it, building a graph this time.
  static std::vector<at::Tensor> rerun(RecomputeRun& run, const std::vector<at::Tensor>& inputs) {
    DepthScope depth;
    std::optional<recompute_state::RngFork> rng;
    if (run.rng) rng.emplace(*run.rng);
    recompute_state::AutocastRegion autocast(run.autocast);
    c10::AutoGradMode gradMode(true);
    return run.fn(inputs);
  }
};

using torch::autograd::Edge;
using torch::autograd::Node;

// Whether fn's first run made `node` (Note [Tensors a segment reads]). AccumulateGrad nodes carry
// the largest sequence number; they belong to their leaf, whenever made.
bool madeInRun(const Node& node, uint64_t firstNode, uint64_t thread) {
  return node.sequence_nr() >= firstNode && node.thread_id() == thread &&
         dynamic_cast<const torch::autograd::AccumulateGrad*>(&node) == nullptr;
}

// The edges by which the graph of fn's first run leaves it, each once.
std::vector<Edge> edgesLeavingRun(const std::vector<at::Tensor>& outputs, uint64_t firstNode) {
  const uint64_t thread = at::RecordFunction::currentThreadId();
  std::unordered_set<const Node*> inside;
  std::vector<Node*> pending;
  std::set<std::pair<const Node*, uint32_t>> seen;
  std::vector<Edge> leaving;
  auto follow = [&](const Edge& e) {
    if (!e.is_valid()) return;
    Node* node = e.function.get();
    if (madeInRun(*node, firstNode, thread)) {
      if (inside.insert(node).second) pending.push_back(node);
    } else if (seen.emplace(node, e.input_nr).second) {
      leaving.push_back(e);
    }
  };
  for (const auto& out : outputs) {
    if (out.defined() && out.requires_grad()) follow(torch::autograd::impl::gradient_edge(out));
  }
  while (!pending.empty()) {
    Node* node = pending.back();
    pending.pop_back();
    for (const Edge& e : node->next_edges()) follow(e);
  }
  return leaving;
}

// Appends to params the tensors fn's first run read that the node must take as inputs besides
// the segment's parameters: leaves the segment does not name, and arguments fn also captures.
void addUnnamedReads(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                     std::vector<at::Tensor>& params, uint64_t firstNode) {
  std::unordered_set<const c10::TensorImpl*> leaves;
  for (const auto& p : params) leaves.insert(p.unsafeGetTensorImpl());
  for (const Edge& e : edgesLeavingRun(outputs, firstNode)) {
    if (auto* leaf = dynamic_cast<torch::autograd::AccumulateGrad*>(e.function.get())) {
      if (leaves.insert(leaf->variable.unsafeGetTensorImpl()).second) {
        params.push_back(leaf->variable);
      }
      continue;
    }
    // A tensor with a history: a parameter added with its history, an argument, or refused.
    auto isRead = [&e](const at::Tensor& t) {
      if (!t.requires_grad() || t.is_leaf()) return false;
      const Edge own = torch::autograd::impl::gradient_edge(t);
      return own.function == e.function && own.input_nr == e.input_nr;
    };
    if (std::any_of(params.begin(), params.end(), isRead)) continue;
    auto argument = std::find_if(inputs.begin(), inputs.end(), isRead);
    if (argument != inputs.end()) {
      params.push_back(*argument);
      continue;
    }
    // The metadata keeps the shape private; a zero tensor of it, once, on the way to an error.
    const auto& meta = e.function->input_metadata(e.input_nr);
    const std::vector<int64_t> shape = meta.zeros_like().sizes().vec();
    DTRAIN_THROW(InvalidArgument,
                 "dtrain::recompute: the function reads a tensor of shape [{}] ({}) that requires "
                 "grad and was computed before the segment (its grad_fn is {}); it is neither a "
                 "tensor argument nor a parameter of the segment, so the recompute's node cannot "
                 "take it as an input and its gradient would be lost. HINT: pass it to "
                 "recompute() as a tensor argument, or add it to the segment "
                 "(RecomputeSegment::addParameter), and its gradient flows back; or compute it "
                 "inside the function",
                 fmt::join(shape.begin(), shape.end(), ", "),
                 c10::toString(c10::typeMetaToScalarType(meta.dtype())), e.function->name());
  }
}

// fn's first run, in forward (Note [Tensors a segment reads]): returns its outputs without
// history and appends to params what else the node must take as inputs.
std::vector<at::Tensor> firstRun(RecomputeRun& run, const std::vector<at::Tensor>& inputs,
                                 std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> copies;
  std::vector<int64_t> versions;
  for (const auto& t : inputs) {
    copies.push_back(t.detach());  // shares t's version counter
    versions.push_back(t._version());
  }
  const uint64_t firstNode = at::sequence_number::peek();
  std::vector<at::Tensor> outputs;
  {
    recompute_state::AutocastCacheOff cacheOff;
    outputs = run.fn(copies);
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    DTRAIN_CHECK_ARG(inputs[i]._version() == versions[i],
                     "dtrain::recompute: the function modified its tensor argument #{} in place; "
                     "the recompute in backward would start from the modified value. HINT: "
                     "compute into a new tensor (x = x.relu() rather than x.relu_()), or move "
                     "the in-place step out of the recomputed segment",
                     i);
  }
  DTRAIN_CHECK_ARG(!outputs.empty(), "dtrain::recompute: the function returned no tensor");
  addUnnamedReads(outputs, inputs, params, firstNode);
  for (auto& out : outputs) {
    if (!out.defined()) continue;
    auto copy = std::find_if(copies.begin(), copies.end(), [&out](const at::Tensor& c) {
      return c.unsafeGetTensorImpl() == out.unsafeGetTensorImpl();
    });
    if (copy != copies.end()) {
      out = inputs[static_cast<size_t>(copy - copies.begin())];  // an argument returned as it is
    } else if (out.grad_fn()) {
      out = out.detach();  // the first run's graph goes with the last of these
    }
  }
  return outputs;
}

}  // namespace

RecomputeSegment::RecomputeSegment(const torch::nn::Module& module, RecomputeOptions opts)
    : options(opts) {
  add(module);
}

RecomputeSegment& RecomputeSegment::add(const torch::nn::Module& module) {
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    if (p.requires_grad()) addParameter(p);
  }
  for (const auto& b : module.named_buffers(/*recurse=*/true)) {
    auto& list = isStatisticName(b.key()) ? statistics_ : otherBuffers_;
    const bool known = std::any_of(list.begin(), list.end(), [&](const NamedBuffer& n) {
      return n.tensor.unsafeGetTensorImpl() == b.value().unsafeGetTensorImpl();
    });
    if (!known) list.push_back({b.key(), b.value()});
  }
  return *this;
}

RecomputeSegment& RecomputeSegment::addParameter(const at::Tensor& parameter) {
  DTRAIN_CHECK_ARG(parameter.defined(), "RecomputeSegment::addParameter: undefined tensor");
  // A parameter listed twice would be an input of the node twice and receive its gradient twice.
  const bool known = std::any_of(parameters_.begin(), parameters_.end(), [&](const at::Tensor& p) {
    return p.unsafeGetTensorImpl() == parameter.unsafeGetTensorImpl();
  });
  if (!known) parameters_.push_back(parameter);
  return *this;
}

RecomputeSegment& RecomputeSegment::addStatistic(std::string name, const at::Tensor& buffer) {
  DTRAIN_CHECK_ARG(buffer.defined(), "RecomputeSegment::addStatistic: '{}' is undefined", name);
  otherBuffers_.erase(std::remove_if(otherBuffers_.begin(), otherBuffers_.end(),
                                     [&](const NamedBuffer& n) {
                                       return n.tensor.unsafeGetTensorImpl() ==
                                              buffer.unsafeGetTensorImpl();
                                     }),
                      otherBuffers_.end());
  statistics_.push_back({std::move(name), buffer});
  return *this;
}

bool isRecomputing() { return recomputeDepth > 0; }

namespace detail {

std::vector<at::Tensor> runRecomputed(const RecomputeSegment& segment, SegmentFn fn,
                                      std::vector<at::Tensor> inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    DTRAIN_CHECK_ARG(inputs[i].defined(), "dtrain::recompute: tensor argument #{} is undefined", i);
  }
  // Without grad mode (evaluation) there is nothing to recompute: no node, nothing saved.
  if (!c10::GradMode::is_enabled()) return fn(inputs);
  auto run = c10::make_intrusive<RecomputeRun>();
  run->fn = std::move(fn);
  run->segment = segment;
  std::vector<at::Tensor> params = segment.parameters();
  if (segment.options.preserveRngState) {
    run->rng = recompute_state::RngStates::capture(cudaDevicesOf(inputs, params));
  }
  run->autocast = recompute_state::AutocastState::current();
  run->firstOutputs = firstRun(*run, inputs, params);
  return RecomputeFunction::apply(std::move(run), at::TensorList(inputs), at::TensorList(params));
}

}  // namespace detail

}  // namespace dtrain
