// The worker of zero_bench: times Adam training steps of a deep MLP under plain DDP or a
// ShardedOptimizer, in turns with the other job (Note [Turns]), and measures model-state bytes
// (from the tensors' storages), PSS (smaps_rollup: RSS counts the shared-memory segment in every
// rank) and the payload bytes of each step (Communicator::payloadBytes()).
#include <chrono>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "../ddp/bench_process.h"
#include "dtrain/base/error.h"
#include "dtrain/torch/ddp.h"
#include "dtrain/torch/init.h"
#include "dtrain/torch/zero.h"
#include "zero_bench.h"

namespace dtrain::bench {

namespace {

using Clock = std::chrono::steady_clock;

// The model: Linear layers with ReLU between, io -> width -> ... -> width -> io. Each hidden
// weight (64 MiB at the defaults) is a unit of its own, as a transformer layer's would be.
struct DeepMlpImpl : torch::nn::Module {
  DeepMlpImpl(int64_t io, int64_t width, int layers) {
    for (int l = 0; l < layers; ++l) {
      const int64_t in = l == 0 ? io : width;
      const int64_t out = l + 1 == layers ? io : width;
      net->push_back(torch::nn::Linear(in, out));
      if (l + 1 < layers) net->push_back(torch::nn::ReLU());
    }
    register_module("net", net);
  }
  torch::Tensor forward(const torch::Tensor& x) { return net->forward(x); }
  torch::nn::Sequential net;
};
TORCH_MODULE(DeepMlp);

double msOf(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// This process's proportional set size: its private pages plus its share of shared ones.
double pssBytes() {
  std::ifstream in("/proc/self/smaps_rollup");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("Pss:", 0) == 0) return 1024.0 * std::stod(line.substr(4));
  }
  return 0;
}

// Bytes the tensors' storages cover, each byte once.
double coveredBytes(const std::vector<torch::Tensor>& tensors) {
  std::vector<std::pair<uintptr_t, uintptr_t>> spans;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    auto b = reinterpret_cast<uintptr_t>(t.storage().data());
    spans.emplace_back(b, b + t.storage().nbytes());
  }
  std::sort(spans.begin(), spans.end());
  double bytes = 0;
  uintptr_t reached = 0;
  for (const auto& [b, e] : spans) {
    const uintptr_t from = std::max(b, reached);
    if (e > from) bytes += static_cast<double>(e - from);
    reached = std::max(reached, e);
  }
  return bytes;
}

// DDP's model state: parameters, their gradients (DDP's buckets), Adam's moments.
double ddpStateBytes(DeepMlp& net, torch::optim::Adam& adam) {
  std::vector<torch::Tensor> tensors;
  for (auto& p : net->parameters()) {
    tensors.push_back(p);
    tensors.push_back(p.grad());
  }
  for (auto& [key, state] : adam.state()) {
    auto& s = static_cast<torch::optim::AdamParamState&>(*state);
    tensors.push_back(s.exp_avg());
    tensors.push_back(s.exp_avg_sq());
  }
  return coveredBytes(tensors);
}

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(DistributedDataParallel<DeepMlp>& ddp,
                                                       int stage) {
  const torch::optim::AdamOptions adamOptions(1e-4);
  if (stage == 0) return std::make_unique<torch::optim::Adam>(ddp.parameters(), adamOptions);
  ZeroOptions zo;
  zo.stage = stage;
  return std::make_unique<ShardedOptimizer>(
      ddp, optimizerFactory<torch::optim::Adam>(adamOptions), zo);
}

// One rank's training: the model under DDP, its optimizer and the batch every step uses.
struct Training {
  ProcessGroup& group;
  DeepMlp& net;
  DistributedDataParallel<DeepMlp>& ddp;
  torch::optim::Optimizer& optimizer;
  ShardedOptimizer* sharded;  // the optimizer when the stage is 1 or 2, else null
  torch::Tensor x, y;
};

// The warm-up and timed steps, each in this job's turn; records the timed ones' breakdown.
void timeSteps(const ZeroConfig& config, const Training& t, ZeroResult& r) {
  comm::Communicator& comm = t.group.communicator();
  TurnTaker turns(config.turns, t.group.rank() == 0);
  for (int i = 0; i < config.warmup + config.steps; ++i) {
    turns.begin();
    t.group.barrier();
    const uint64_t payload0 = comm.payloadBytes();
    const auto t0 = Clock::now();
    if (t.sharded) {
      t.sharded->zero_grad();  // unsets the shards' gradients: see ShardedOptimizer::zero_grad()
    } else {
      t.optimizer.zero_grad();
    }
    const auto t1 = Clock::now();
    torch::mse_loss(t.ddp(t.x), t.y).backward();
    const auto t2 = Clock::now();
    t.optimizer.step();
    const auto t3 = Clock::now();
    const uint64_t payload = comm.payloadBytes() - payload0;
    t.group.barrier();
    turns.end();
    if (i < config.warmup) continue;
    const double backwardWait = msOf(t.ddp.lastIteration().waited);
    double optimizerMs = msOf(t3 - t2), stepWait = 0;
    if (t.sharded) {
      const ZeroStats s = t.sharded->stats();
      optimizerMs = msOf(s.optimizerStep);
      stepWait = msOf(s.allgatherWait);
    }
    r.stepMs.push_back(msOf(t3 - t0));
    r.computeMs.push_back(msOf(t2 - t1) - backwardWait);
    r.commMs.push_back(backwardWait + stepWait);
    r.optimizerMs.push_back(optimizerMs);
    r.otherMs.push_back(r.stepMs.back() - r.computeMs.back() - r.commMs.back() - optimizerMs);
    r.payloadBytes.push_back(static_cast<double>(payload));
  }
}

