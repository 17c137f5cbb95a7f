// zero_bench: ZeRO stages 1, 2 and 3 against plain DDP, Adam on an MLP of 92M float32
// parameters, one thread per rank. For each world size and stage a DDP job and a ZeRO job (stage
// 3: and a ZeRO-2 job, the reference of its aim) run at once and take turns step by step (Note
// [Turns] in benchmarks/common/bench_process.h), so they see the same machine load. Per job: the
// median step and its split -- forward + backward (without the communication they waited for),
// communication waited for, the optimizer's step, the rest --, the ratio to DDP's step and
// communication (medians of per-step ratios, Note [Paired statistics] in stats.h), what the step's
// collectives cost alone and how much of it was hidden, model-state bytes per rank (from the
// tensors' storages) against ZeRO's formula, PSS per rank (max over the ranks), payload bytes
// each rank sends per step (the communicator's counter, Note [Payload bytes]) per parameter, and
// what accumulation under noSync() holds; for stage 3 its ratios to ZeRO-2 and the full
// parameters alive at once against the aim. Stage 3 runs twice beside them: its model
// built whole and sharded by the optimizer (ShardedUnit), and built unit by unit, each layer
// sharded as it is built (fullyShard; method zero3b); a table below compares what building and
// binding the model held at the most per rank (Note [Build peak] in zero_bench_worker.cpp) and
// the two steps (the same training).
//
// With --defer, stages 1 and 2 run a third job, ZeRO with deferAllgatherWait, --data-mib M
// gives every job a data phase after step() (Note [Data phase] in zero_bench_worker.cpp), and
// --micro M makes each step M micro-batches, all but the last under noSync(). With --one-bucket,
// stage 3 runs a fifth job, ZeRO-3 with one gradient bucket in flight instead of two (zero3o:
// what the memory of one bucket costs in overlap).
//
//   zero_bench [--worlds 2,4] [--stages 1,2,3] [--steps 5] [--warmup 2] [--width 4096]
//              [--io 1024] [--layers 7] [--batch 16] [--forward-prefetch] [--defer]
//              [--data-mib 0] [--micro 1] [--one-bucket] [--no-shm] [--smoke]
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "common/bench_process.h"
#include "dtrain/base/error.h"
#include "zero_bench.h"

