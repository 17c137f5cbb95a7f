// The worker of zero_bench: times Adam training steps of a deep MLP under plain DDP or a
// ShardedOptimizer (stage 3: every layer a ShardedUnit, built whole or sharded as built), in
// turns with the other jobs (Note [Turns]), and measures what building the model and its
// optimizer held at the most (Note [Build peak]), the most a step holds (Note [Peak in a step]),
// model-state bytes (from the tensors' storages), PSS (smaps_rollup: RSS counts the shared-memory
// segment in every rank), the full
// parameters alive at once, the payload bytes of each step (Communicator::payloadBytes()) and
// what its collectives cost alone.
#include <dlfcn.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/bench_process.h"
#include "counting_allocator.h"
#include "dtrain/base/error.h"
#include "dtrain/torch/autocast.h"
#include "dtrain/torch/ddp.h"
#include "dtrain/torch/fully_shard.h"
#include "dtrain/torch/init.h"
#include "dtrain/torch/zero.h"
#include "layer_probe.h"
#include "zero_bench.h"

namespace dtrain::bench {

namespace {

using Clock = std::chrono::steady_clock;

// Every rank's model, whichever job (Note [Build peak]); each rank's data comes from a seed of
// its own after it.
constexpr uint64_t kModelSeed = 0;

// How the model's units come to be: none (stages 0-2), every layer marked and built whole (the
// optimizer shards them), or every layer sharded the moment it is built (fullyShard).
enum class Units { None, MarkedWhole, ShardedAsBuilt };

// The model: Linear layers with ReLU between, io -> width -> ... -> width -> io, each with its
// probes (layer_probe.h). Each hidden weight (64 MiB at the defaults) is a unit of its own, as a
// transformer layer's would be: at stage 3 every layer is a ShardedUnit. The layers are built in
// the same order whatever `units`, so the same seed gives the same values; there are no
// parameters outside them (no root unit).
struct DeepMlpImpl : torch::nn::Module {
  DeepMlpImpl(const ZeroConfig& c, Units units, const ProcessGroup& group,
              const std::shared_ptr<ProbeLog>& log) {
    for (int l = 0; l < c.layers; ++l) {
      const int64_t in = l == 0 ? c.io : c.width;
      const int64_t out = l + 1 == c.layers ? c.io : c.width;
      TimedLayer layer(in, out, /*relu=*/l + 1 < c.layers, l, log);
      if (units == Units::ShardedAsBuilt) {
        net->push_back(fullyShard(layer, group));
      } else {
        net->push_back(layer);
      }
    }
    if (units == Units::MarkedWhole) net = shardEveryChild(net);
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

// The storage of Adam's state (moments and step counts), as ZeroMemory::optimizerState counts
// a shard's.
double adamStateBytes(torch::optim::Adam& adam) {
  double bytes = 0;
  for (auto& [key, state] : adam.state()) {
    auto& s = static_cast<torch::optim::AdamParamState&>(*state);
    for (const auto& t : {s.exp_avg(), s.exp_avg_sq(), s.max_exp_avg_sq()}) {
      if (t.defined()) bytes += static_cast<double>(t.storage().nbytes());
    }
  }
  return bytes;
}

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(DistributedDataParallel<DeepMlp>& ddp,
                                                       const ZeroConfig& config) {
  const int stage = config.stage;
  const torch::optim::AdamOptions adamOptions(1e-4);
  if (stage == 0) return std::make_unique<torch::optim::Adam>(ddp.parameters(), adamOptions);
  ZeroOptions zo;
  zo.stage = stage;
  zo.forwardPrefetch = config.forwardPrefetch;
  zo.deferAllgatherWait = config.defer;
  zo.bucketsInFlight = config.bucketsInFlight;
  if (stage == 3 && config.paramDtype) zo.paramDtype = at::kBFloat16;
  return std::make_unique<ShardedOptimizer>(ddp, optimizerFactory<torch::optim::Adam>(adamOptions),
                                            zo);
}

// Note [Communication alone]
// How much of a step's communication is hidden behind compute needs what that communication
// costs by itself. After each timed step, still in its turn, the collectives the method issues
// in a step run once more, synchronously and with nothing else to do, on buffers of the layers'
// sizes (padded to N blocks, as the units are): DDP an allreduce per layer, ZeRO-1/2 a
// reduce-scatter and an all-gather, ZeRO-3 two all-gathers (forward, backward) and a
// reduce-scatter. hidden = 1 - waited / alone, per step. Stage 1 and 2 plan their units by size,
// not by layer: the same bytes in a few more or fewer calls.
class CollectivesAlone {
 public:
  CollectivesAlone(comm::Communicator& comm, int stage, const std::vector<int64_t>& layerNumels)
      : comm_(comm), stage_(stage) {
    const auto n = static_cast<size_t>(comm.size());
    size_t most = 0;
    for (int64_t numel : layerNumels) {
      blocks_.push_back((static_cast<size_t>(numel) + n - 1) / n);
      most = std::max(most, blocks_.back() * n);
    }
    full_ = comm.allocate(most * sizeof(float));
    block_ = comm.allocate(most / n * sizeof(float));
    std::memset(full_->data(), 0, full_->bytes());  // no NaN or denormal in the sums
    std::memset(block_->data(), 0, block_->bytes());
  }

  // Milliseconds the step's collectives take by themselves. Collective.
  double run() {
    const auto start = Clock::now();
    const auto f32 = comm::DataType::Float32;
    for (size_t block : blocks_) {
      const size_t full = block * static_cast<size_t>(comm_.size());
      if (stage_ == 0) {
        comm_.allreduce(full_->data(), full, f32, comm::ReduceOp::Sum);
        continue;
      }
      for (int g = 0; g < (stage_ == 3 ? 2 : 1); ++g) {
        comm_.allgather(block_->data(), full_->data(), block, f32);
      }
      comm_.reduceScatter(full_->data(), block_->data(), block, f32, comm::ReduceOp::Sum);
    }
    return msOf(Clock::now() - start);
  }

 private:
  comm::Communicator& comm_;
  const int stage_;
  std::vector<size_t> blocks_;  // elements per rank, per layer
  std::shared_ptr<comm::Buffer> full_, block_;
};

// One rank's training: the model under DDP, its optimizer and the batch every step uses.
struct Training {
  ProcessGroup& group;
  DeepMlp& net;
  DistributedDataParallel<DeepMlp>& ddp;
  torch::optim::Optimizer& optimizer;
  ShardedOptimizer* sharded;  // the optimizer when the stage is 1, 2 or 3, else null
  ProbeLog& probes;
  int layers;
  torch::Tensor x, y;
  int micro = 1;          // ZeroConfig::micro
  bool autocast = false;  // ZeroConfig::autocast
};

// The model's output for the batch, under autocast when the job asks for it.
torch::Tensor forwardOf(const Training& t) {
  AutocastGuard autocast(torch::kCPU, t.autocast);
  return t.ddp(t.x);
}

torch::Tensor lossOf(const torch::Tensor& out, const Training& t) {
  return torch::mse_loss(out.to(torch::kFloat), t.y);
}

// The step's forwards and backwards (ZeroConfig::micro: all but the last under noSync()); returns
// the last forward's wall time.
Clock::duration forwardBackward(const Training& t) {
  for (int m = 0; m + 1 < t.micro; ++m) {
    auto guard = t.ddp.noSync();
    lossOf(forwardOf(t), t).backward();
  }
  const auto start = Clock::now();
  torch::Tensor out = forwardOf(t);
  const auto forward = Clock::now() - start;
  torch::Tensor loss = lossOf(probeBackward(out, ProbeLog::Kind::GradIn, t.layers, &t.probes), t);
  out.reset();  // what backward needs of the output, autograd keeps: as the peer's one expression
  loss.backward();
  return forward;
}

// Note [Data phase]
// A training loop loads its next batch between step() and the next forward. --data-mib M stands
// in for it: every job, after step(), normalises M MiB of 8-bit pixels into float32 (an image
// pipeline's last stage: a conversion and two passes, in buffers made once, so no page is touched
// for the first time). Plain DDP and a ZeRO job that waits in step() have nothing to run beside
// it; a job with deferAllgatherWait has its last all-gathers, waited for after it
// (waitForParameters(), where the next forward would wait, before the turn ends).
class DataPhase {
 public:
  explicit DataPhase(double mib) {
    const auto n = static_cast<int64_t>(mib * (1 << 20));
    if (n <= 0) return;
    pixels_ = torch::randint(0, 256, {n}, torch::kUInt8);
    out_ = torch::empty({n}, torch::kFloat);
    run();  // touches the output's pages once, before the timed steps
  }
  void run() {
    if (!pixels_.defined()) return;
    out_.copy_(pixels_);
    out_.sub_(127.5).mul_(1.0 / 64);
  }

 private:
  torch::Tensor pixels_, out_;
};

// Note [Waiting for the others]
// A rank's step ends when its own work does, but the job's step ends when every rank's has: the
// next collective waits for the slowest. Each turn begins with a barrier (the ranks start
// together) and ends with one, so a rank that finished early waits there -- uncounted by the
// step's columns. That hides different things by method: DDP's ranks part after their last
// allreduce and each runs Adam over all Ψ alone, so its optimizer's skew between ranks lands in
// the barrier; ZeRO's ranks meet again at the all-gather after their steps, so theirs lands in
// `comm` (in step(), or deferred after the data phase). The turn's closing barrier is timed on
// rank 0 (endWaitMs), and comm + that wait is what each method waited for the others in a step,
// wherever the wait fell.

// Note [Peak in a step]
// What a rank holds at the most in a training step, for the comparison with PyTorch's FSDP2 and
// ZeroRedundancyOptimizer (benchmarks/zero/zero_peer.py counts its side with the same counting
// allocator, loaded when its process starts): CPU tensor storage alive, counted from the
// worker's start (the model, its gradients, the optimizer's state, the batch, activations, the
// parts gathered into tensors), plus the communicator's buffers in use, where ZeRO keeps what
// PyTorch's FSDP2 holds in tensors: gathered units and gradient buckets (stage 1: the units'
// full gradients). Each is reset when a timed step begins and read when it ends, the most over
// the timed steps. Two ways:
//   - at one moment, when the counting library (benchmarks/recompute/counting_library.cpp) is
//     preloaded with DTRAIN_COUNTING_PEAK_FILE set, as zero_peer_bench.py runs this worker: the
//     library counts both at every buffer event (Note [Communicator buffers] there), and
//     dtrain_counting_window_start / _peaks bound the step. This is the figure set beside the
//     peer's, whose buffers are tensors counted at the same moments;
//   - apart, always: the tensor storage's peak (the installed CountingCpuAllocator) and the
//     buffers' (Communicator::bufferStats()), whose sum bounds the step's peak from above.
// Reported beside them, not in them: the buffers in use between steps (held), and the
// communicator's cache of released buffers after the timed steps (idle: resident memory nobody
// uses, what the OOM killer sees too, as the allocator's free lists on the peer's side). The
// benchmark's own buffers (CollectivesAlone) are left out of all of them.
struct StepWindow {
  using Start = void (*)();
  using Peaks = void (*)(int64_t*, int64_t*);
  Start start = reinterpret_cast<Start>(::dlsym(RTLD_DEFAULT, "dtrain_counting_window_start"));
  Peaks peaks = reinterpret_cast<Peaks>(::dlsym(RTLD_DEFAULT, "dtrain_counting_window_peaks"));

  bool counted() const { return start != nullptr && peaks != nullptr; }
};

// /proc/self/io's wchar: bytes this process passed to write() and its kin, Gloo's sockets
// among them (its TCP pairs send with writev; sendmsg() would not count).
double writtenBytes() {
  std::ifstream in("/proc/self/io");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("wchar:", 0) == 0) return std::stod(line.substr(6));
  }
  return 0;
}

// The warm-up and timed steps, each in this job's turn; records the timed ones' breakdown.
void timeSteps(const ZeroConfig& config, const Training& t, ZeroResult& r) {
  comm::Communicator& comm = t.group.communicator();
  std::vector<int64_t> layerNumels;
  for (const auto& layer : t.net->net->children()) {
    int64_t numel = 0;
    for (const auto& p : layer->parameters()) numel += p.numel();
    layerNumels.push_back(numel);
  }
  const size_t buffersBefore = comm.bufferStats().inUseBytes;
  CollectivesAlone alone(comm, config.stage, layerNumels);
  const auto aloneBuffers = static_cast<double>(comm.bufferStats().inUseBytes - buffersBefore);
  DataPhase data(config.dataMib);
  TurnTaker turns(config.turns, t.group.rank() == 0);
  auto& storage = testing::CountingCpuAllocator::install();
  const StepWindow window;  // Note [Peak in a step]
  double peakStorage = 0, peakComm = 0, heldComm = 0, peakBoth = -1;
  for (int i = 0; i < config.warmup + config.steps; ++i) {
    turns.begin();
    t.group.barrier();
    t.probes.clear();
    const uint64_t payload0 = comm.payloadBytes();
    const double written0 = writtenBytes();
    storage.resetPeak();
    comm.resetBufferPeak();
    if (window.counted()) window.start();
    const auto t0 = Clock::now();
    if (t.sharded) {
      t.sharded->zero_grad();  // unsets the shards' gradients: see ShardedOptimizer::zero_grad()
    } else {
      t.optimizer.zero_grad();
    }
    const auto t1 = Clock::now();
    const auto forward = forwardBackward(t);
    const auto t2 = Clock::now();
    t.optimizer.step();
    const auto t3 = Clock::now();
    data.run();
    const auto t4 = Clock::now();
    if (t.sharded) t.sharded->waitForParameters();  // deferred: where the next forward waits
    const auto t5 = Clock::now();
    const uint64_t payload = comm.payloadBytes() - payload0;
    const double written = writtenBytes() - written0;
    auto stepPeak = static_cast<double>(storage.peak());
    int64_t windowTensors = -1, windowBoth = -1;
    if (window.counted()) window.peaks(&windowTensors, &windowBoth);
    const comm::BufferStats buffers = comm.bufferStats();
    t.group.barrier();  // Note [Waiting for the others]
    const auto t6 = Clock::now();
    const double aloneMs = alone.run();
    turns.end();
    if (i < config.warmup) continue;
    const double backwardWait = msOf(t.ddp.lastIteration().waited);
    double optimizerMs = msOf(t3 - t2), stepWait = 0, gatherMs = 0;
    if (t.sharded) {
      const ZeroStats s = t.sharded->stats();
      optimizerMs = msOf(s.optimizerStep);
      stepWait = msOf(s.allgatherWait);
      gatherMs = msOf(s.unitGatherWait);  // stage 3's units, in forward and backward
      r.peakGatheredBytes = std::max(r.peakGatheredBytes, double(s.memory.peakGathered));
    }
    // The same waits seen from the layers, to check the library's count (Note [Timing the
    // gathers]).
    const GatherSplit probed = splitGathers(t.probes, forward, t.layers);
    r.probedGatherMs.push_back(probed.forwardMs + probed.backwardMs);
    r.stepMs.push_back(msOf(t5 - t0));
    r.dataMs.push_back(msOf(t4 - t3));
    r.endWaitMs.push_back(msOf(t6 - t5));
    r.computeMs.push_back(msOf(t2 - t1) - backwardWait - gatherMs);
    r.commMs.push_back(backwardWait + stepWait + gatherMs);
    r.gatherMs.push_back(gatherMs);
    r.backwardWaitMs.push_back(backwardWait);
    r.stepWaitMs.push_back(stepWait);
    r.aloneMs.push_back(aloneMs);
    r.optimizerMs.push_back(optimizerMs);
    r.otherMs.push_back(r.stepMs.back() - r.computeMs.back() - r.commMs.back() - optimizerMs);
    r.payloadBytes.push_back(static_cast<double>(payload));
    r.socketBytes.push_back(written);
    if (windowBoth >= 0) {
      // The library's own count: the allocator installed here may be the library's one, whose
      // peak it restarts at every buffer event.
      stepPeak = static_cast<double>(windowTensors);
      peakBoth = std::max(peakBoth, static_cast<double>(windowBoth) - aloneBuffers);
    }
    peakStorage = std::max(peakStorage, stepPeak);
    peakComm = std::max(peakComm, static_cast<double>(buffers.peakInUseBytes) - aloneBuffers);
    heldComm = std::max(heldComm, static_cast<double>(buffers.inUseBytes) - aloneBuffers);
    r.peakFullBytes = std::max(r.peakFullBytes, t.probes.peakFullBytes());
  }
  // Note [Peak in a step]: every rank's.
  const auto idleComm = static_cast<double>(comm.bufferStats().cachedBytes);
  double optimizerState = 0;
  if (t.sharded) {
    optimizerState = static_cast<double>(t.sharded->stats().memory.optimizerState);
  } else {
    optimizerState = adamStateBytes(static_cast<torch::optim::Adam&>(t.optimizer));
  }
  const auto ranks = t.group.allgather(torch::tensor(
      {peakStorage, peakComm, heldComm, idleComm, optimizerState, peakBoth}, torch::kDouble));
  for (const auto& b : ranks) {
    r.stepPeakStorageBytes.push_back(b[0].item<double>());
    r.commPeakBytes.push_back(b[1].item<double>());
    r.commHeldBytes.push_back(b[2].item<double>());
    r.commIdleBytes.push_back(b[3].item<double>());
    r.optimizerStateBytes.push_back(b[4].item<double>());
    if (b[5].item<double>() >= 0) r.stepPeakBytes.push_back(b[5].item<double>());
  }
}

// The gradients a rank holds after eight noSync() micro-batches (Note [Sharded backward]: stages
// 2 and 3 reduce-scatter each into the shard's gradient by default; DDP, stage 1 and
// Accumulation::Local keep them full-size until the synchronising backward).
double noSyncGradientBytes(const Training& t) {
  for (int micro = 0; micro < 8; ++micro) {
    auto guard = t.ddp.noSync();
    lossOf(forwardOf(t), t).backward();
  }
  if (t.sharded) {
    const ZeroMemory m = t.sharded->stats().memory;
    return static_cast<double>(m.gradients + m.looseGradients);
  }
  std::vector<torch::Tensor> grads;
  for (auto& p : t.net->parameters()) grads.push_back(p.grad());
  return coveredBytes(grads);
}

// Note [Held for backward]
// What a forward leaves alive for its backward, from the counting allocator (a process per rank,
// so it counts this rank): storage alive after the forward minus before it, in a step like the
// timed ones (its pools warm). The graph holds the activations autograd saved and, under
// autocast, the lower-precision copies of the weights it cast (a Linear saves its cast weight):
// ~2 bytes per parameter of every layer, freed or not at the unit's reshard, unless stage 3
// gathers its units in the compute dtype (ZeroOptions::paramDtype), when the cast finds the
// weight in its own dtype and the graph saves the unit's parameter itself -- freed at reshard,
// gathered again for backward. A synchronising step.
double heldForBackward(const Training& t) {
  const testing::CountingCpuAllocator& storage = testing::CountingCpuAllocator::install();
  const int64_t before = storage.live();
  torch::Tensor out = forwardOf(t);
  const int64_t held = storage.live() - before;
  lossOf(out, t).backward();
  t.optimizer.step();
  return static_cast<double>(held);
}

// Model state, every rank's PSS, and the gradients held after a noSync() micro-batch; ends with
// a synchronising step.
void measureMemory(const Training& t, ZeroResult& r) {
  if (t.sharded) {
    const ZeroMemory m = t.sharded->stats().memory;
    r.stateBytes = static_cast<double>(m.modelState());
    r.bucketBytes = static_cast<double>(m.buckets);
    r.ownedParameterBytes = static_cast<double>(m.parameters);
  } else {
    r.stateBytes = ddpStateBytes(t.net, static_cast<torch::optim::Adam&>(t.optimizer));
  }
  const auto pss = t.group.allgather(torch::tensor({pssBytes()}, torch::kDouble));
  for (const auto& p : pss) r.pssBytes.push_back(p.item<double>());
  t.optimizer.zero_grad();
  r.noSyncGradientBytes = noSyncGradientBytes(t);
  // The synchronising backward, so that the ranks end alike.
  lossOf(forwardOf(t), t).backward();
  t.optimizer.step();
  t.optimizer.zero_grad();
  r.heldBytes = heldForBackward(t);
}

// Note [Build peak]
// What building the model held at the most on a rank, from its first layer's construction
// through the end of the optimizer's constructor (at stage 3, every unit bound), above what was
// alive before; also the storage's peak while the layers alone were built (before
// DistributedDataParallel: at stage 3, what fullyShard bounds) and what is left when the
// optimizer is made (the bound model, the optimizer's shards). Two counts, since neither sees
// everything:
//   storage:  libtorch's CPU tensor storage, through a counting allocator installed in front of
//             libtorch's at the worker's start (testing/counting_allocator.h): the
//             parameters as built, the blocks kept, the parts gathered again to bind, the
//             optimizer's shards. It does not see the communicator's buffers
//             (Communicator::allocate), which the shared-memory backend places in its segment:
//             DDP's gradient buckets (the whole model's size, when the model is built whole; none
//             for units sharded as built, Note [Units sharded when built]) and each unit's full
//             buffer while it is bound.
//   resident: the growth of this process's peak resident set (VmHWM, reset through
//             /proc/self/clear_refs when the build begins), which counts those too -- and
//             anything else the process first touches then: libtorch's own allocations, the
//             pages of the peers' shared buffers this rank reads in a collective (DDP's broadcast
//             of rank 0's values). -1 where the kernel cannot reset it.
// Whole, the model is held twice at the storage's peak: DistributedDataParallel's broadcast of
// rank 0's values copies it into one flat tensor (ddp::CoalescedBroadcast), which fullyShard's
// units skip.

// This process's `field` of /proc/self/status ("VmRSS:", "VmHWM:"), in bytes.
double statusBytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field, 0) == 0) return 1024.0 * std::stod(line.substr(field.size()));
  }
  return 0;
}

