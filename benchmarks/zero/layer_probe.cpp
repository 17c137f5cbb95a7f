// The probes of zero_bench's layers (layer_probe.h, Note [Timing the gathers]).
#include "layer_probe.h"

#include <algorithm>
#include <map>

#include <torch/autograd.h>

namespace dtrain::bench {

void ProbeLog::record(Kind kind, int layer) {
  marks_.push_back({kind, layer, Clock::now()});
  if (sampleFullBytes) peakFullBytes_ = std::max(peakFullBytes_, sampleFullBytes());
}

void ProbeLog::clear() {
  marks_.clear();
  peakFullBytes_ = 0;
}

GatherSplit splitGathers(const ProbeLog& log, std::chrono::steady_clock::duration forward,
                         int layers) {
  using Kind = ProbeLog::Kind;
  auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  std::map<std::pair<Kind, int>, ProbeLog::Clock::time_point> at;
  for (const auto& m : log.marks()) at.emplace(std::make_pair(m.kind, m.layer), m.at);
  auto find = [&](Kind kind, int layer) { return at.find({kind, layer}); };
  GatherSplit split;
  double inside = 0;
  for (int k = 0; k < layers; ++k) {
    const auto begin = find(Kind::ForwardBegin, k), end = find(Kind::ForwardEnd, k);
    if (begin != at.end() && end != at.end()) inside += ms(end->second - begin->second);
    const auto out = find(Kind::GradOut, k), next = find(Kind::GradIn, k + 1);
    if (out != at.end() && next != at.end()) split.backwardMs += ms(out->second - next->second);
  }
  split.forwardMs = std::max(0.0, ms(forward) - inside);
  return split;
}

namespace {

// The identity in forward; its backward records a mark. Holds the log as an address: the log
// outlives every graph of the step.
struct Probe : public torch::autograd::Function<Probe> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            int64_t kind, int64_t layer, int64_t log) {
    ctx->saved_data["kind"] = kind;
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["log"] = log;
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* log = reinterpret_cast<ProbeLog*>(ctx->saved_data["log"].toInt());
    log->record(static_cast<ProbeLog::Kind>(ctx->saved_data["kind"].toInt()),
                static_cast<int>(ctx->saved_data["layer"].toInt()));
    return {grads[0], at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor probeBackward(const at::Tensor& x, ProbeLog::Kind kind, int layer, ProbeLog* log) {
  if (!x.requires_grad()) return x;  // the model's input: no gradient reaches it
  return Probe::apply(x, static_cast<int64_t>(kind), static_cast<int64_t>(layer),
                      reinterpret_cast<intptr_t>(log));
}

TimedLayerImpl::TimedLayerImpl(int64_t in, int64_t out, bool relu, int layer,
                               std::shared_ptr<ProbeLog> log)
    : relu_(relu), layer_(layer), log_(std::move(log)) {
  linear_ = register_module("linear", torch::nn::Linear(in, out));
}

at::Tensor TimedLayerImpl::forward(const at::Tensor& x) {
  using Kind = ProbeLog::Kind;
  log_->record(Kind::ForwardBegin, layer_);
  at::Tensor y = linear_(probeBackward(x, Kind::GradIn, layer_, log_.get()));
  if (relu_) y = y.relu();
  y = probeBackward(y, Kind::GradOut, layer_, log_.get());
  log_->record(Kind::ForwardEnd, layer_);
  return y;
}

}  // namespace dtrain::bench