namespace dtrain::bench {
namespace {

struct Options {
  ZeroConfig job;
  std::vector<int> worlds = {2, 4};
  std::vector<int> stages = {1, 2, 3};
  bool noShm = false;
  bool oneBucket = false;  // stage 3 also runs with one gradient bucket in flight (zero3o)
  bool smoke = false;
  bool worker = false;
};

std::vector<int> ints(const std::string& s) {
  std::vector<int> out;
  for (const auto& part : split(s, ',')) out.push_back(std::stoi(part));
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&] { return flagValue(argc, argv, i); };
    if (a == "--help" || a == "-h") {
      std::fputs("usage: zero_bench [--worlds 2,4] [--stages 1,2,3] [--steps 5] [--warmup 2]\n"
                 "                  [--width 4096] [--io 1024] [--layers 7] [--batch 16]\n"
                 "                  [--forward-prefetch] [--defer] [--data-mib 0] [--micro 1]\n"
                 "                  [--autocast] [--param-dtype] [--one-bucket] [--no-shm] "
                 "[--smoke]\n"
                 "ZeRO stages 1, 2 and 3 against plain DDP (Adam, an MLP of 92M parameters), "
                 "interleaved (stage 3 beside DDP and ZeRO-2). Stage 3 runs twice: the model "
                 "built whole and sharded by the optimizer (zero3), and built unit by unit with "
                 "fullyShard (zero3b); a table compares the two builds' peak memory per rank "
                 "(CPU tensor storage counted, resident set) and steps. --defer: stages 1 and "
                 "2 also run ZeRO with deferAllgatherWait (zero1d, zero2d); --data-mib M: every "
                 "step normalises M MiB of pixels after step(), as loading the next batch; --micro "
                 "M: M micro-batches per step, all but the last under noSync(); --autocast: "
                 "forwards under "
                 "AutocastGuard (bfloat16); --param-dtype: stage 3 gathers its units in bfloat16 "
                 "(ZeroOptions::paramDtype); --one-bucket: stage 3 also runs with one gradient "
                 "bucket in flight instead of two (zero3o, ZeroOptions::bucketsInFlight). See "
                 "benchmarks/README.md.\n",
                 stdout);
      std::exit(0);
    }
    if (a == "--smoke") o.smoke = true;
    else if (a == "--worker") o.worker = true;
    else if (a == "--no-shm") o.noShm = true;
    else if (a == "--forward-prefetch") o.job.forwardPrefetch = true;
    else if (a == "--build-sharded") o.job.buildSharded = true;  // worker: Units::ShardedAsBuilt
    else if (a == "--defer") o.job.defer = true;
    else if (a == "--one-bucket") o.oneBucket = true;
    else if (a == "--buckets-in-flight") o.job.bucketsInFlight = std::stoi(value());  // worker
    else if (a == "--data-mib") o.job.dataMib = std::stod(value());
    else if (a == "--micro") o.job.micro = std::max(1, std::stoi(value()));
    else if (a == "--autocast") o.job.autocast = true;
    else if (a == "--param-dtype") o.job.paramDtype = true;
    else if (a == "--worlds") o.worlds = ints(value());
    else if (a == "--stages") o.stages = ints(value());
    else if (a == "--stage") o.job.stage = std::stoi(value());
    else if (a == "--steps") o.job.steps = std::stoi(value());
    else if (a == "--warmup") o.job.warmup = std::stoi(value());
    else if (a == "--width") o.job.width = std::stoll(value());
    else if (a == "--io") o.job.io = std::stoll(value());
    else if (a == "--layers") o.job.layers = std::stoi(value());
    else if (a == "--batch") o.job.batch = std::stoi(value());
    else if (a == "--out") o.job.out = value();
    else if (a == "--turns") o.job.turns = value();
    else DTRAIN_THROW(InvalidArgument, "unknown argument {} (see zero_bench --help)", a);
  }
  if (o.smoke && !o.worker) {
    o.worlds = {2};
    o.job.width = 64;
    o.job.io = 32;
    o.job.layers = 3;
    o.job.warmup = 1;
    o.job.steps = 2;
    o.job.defer = true;  // every job kind runs
    o.oneBucket = true;
    if (o.job.dataMib == 0) o.job.dataMib = 1;
  }
  return o;
}

// One job of a run: its stage, and at stage 3 how the model is built.
struct JobKind {
  int stage = 0;
  bool buildSharded = false;  // every layer sharded as it is built (fullyShard)
  bool defer = false;         // ZeroOptions::deferAllgatherWait
  int buckets = 2;            // ZeroOptions::bucketsInFlight
};

std::vector<std::string> workerArgs(const Options& o, JobKind kind, const std::string& out,
                                    const std::string& turns) {
  std::vector<std::string> args = {"--stage",  std::to_string(kind.stage),
                                   "--width",  std::to_string(o.job.width),
                                   "--io",     std::to_string(o.job.io),
                                   "--layers", std::to_string(o.job.layers),
                                   "--batch",  std::to_string(o.job.batch),
                                   "--warmup", std::to_string(o.job.warmup),
                                   "--steps",  std::to_string(o.job.steps),
                                   "--out",    out,
                                   "--turns",  turns};
  if (o.job.forwardPrefetch) args.push_back("--forward-prefetch");
  if (kind.buildSharded) args.push_back("--build-sharded");
  if (kind.defer) args.push_back("--defer");
  if (kind.buckets != 2) {
    args.push_back("--buckets-in-flight");
    args.push_back(std::to_string(kind.buckets));
  }
  if (o.job.autocast) args.push_back("--autocast");
  if (o.job.paramDtype && kind.stage == 3) args.push_back("--param-dtype");
  if (o.job.micro > 1) {
    args.push_back("--micro");
    args.push_back(std::to_string(o.job.micro));
  }
  if (o.job.dataMib > 0) {
    args.push_back("--data-mib");
    args.push_back(fmt::format("{}", o.job.dataMib));
  }
  return args;
}

double loadAverage() {
  std::ifstream in("/proc/loadavg");
  double load = 0;
  in >> load;
  return load;
}