// Model state, every rank's PSS, and the gradients held after a noSync() micro-batch; ends with
// a synchronising step.
void measureMemory(const Training& t, ZeroResult& r) {
  if (t.sharded) {
    r.stateBytes = static_cast<double>(t.sharded->stats().memory.modelState());
    r.bucketBytes = static_cast<double>(t.sharded->stats().memory.buckets);
  } else {
    r.stateBytes = ddpStateBytes(t.net, static_cast<torch::optim::Adam&>(t.optimizer));
  }
  const auto pss = t.group.allgather(torch::tensor({pssBytes()}, torch::kDouble));
  for (const auto& p : pss) r.pssBytes.push_back(p.item<double>());
  // Accumulation: the gradients a rank holds after a noSync() micro-batch (Note [Sharded
  // backward]: stage 2 keeps them full-size, in .grad, until the synchronising backward).
  t.optimizer.zero_grad();
  {
    auto guard = t.ddp.noSync();
    torch::mse_loss(t.ddp(t.x), t.y).backward();
  }
  if (t.sharded) {
    const ZeroMemory m = t.sharded->stats().memory;
    r.noSyncGradientBytes = static_cast<double>(m.gradients + m.looseGradients);
  } else {
    std::vector<torch::Tensor> grads;
    for (auto& p : t.net->parameters()) grads.push_back(p.grad());
    r.noSyncGradientBytes = coveredBytes(grads);
  }
  // The synchronising backward, so that the ranks end alike.
  torch::mse_loss(t.ddp(t.x), t.y).backward();
  t.optimizer.step();
}

}  // namespace

int runZeroWorker(const ZeroConfig& config) {
  torch::set_num_threads(1);
  auto group = init();
  torch::manual_seed(group->rank());  // each rank its own data; DDP broadcasts rank 0's model
  DeepMlp net(config.io, config.width, config.layers);
  const auto x = torch::randn({config.batch, config.io});
  const auto y = torch::randn({config.batch, config.io});
  DistributedDataParallel<DeepMlp> ddp(net, group);
  const auto optimizer = makeOptimizer(ddp, config.stage);
  const Training training{*group, net, ddp, *optimizer,
                          dynamic_cast<ShardedOptimizer*>(optimizer.get()), x, y};
  ZeroResult r;
  r.stage = config.stage;
  r.world = group->size();
  r.backend = group->backend();
  for (const auto& p : ddp.parameters()) r.parameters += p.numel();
  timeSteps(config, training, r);
  measureMemory(training, r);
  if (group->rank() == 0 && !config.out.empty()) std::ofstream(config.out) << toJson(r) << "\n";
  group->barrier();
  group->shutdown();
  return 0;
}

std::string toJson(const ZeroResult& r) {
  nlohmann::json j = {{"stage", r.stage},         {"world", r.world},
                      {"parameters", r.parameters}, {"backend", r.backend},
                      {"step_ms", r.stepMs},       {"compute_ms", r.computeMs},
                      {"comm_ms", r.commMs},       {"optimizer_ms", r.optimizerMs},
                      {"other_ms", r.otherMs},     {"payload_bytes", r.payloadBytes},
                      {"state_bytes", r.stateBytes}, {"bucket_bytes", r.bucketBytes},
                      {"pss_bytes", r.pssBytes},   {"nosync_gradient_bytes", r.noSyncGradientBytes}};
  return j.dump();
}

ZeroResult zeroResultFromJson(const std::string& text) {
  auto j = nlohmann::json::parse(text);
  ZeroResult r;
  r.stage = j.at("stage").get<int>();
  r.world = j.at("world").get<int>();
  r.parameters = j.at("parameters").get<int64_t>();
  r.backend = j.at("backend").get<std::string>();
  r.stepMs = j.at("step_ms").get<std::vector<double>>();
  r.computeMs = j.at("compute_ms").get<std::vector<double>>();
  r.commMs = j.at("comm_ms").get<std::vector<double>>();
  r.optimizerMs = j.at("optimizer_ms").get<std::vector<double>>();
  r.otherMs = j.at("other_ms").get<std::vector<double>>();
  r.payloadBytes = j.at("payload_bytes").get<std::vector<double>>();
  r.stateBytes = j.at("state_bytes").get<double>();
  r.bucketBytes = j.at("bucket_bytes").get<double>();
  r.pssBytes = j.at("pss_bytes").get<std::vector<double>>();
  r.noSyncGradientBytes = j.at("nosync_gradient_bytes").get<double>();
  return r;
}

}  // namespace dtrain::bench
