#pragma once
// zero_bench's two halves: the driver (zero_bench.cpp) starts a DDP job and a ZeRO job per world
// size and stage, hands out their turns (Note [Turns] in benchmarks/common/bench_process.h) and
// prints the table; a worker (zero_bench_worker.cpp) times training steps of one of them and
// measures its memory and traffic.

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::bench {

struct ZeroConfig {
  int stage = 0;  // 0: plain DDP with torch::optim::Adam; 1, 2, 3: ShardedOptimizer
  // DeepMlp(io, width, layers): io -> width, layers - 2 hidden width x width, width -> io;
  // 92.3M parameters at the defaults.
  int64_t width = 4096;
  int64_t io = 1024;
  int layers = 7;
  int batch = 16;                // per rank
  bool forwardPrefetch = false;  // stage 3: ZeroOptions::forwardPrefetch
  // stage 3: every layer sharded the moment it is built (fullyShard), rather than built whole and
  // sharded by the optimizer (ShardedUnit)
  bool buildSharded = false;
  // stages 1 and 2: ZeroOptions::deferAllgatherWait (the job waits for the all-gathers after its
  // data phase, where the next forward would)
  bool defer = false;
  // stages 2 and 3: ZeroOptions::bucketsInFlight (gradient buckets waiting for their
  // reduce-scatter before backward waits for the oldest)
  int bucketsInFlight = 2;
  // MiB of 8-bit pixels each step normalises after step(), a stand-in for loading the next batch
  // (Note [Data phase] in zero_bench_worker.cpp); 0: none
  double dataMib = 0;
  // Micro-batches per step: all but the last under noSync() (ZeRO's default accumulation
  // reduce-scatters each; DDP allreduces once). Timed as part of forward + backward.
  int micro = 1;
  // Forwards and losses under AutocastGuard (bfloat16 on the CPU); paramDtype: stage 3's
  // ZeroOptions::paramDtype = bfloat16 (its units gathered in the compute dtype).
  bool autocast = false;
  bool paramDtype = false;
  int warmup = 2;
  int steps = 5;
  std::string out;    // rank 0 writes its result here (JSON)
  std::string turns;  // Note [Turns]; empty: run freely
};

// One job's measurement. Per step (milliseconds): the whole step and its parts -- forward and
// backward without the communication they waited for, the communication they and step() waited
// for (DDP: the end of backward on allreduces; ZeRO: on reduce-scatters, step() on all-gathers,
// and at stage 3 forward and backward on the units' all-gathers, ZeroStats::unitGatherWait),
// the optimizer's own step, the rest (zero_grad and bookkeeping) --, and what the step's
// collectives take by themselves (Note [Communication alone]).
struct ZeroResult {
  int stage = 0;
  bool buildSharded = false;
  bool defer = false;
  int bucketsInFlight = 2;
  int world = 0;
  int64_t parameters = 0;
  std::string backend;
  std::vector<double> stepMs, computeMs, commMs, optimizerMs, otherMs;
  std::vector<double> gatherMs;  // of commMs: stage 3's unit gathers (unitGatherWait)
  // Of commMs: the end of backward's wait (DDP's allreduces, ZeRO's reduce-scatters) and
  // step()'s wait for the all-gathers after its last unit's step (ZeroStats::allgatherWait).
  std::vector<double> backwardWaitMs, stepWaitMs;
  std::vector<double> dataMs;  // the data phase (Note [Data phase]), in otherMs
  // After the step, outside it: rank 0's wait for the other ranks to end theirs (Note [Waiting
  // for the others]).
  std::vector<double> endWaitMs;
  std::vector<double> probedGatherMs;  // the same waits from the layers' probes
  std::vector<double> aloneMs;         // the step's collectives by themselves
  std::vector<double> payloadBytes;    // rank 0's communicator, per step
  double stateBytes = 0;               // rank 0's model state, from the tensors' storages
  double bucketBytes = 0;              // ZeRO-2's gradient buckets
  std::vector<double> pssBytes;        // every rank's PSS after the timed steps
  double noSyncGradientBytes = 0;      // gradients held under noSync() (a last micro-batch)
  // Rank 0's CPU tensor storage alive after a forward (ZeroConfig::autocast's) above what was
  // alive before it: what the graph keeps for backward -- activations, and under autocast the
  // cast copies of weights it saved (Note [Held for backward] in zero_bench_worker.cpp).
  double heldBytes = 0;
  double peakFullBytes = 0;        // the most full-parameter bytes alive at once in a step
  double peakGatheredBytes = 0;    // the same from the library (ZeroMemory::peakGathered)
  double ownedParameterBytes = 0;  // the module's parameters between steps (stage 3: blocks)
  double parameterBytes = 0;       // the model's parameters in full
  // Every rank's, while the model and its optimizer were built (Note [Build peak] in
  // zero_bench_worker.cpp): the most CPU tensor storage counted, the same while the layers alone
  // were built, what was left at the end, and the growth of the peak resident set.
  std::vector<double> buildStorageBytes, buildLayersBytes, buildLeftBytes, buildResidentBytes;
  // Every rank's, over the timed steps (Note [Peak in a step] in zero_bench_worker.cpp): the most
  // CPU tensor storage alive at once, the most communicator buffers in use at once, those held
  // between steps, what the communicator keeps cached and unused after them, and the real
  // optimizers' state (ZeroMemory::optimizerState; DDP: Adam's).
  std::vector<double> stepPeakStorageBytes, commPeakBytes, commHeldBytes, commIdleBytes;
  // Tensor storage and communicator buffers at one moment, per rank; empty unless the counting
  // library is preloaded (Note [Peak in a step] in zero_bench_worker.cpp).
  std::vector<double> stepPeakBytes;
  std::vector<double> optimizerStateBytes;
  std::vector<double> socketBytes;  // rank 0's bytes written per step (/proc/self/io wchar)
};

// Runs the worker side in this process (RANK, WORLD_SIZE and the store from the environment);
// returns the exit code.
int runZeroWorker(const ZeroConfig& config);

std::string toJson(const ZeroResult& result);
ZeroResult zeroResultFromJson(const std::string& text);

}  // namespace dtrain::bench