// The jobs that run together for `stage`: DDP, and at stage 3 ZeRO-2 (its aim is relative to
// ZeRO-2's step) and ZeRO-3 twice, its model built whole and built unit by unit (what building
// costs, Note [Build peak] in zero_bench_worker.cpp); with --defer at stages 1 and 2, ZeRO with
// its all-gathers waited for after the data phase, beside the one that waits in step(); with
// --one-bucket at stage 3, ZeRO-3 with one gradient bucket in flight instead of two (zero3o).
std::vector<JobKind> jobsFor(int stage, bool defer, bool oneBucket) {
  if (stage == 3 && oneBucket) return {{0}, {2}, {3}, {3, true}, {3, false, false, 1}};
  if (stage == 3) return {{0}, {2}, {3}, {3, true}};
  if (defer) return {{0}, {stage}, {stage, false, true}};
  return {{0}, {stage}};
}

// "3", "3b" (built sharded), "2d" (deferred), "3o" (one bucket in flight): the job's files and
// the table's method column.
std::string tag(int stage, bool buildSharded, bool defer = false, int buckets = 2) {
  return fmt::format("{}{}{}{}", stage, buildSharded ? "b" : "", defer ? "d" : "",
                     buckets == 1   ? "o"
                     : buckets != 2 ? fmt::format("o{}", buckets)
                                    : "");
}

std::string methodName(JobKind kind) {
  if (kind.stage == 0) return "DDP";
  return fmt::format("ZeRO-{}{}{}{}", kind.stage, kind.buildSharded ? " built sharded" : "",
                     kind.defer ? " deferred" : "",
                     kind.buckets != 2 ? fmt::format(" {} bucket(s) in flight", kind.buckets) : "");
}

// The jobs of `kinds` on `world` ranks, taking turns (the first to go rotates step by step).
std::vector<ZeroResult> runTogether(const Options& o, int world, const std::vector<JobKind>& kinds,
                                    const std::string& dir) {
  const std::string run = fmt::format("{}/{}_{}", dir, world, kinds.back().stage);
  const std::map<std::string, std::string> env = {{"DTRAIN_SHM", o.noShm ? "0" : "1"}};
  std::vector<std::unique_ptr<TurnGiver>> turns;
  std::vector<Job> jobs;
  std::vector<std::string> outs;
  try {
    for (JobKind kind : kinds) {
      const std::string base = fmt::format(
          "{}_{}", run, tag(kind.stage, kind.buildSharded, kind.defer, kind.buckets));
      outs.push_back(base + ".json");
      turns.push_back(std::make_unique<TurnGiver>(base));
      jobs.push_back(startWorkers(methodName(kind), world,
                                  workerArgs(o, kind, outs.back(), turns.back()->path()), env,
                                  outs.back()));
    }
    for (size_t j = 0; j < jobs.size(); ++j) turns[j]->connect(jobs[j].pids, 300);
    for (int t = 0; t < o.job.warmup + o.job.steps; ++t) {
      for (size_t j = 0; j < jobs.size(); ++j) turns[(t + j) % jobs.size()]->give();
    }
  } catch (const Error&) {
    for (auto& job : jobs) killAll(job.pids);
    throw;
  }
  std::vector<ZeroResult> results;
  for (auto& job : jobs) results.push_back(zeroResultFromJson(finishJob(job)));
  return results;
}

// Model-state bytes per rank for float32 Adam (ZeRO's paper): DDP 16, ZeRO-1 8 + 8/N, ZeRO-2
// 4 + 12/N, ZeRO-3 16/N bytes per parameter.
double formulaBytes(int stage, int world, double params) {
  const double n = world;
  switch (stage) {
    case 0: return 16 * params;
    case 1: return (8 + 8 / n) * params;
    case 2: return (4 + 12 / n) * params;
    default: return 16 / n * params;
  }
}

// The share of the collectives' cost by themselves that the step did not wait for (Note
// [Communication alone]), median of per-step values; negative when contention made the waits
// longer than the collectives alone.
double hiddenShare(const ZeroResult& r) {
  std::vector<double> share;
  for (double waited : pairedRatios(r.commMs, r.aloneMs)) share.push_back(1 - waited);
  return median(share);
}

