#pragma once
// zero_bench's layers and the probes that time them from outside the library: each layer of the
// MLP (a Linear and its ReLU) records when its forward starts and ends, when the gradient of its
// output reaches it in backward and when it has computed the gradient of its input. The gaps
// between those marks are where ZeRO-3 waits for its all-gathers (Note [Timing the gathers]).
//
// Note [Timing the gathers]
// Stage 3 waits for a unit's all-gather (issued then, or earlier by a prefetch) in forward inside
// ShardedUnit::forward, before the module runs; in backward inside the GatherForBackward node at
// the unit's boundary, which runs after the next unit has computed the gradient of its input and
// before any node of this unit. A layer's probes sit inside its unit (the ShardedUnit wraps the
// TimedLayer), so
//   forward:  the all-gathers = forward's wall time - the time spent inside the layers;
//   backward: layer k's all-gather = (its output's gradient arrives) - (layer k+1 finished the
//             gradient of its input); for the last layer, the probe on the model's output.
// The library counts the same waits (ZeroStats::unitGatherWait, which zero_bench reports); the
// probes check that count from outside, and include the issue of a prefetched gather. Other
// stages gather nothing there: the same gaps measure the wrapper's own forward and the autograd
// engine's hops, microseconds. A unit's accumulator hooks (copies into buckets, reduce-scatter
// launches, the wait when more buckets are in flight than allowed) run before the gradient of its
// input is handed on, so they fall inside the layer's interval, as at stage 2.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

namespace dtrain::bench {

// The marks of one step, in the order they happened.
class ProbeLog {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Kind { ForwardBegin, ForwardEnd, GradOut, GradIn };
  struct Mark {
    Kind kind;
    int layer;
    Clock::time_point at;
  };

  // Called at every mark: bytes of full parameters alive then (stage 3: the gathered units).
  std::function<double()> sampleFullBytes;

  void record(Kind kind, int layer);
  void clear();
  const std::vector<Mark>& marks() const { return marks_; }
  double peakFullBytes() const { return peakFullBytes_; }

 private:
  std::vector<Mark> marks_;
  double peakFullBytes_ = 0;
};

// The step's gathers, per Note [Timing the gathers]; milliseconds.
struct GatherSplit {
  double forwardMs = 0;   // forward's wall time outside the layers
  double backwardMs = 0;  // backward's gaps between one layer's input and the previous' output
};
// `forward`: the wall time of the model's forward; `layers`: how many TimedLayers it has (the
// probe on the model's output is layer `layers`).
GatherSplit splitGathers(const ProbeLog& log, std::chrono::steady_clock::duration forward,
                         int layers);

// Records `kind` of `layer` into `log` when backward passes through it; the identity.
at::Tensor probeBackward(const at::Tensor& x, ProbeLog::Kind kind, int layer, ProbeLog* log);

// A Linear layer, followed by a ReLU unless it is the last, with its probes.
class TimedLayerImpl : public torch::nn::Module {
 public:
  TimedLayerImpl(int64_t in, int64_t out, bool relu, int layer, std::shared_ptr<ProbeLog> log);
  at::Tensor forward(const at::Tensor& x);

 private:
  torch::nn::Linear linear_{nullptr};
  bool relu_;
  int layer_;
  std::shared_ptr<ProbeLog> log_;
};
TORCH_MODULE(TimedLayer);

}  // namespace dtrain::bench