// Note [Build peak]: starts the window when made.
class BuildPeak {
 public:
  struct Bytes {
    double storage = 0, layers = 0, left = 0, resident = -1;
  };

  explicit BuildPeak(testing::CountingCpuAllocator& storage)
      : storage_(storage), storageBefore_(storage.live()) {
    storage_.resetPeak();
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";  // VmHWM := VmRSS
    clear.flush();
    residentBefore_ = clear ? statusBytes("VmRSS:") : -1;
  }
  // The layers are built.
  void layersBuilt() { layers_ = sinceStart(storage_.peak()); }
  // The optimizer is made: ends the window.
  Bytes end() const {
    Bytes b;
    b.storage = sinceStart(storage_.peak());
    b.layers = layers_;
    b.left = sinceStart(storage_.live());
    if (residentBefore_ >= 0) b.resident = statusBytes("VmHWM:") - residentBefore_;
    return b;
  }

 private:
  testing::CountingCpuAllocator& storage_;
  const int64_t storageBefore_;
  double residentBefore_ = -1;
  double layers_ = 0;

  double sinceStart(int64_t bytes) const { return static_cast<double>(bytes - storageBefore_); }
};

}  // namespace

int runZeroWorker(const ZeroConfig& config) {
  // Before any tensor is made: storage made earlier would go uncounted (Note [Build peak]).
  testing::CountingCpuAllocator& storage = testing::CountingCpuAllocator::install();
  torch::set_num_threads(1);
  auto group = init();
  auto probes = std::make_shared<ProbeLog>();
  const Units units = config.stage != 3     ? Units::None
                      : config.buildSharded ? Units::ShardedAsBuilt
                                            : Units::MarkedWhole;
  BuildPeak build(storage);
  // The same seed on every rank: fullyShard needs every rank to build the same values (the
  // optimizer compares them), and the model built whole is then rank 0's, which DDP broadcasts.
  torch::manual_seed(kModelSeed);
  DeepMlp net(config, units, *group, probes);
  build.layersBuilt();
  DistributedDataParallel<DeepMlp> ddp(net, group);
  const auto optimizer = makeOptimizer(ddp, config);
  const BuildPeak::Bytes built = build.end();
  torch::manual_seed(kModelSeed + 1 + static_cast<uint64_t>(group->rank()));  // each rank its data
  const auto params = net->parameters();  // at stage 3, views of the units' buffers by now
  probes->sampleFullBytes = [params] { return coveredBytes(params); };
  const auto x = torch::randn({config.batch, config.io});
  const auto y = torch::randn({config.batch, config.io});
  const Training training{*group,
                          net,
                          ddp,
                          *optimizer,
                          dynamic_cast<ShardedOptimizer*>(optimizer.get()),
                          *probes,
                          config.layers,
                          x,
                          y,
                          config.micro,
                          config.autocast};
  ZeroResult r;
  r.stage = config.stage;
  r.buildSharded = config.buildSharded;
  r.defer = config.defer;
  r.bucketsInFlight = config.bucketsInFlight;
  r.world = group->size();
  r.backend = group->backend();
  for (const auto& p : ddp.parameters()) {
    r.parameters += p.numel();
    r.parameterBytes += static_cast<double>(p.numel() * p.element_size());
  }
  const auto ranks = group->allgather(
      torch::tensor({built.storage, built.layers, built.left, built.resident}, torch::kDouble));
  for (const auto& b : ranks) {
    r.buildStorageBytes.push_back(b[0].item<double>());
    r.buildLayersBytes.push_back(b[1].item<double>());
    r.buildLeftBytes.push_back(b[2].item<double>());
    r.buildResidentBytes.push_back(b[3].item<double>());
  }
  timeSteps(config, training, r);
  measureMemory(training, r);
  if (group->rank() == 0 && !config.out.empty()) std::ofstream(config.out) << toJson(r) << "\n";
  group->barrier();
  group->shutdown();
  return 0;
}