void printRow(const ZeroResult& r, const ZeroResult& ddp) {
  constexpr double MiB = 1 << 20;
  const double psi = static_cast<double>(r.parameters);
  const double formula = formulaBytes(r.stage, r.world, psi);
  double pss = 0;
  for (double p : r.pssBytes) pss = std::max(pss, p);
  const bool isDdp = r.stage == 0;
  fmt::print(
      "  {:>5} {:>6} {:>8.1f} {:>8.1f} {:>7.1f} {:>7.1f} {:>6.1f} {:>6} {:>6} {:>7.1f} "
      "{:>6.0f}% {:>8.1f} {:>8.1f} {:>6.3f} {:>7.0f} {:>7.2f}\n",
      r.world, isDdp ? "ddp" : "zero" + tag(r.stage, r.buildSharded, r.defer, r.bucketsInFlight),
      median(r.stepMs), median(r.computeMs), median(r.commMs), median(r.optimizerMs),
      median(r.otherMs), isDdp ? "-" : fmt::format("{:.3f}", pairedRatio(r.stepMs, ddp.stepMs)),
      isDdp ? "-" : fmt::format("{:.2f}", pairedRatio(r.commMs, ddp.commMs)), median(r.aloneMs),
      100 * hiddenShare(r), r.stateBytes / MiB, formula / MiB, r.stateBytes / formula, pss / MiB,
      median(r.payloadBytes) / psi);
}

// Per step: comm plus the wait for the other ranks after the step (Note [Waiting for the others]
// in zero_bench_worker.cpp).
std::vector<double> withEndWait(const ZeroResult& r) {
  std::vector<double> out;
  for (size_t i = 0; i < r.commMs.size() && i < r.endWaitMs.size(); ++i) {
    out.push_back(r.commMs[i] + r.endWaitMs[i]);
  }
  return out;
}

// Where stages 1 and 2 wait (the `comm` column split): DDP at the end of backward only, ZeRO
// there and for the all-gathers still running after its last unit's step (in step(), or with
// --defer after the data phase); then both methods' wait for the other ranks after the step, and
// "comm + end" (withEndWait) with its per-step ratio to DDP's.
void printWaits(const ZeroResult& ddp, const ZeroResult& zero) {
  fmt::print("  {:>5} zero{} waits, ms (medians): end of backward DDP {:.1f}, ZeRO {:.1f}; "
             "all-gathers after the last unit's step {:.1f}{}; after the step, for the other "
             "ranks: DDP {:.1f}, ZeRO {:.1f}; comm + end: DDP {:.1f}, ZeRO {:.1f}, per-step "
             "ratio {:.2f}; data phase {:.1f}\n",
             "", tag(zero.stage, false, zero.defer), median(ddp.backwardWaitMs),
             median(zero.backwardWaitMs), median(zero.stepWaitMs),
             zero.defer ? " (after the data phase)" : " (in step())", median(ddp.endWaitMs),
             median(zero.endWaitMs), median(withEndWait(ddp)), median(withEndWait(zero)),
             pairedRatio(withEndWait(zero), withEndWait(ddp)), median(zero.dataMs));
}

// Parameter elements of each layer of the MLP (weight and bias).
std::vector<double> layerNumels(const ZeroConfig& c) {
  std::vector<double> out;
  for (int l = 0; l < c.layers; ++l) {
    const double in = static_cast<double>(l == 0 ? c.io : c.width);
    const double width = static_cast<double>(l + 1 == c.layers ? c.io : c.width);
    out.push_back(in * width + width);
  }
  return out;
}

// ZeRO-3 against ZeRO-2 (paired) and its memory against the aims.
void printStage3(const Options& o, const ZeroResult& z3, const ZeroResult& z2) {
  constexpr double MiB = 1 << 20;
  auto layers = layerNumels(o.job);
  std::sort(layers.rbegin(), layers.rend());
  const double twoLargest = 4 * (layers[0] + (layers.size() > 1 ? layers[1] : 0));
  const double blocks = 4 * static_cast<double>(z3.parameters) / z3.world;
  const double peak = z3.peakGatheredBytes + z3.ownedParameterBytes;
  fmt::print("  {:>5} ZeRO-3 / ZeRO-2: step {:.3f} (aim <= 1.3), fwd+bwd {:.3f}, comm {:.2f}; "
             "unit all-gathers waited {:.1f} ms (the layers' probes: {:.1f}); hidden {:.0f}% "
             "(aim >= 50%){}\n",
             "", pairedRatio(z3.stepMs, z2.stepMs), pairedRatio(z3.computeMs, z2.computeMs),
             pairedRatio(z3.commMs, z2.commMs), median(z3.gatherMs), median(z3.probedGatherMs),
             100 * hiddenShare(z3), o.job.forwardPrefetch ? "; forward prefetch" : "");
  fmt::print("  {:>5} ZeRO-3 parameters alive at once: {:.1f} MiB gathered at the peak (the "
             "layers' storages: {:.1f}) + {:.1f} MiB owned blocks = {:.1f} MiB, aim Psi/N + root + "
             "two largest units = {:.1f} + 0 + {:.1f} = {:.1f} MiB ({:.3f} of it); model state "
             "{:.1f} MiB = {:.3f} x 16 Psi/N\n",
             "", z3.peakGatheredBytes / MiB, z3.peakFullBytes / MiB, z3.ownedParameterBytes / MiB,
             peak / MiB, blocks / MiB, twoLargest / MiB, (blocks + twoLargest) / MiB,
             peak / (blocks + twoLargest), z3.stateBytes / MiB,
             z3.stateBytes / formulaBytes(3, z3.world, z3.parameters));
}

// What building held at the most per rank, the two ways stage 3 builds the same model (Note
// [Build peak] in zero_bench_worker.cpp), medians over the ranks: against the model's parameters,
// the layers' construction against the bound of building unit by unit -- one unit in full beside
// the rank's blocks --, and each way's step against the whole build's (paired: the two train the
// same model the same way).
void printBuild(const Options& o, const std::vector<const ZeroResult*>& ways) {
  constexpr double MiB = 1 << 20;
  const ZeroResult& whole = *ways.front();
  const auto layers = layerNumels(o.job);
  const double largest = 4 * *std::max_element(layers.begin(), layers.end());
  const double blocks = whole.parameterBytes / whole.world;
  const double full = whole.parameterBytes;
  fmt::print("  {:>5} {:<14} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>7}\n", "", "ZeRO-3 built",
             "peak", "layers", "left", "resident", "params", "peak/p", "lay/bd", "step");
  for (const ZeroResult* r : ways) {
    const double resident = median(r->buildResidentBytes);
    fmt::print(
        "  {:>5} {:<14} {:>8.1f} {:>8.1f} {:>8.1f} {:>8} {:>8.1f} {:>7.3f} {:>7.3f} {:>7}\n",
        r->world, r->buildSharded ? "unit by unit" : "whole", median(r->buildStorageBytes) / MiB,
        median(r->buildLayersBytes) / MiB, median(r->buildLeftBytes) / MiB,
        resident >= 0 ? fmt::format("{:.1f}", resident / MiB) : "-", full / MiB,
        median(r->buildStorageBytes) / full, median(r->buildLayersBytes) / (largest + blocks),
        r == &whole ? "-" : fmt::format("{:.3f}", pairedRatio(r->stepMs, whole.stepMs)));
  }
  fmt::print("  {:>5} build, MiB per rank, medians over ranks, of CPU tensor storage counted from "
             "the first layer built: peak through the optimizer's constructor, while the layers "
             "were built, left at its end; resident: growth of the peak resident set (counts the "
             "communicator's buffers too); params: the model's parameters; bd: one unit in full "
             "+ the rank's blocks = {:.1f} + {:.1f} = {:.1f} MiB; step: per-step ratio to the "
             "whole build's\n",
             "", largest / MiB, blocks / MiB, (largest + blocks) / MiB);
}