std::string toJson(const ZeroResult& r) {
  nlohmann::json j = {{"stage", r.stage},
                      {"build_sharded", r.buildSharded},
                      {"defer", r.defer},
                      {"buckets_in_flight", r.bucketsInFlight},
                      {"data_ms", r.dataMs},
                      {"end_wait_ms", r.endWaitMs},
                      {"world", r.world},
                      {"parameters", r.parameters},
                      {"backend", r.backend},
                      {"step_ms", r.stepMs},
                      {"compute_ms", r.computeMs},
                      {"comm_ms", r.commMs},
                      {"optimizer_ms", r.optimizerMs},
                      {"other_ms", r.otherMs},
                      {"payload_bytes", r.payloadBytes},
                      {"state_bytes", r.stateBytes},
                      {"bucket_bytes", r.bucketBytes},
                      {"pss_bytes", r.pssBytes},
                      {"nosync_gradient_bytes", r.noSyncGradientBytes},
                      {"gather_ms", r.gatherMs},
                      {"alone_ms", r.aloneMs},
                      {"backward_wait_ms", r.backwardWaitMs},
                      {"step_wait_ms", r.stepWaitMs},
                      {"probed_gather_ms", r.probedGatherMs},
                      {"peak_full_bytes", r.peakFullBytes},
                      {"peak_gathered_bytes", r.peakGatheredBytes},
                      {"owned_parameter_bytes", r.ownedParameterBytes},
                      {"parameter_bytes", r.parameterBytes},
                      {"build_storage_bytes", r.buildStorageBytes},
                      {"build_layers_bytes", r.buildLayersBytes},
                      {"build_left_bytes", r.buildLeftBytes},
                      {"build_resident_bytes", r.buildResidentBytes},
                      {"held_bytes", r.heldBytes},
                      {"step_peak_storage_bytes", r.stepPeakStorageBytes},
                      {"comm_peak_bytes", r.commPeakBytes},
                      {"comm_held_bytes", r.commHeldBytes},
                      {"comm_idle_bytes", r.commIdleBytes},
                      {"step_peak_bytes", r.stepPeakBytes},
                      {"optimizer_state_bytes", r.optimizerStateBytes},
                      {"socket_bytes", r.socketBytes}};
  return j.dump();
}