int runDriver(const Options& o) {
  char dirTemplate[] = "/tmp/zero_bench.XXXXXX";
  DTRAIN_CHECK(mkdtemp(dirTemplate) != nullptr, "mkdtemp failed: {}", std::strerror(errno));
  const std::string dir = dirTemplate;
  fmt::print("# zero_bench: Adam, DeepMlp({} -> {} x {} -> {}), batch {} per rank{}, 1 thread per "
             "rank, {} steps (+{} warm-up) per job, medians; {}{}\n",
             o.job.io, o.job.width, o.job.layers - 1, o.job.io, o.job.batch,
             o.job.micro > 1 ? fmt::format(" x {} micro-batches (noSync())", o.job.micro) : "",
             o.job.steps, o.job.warmup, o.noShm ? "Gloo (DTRAIN_SHM=0)" : "shared memory",
             o.smoke ? ", SMOKE" : "");
  fmt::print("# ms: step = fwd+bwd (without waits) + comm (waited for) + optimizer + other; "
             "ratio, comm: per-step ratios to DDP's; alone: the step's collectives by themselves, "
             "hidden: 1 - comm / alone; state: model-state MiB per rank (storages) against the "
             "formula; pss: max over ranks, MiB; B/param: payload bytes per step\n");
  fmt::print("# {:>5} {:>6} {:>8} {:>8} {:>7} {:>7} {:>6} {:>6} {:>6} {:>7} {:>7} {:>8} {:>8} "
             "{:>6} {:>7} {:>7}\n",
             "world", "method", "step", "fwd+bwd", "comm", "optim", "other", "ratio", "comm",
             "alone", "hidden", "state", "formula", "/form", "pss", "B/param");
  for (int world : o.worlds) {
    for (int stage : o.stages) {
      const double loadBefore = loadAverage();
      const std::vector<ZeroResult> results = runTogether(
          o, world, jobsFor(stage, o.job.defer, o.oneBucket), dir);
      const double loadAfter = loadAverage();
      const ZeroResult& ddp = results.front();
      const ZeroResult& zero = stage == 3 ? results[2] : results[1];
      for (const auto& r : results) printRow(r, ddp);
      fmt::print("  {:>5} backend {}, {:.2f}M parameters, load {:.1f} -> {:.1f}; gradients held "
                 "after 8 noSync() micro-batches: DDP {:.0f} MiB, ZeRO-{} {:.0f} MiB; ZeRO-{} "
                 "buckets {:.0f} MiB; held from forward to backward{}: DDP {:.1f} MiB, ZeRO-{} "
                 "{:.1f} MiB\n",
                 "", zero.backend, zero.parameters / 1e6, loadBefore, loadAfter,
                 ddp.noSyncGradientBytes / (1 << 20), stage, zero.noSyncGradientBytes / (1 << 20),
                 stage, zero.bucketBytes / (1 << 20),
                 !o.job.autocast                  ? ""
                 : o.job.paramDtype && stage == 3 ? " (autocast, paramDtype bfloat16)"
                                                  : " (autocast)",
                 ddp.heldBytes / (1 << 20), stage, zero.heldBytes / (1 << 20));
      if (stage != 3) {
        for (size_t j = 1; j < results.size(); ++j) printWaits(ddp, results[j]);
      }
      if (stage == 3) {
        printStage3(o, zero, results[1]);
        printBuild(o, {&zero, &results[3]});
        if (results.size() > 4) {
          // See --one-bucket: what one bucket in flight instead of two costs the step.
          const ZeroResult& one = results[4];
          fmt::print("  {:>5} one gradient bucket in flight (zero3o) against two (zero3): step "
                     "{:.3f} (paired ratio; {:.1f} against {:.1f} ms), comm waited for {:.1f} "
                     "against {:.1f} ms, payload per step {:.3f}\n",
                     "", pairedRatio(one.stepMs, zero.stepMs), median(one.stepMs),
                     median(zero.stepMs), median(one.commMs), median(zero.commMs),
                     median(one.payloadBytes) / median(zero.payloadBytes));
        }
      }
      std::fflush(stdout);
    }
  }
  std::system(("rm -rf " + dir).c_str());
  return 0;
}

}  // namespace
}  // namespace dtrain::bench

int main(int argc, char** argv) {
  return dtrain::bench::benchMain("zero_bench", [&] {
    auto options = dtrain::bench::parse(argc, argv);
    if (options.worker) return dtrain::bench::runZeroWorker(options.job);
    return dtrain::bench::runDriver(options);
  });
}