ZeroResult zeroResultFromJson(const std::string& text) {
  auto j = nlohmann::json::parse(text);
  ZeroResult r;
  r.stage = j.at("stage").get<int>();
  r.buildSharded = j.at("build_sharded").get<bool>();
  r.defer = j.at("defer").get<bool>();
  r.bucketsInFlight = j.at("buckets_in_flight").get<int>();
  r.dataMs = j.at("data_ms").get<std::vector<double>>();
  r.endWaitMs = j.at("end_wait_ms").get<std::vector<double>>();
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
  r.gatherMs = j.at("gather_ms").get<std::vector<double>>();
  r.aloneMs = j.at("alone_ms").get<std::vector<double>>();
  r.backwardWaitMs = j.at("backward_wait_ms").get<std::vector<double>>();
  r.stepWaitMs = j.at("step_wait_ms").get<std::vector<double>>();
  r.peakFullBytes = j.at("peak_full_bytes").get<double>();
  r.probedGatherMs = j.at("probed_gather_ms").get<std::vector<double>>();
  r.peakGatheredBytes = j.at("peak_gathered_bytes").get<double>();
  r.ownedParameterBytes = j.at("owned_parameter_bytes").get<double>();
  r.parameterBytes = j.at("parameter_bytes").get<double>();
  r.buildStorageBytes = j.at("build_storage_bytes").get<std::vector<double>>();
  r.buildLayersBytes = j.at("build_layers_bytes").get<std::vector<double>>();
  r.buildLeftBytes = j.at("build_left_bytes").get<std::vector<double>>();
  r.buildResidentBytes = j.at("build_resident_bytes").get<std::vector<double>>();
  r.heldBytes = j.at("held_bytes").get<double>();
  r.stepPeakStorageBytes = j.at("step_peak_storage_bytes").get<std::vector<double>>();
  r.commPeakBytes = j.at("comm_peak_bytes").get<std::vector<double>>();
  r.commHeldBytes = j.at("comm_held_bytes").get<std::vector<double>>();
  r.commIdleBytes = j.at("comm_idle_bytes").get<std::vector<double>>();
  r.stepPeakBytes = j.at("step_peak_bytes").get<std::vector<double>>();
  r.optimizerStateBytes = j.at("optimizer_state_bytes").get<std::vector<double>>();
  r.socketBytes = j.at("socket_bytes").get<std::vector<double>>();
  return r;
}

}  // namespace dtrain::bench
