// zero_bench: ZeRO stages 1 and 2 against plain DDP, Adam on an MLP of 92M float32 parameters,
// one thread per rank. For each world size and stage a DDP job and a ZeRO job run at once and
// take turns step by step (Note [Turns] in benchmarks/ddp/ddp_step_bench.h), so both see the
// same machine load. Per job: the median step and its split -- forward + backward (without the
// communication they waited for), communication waited for, the optimizer's step, the rest --,
// the ratio to DDP's step and communication (medians of per-step ratios, Note [Paired
// statistics]), model-state bytes per rank (from the tensors' storages) against ZeRO's formula,
// PSS per rank (max over the ranks), payload bytes each rank sends per step (the communicator's
// counter, Note [Payload bytes]) per parameter, and what accumulation under noSync() holds.
//
//   zero_bench [--worlds 2,4] [--stages 1,2] [--steps 5] [--warmup 2] [--width 4096]
//              [--io 1024] [--layers 7] [--batch 16] [--no-shm] [--smoke]
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "../ddp/bench_process.h"
#include "dtrain/base/error.h"
#include "zero_bench.h"

namespace dtrain::bench {
namespace {

struct Options {
  ZeroConfig job;
  std::vector<int> worlds = {2, 4};
  std::vector<int> stages = {1, 2};
  bool noShm = false;
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
      std::fputs("usage: zero_bench [--worlds 2,4] [--stages 1,2] [--steps 5] [--warmup 2]\n"
                 "                  [--width 4096] [--io 1024] [--layers 7] [--batch 16]\n"
                 "                  [--no-shm] [--smoke]\n"
                 "ZeRO stages 1 and 2 against plain DDP (Adam, an MLP of 92M parameters), "
                 "interleaved; see benchmarks/README.md.\n",
                 stdout);
      std::exit(0);
    }
    if (a == "--smoke") o.smoke = true;
    else if (a == "--worker") o.worker = true;
    else if (a == "--no-shm") o.noShm = true;
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
  }
  return o;
}

std::vector<std::string> workerArgs(const Options& o, int stage, const std::string& out,
                                    const std::string& turns) {
  return {"--stage",  std::to_string(stage),        "--width",  std::to_string(o.job.width),
          "--io",     std::to_string(o.job.io),      "--layers", std::to_string(o.job.layers),
          "--batch",  std::to_string(o.job.batch),   "--warmup", std::to_string(o.job.warmup),
          "--steps",  std::to_string(o.job.steps),   "--out",    out,
          "--turns",  turns};
}

double loadAverage() {
  std::ifstream in("/proc/loadavg");
  double load = 0;
  in >> load;
  return load;
}

// DDP and ZeRO stage `stage` on `world` ranks, taking turns.
std::pair<ZeroResult, ZeroResult> runPair(const Options& o, int world, int stage,
                                          const std::string& dir) {
  auto path = [&](const char* what) { return fmt::format("{}/{}_{}_{}", dir, what, world, stage); };
  const std::map<std::string, std::string> env = {{"DTRAIN_SHM", o.noShm ? "0" : "1"}};
  TurnGiver ddpTurns(path("ddp")), zeroTurns(path("zero"));
  Job ddp = startWorkers("DDP", world, workerArgs(o, 0, path("ddp") + ".json", ddpTurns.path()),
                         env, path("ddp") + ".json");
  Job zero;
  try {
    zero = startWorkers(fmt::format("ZeRO-{}", stage), world,
                        workerArgs(o, stage, path("zero") + ".json", zeroTurns.path()), env,
                        path("zero") + ".json");
    ddpTurns.connect(ddp.pids, 300);
    zeroTurns.connect(zero.pids, 300);
    for (int t = 0; t < o.job.warmup + o.job.steps; ++t) {
      if (t % 2 == 0) {  // alternate who goes first
        ddpTurns.give();
        zeroTurns.give();
      } else {
        zeroTurns.give();
        ddpTurns.give();
      }
    }
  } catch (const Error&) {
    killAll(ddp.pids);
    killAll(zero.pids);
    throw;
  }
  return {zeroResultFromJson(finishJob(ddp)), zeroResultFromJson(finishJob(zero))};
}

// Note [Paired statistics]: step i of both jobs ran next to each other in time.
double paired(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> r;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) r.push_back(b[i] > 0 ? a[i] / b[i] : 0);
  return median(r);
}

double formulaBytes(int stage, int world, double params) {
  const double n = world;
  if (stage == 0) return 16 * params;
  return (stage == 1 ? 8 + 8 / n : 4 + 12 / n) * params;
}

void printRow(const ZeroResult& r, const ZeroResult& ddp) {
  constexpr double MiB = 1 << 20;
  const double psi = static_cast<double>(r.parameters);
  const double formula = formulaBytes(r.stage, r.world, psi);
  double pss = 0;
  for (double p : r.pssBytes) pss = std::max(pss, p);
  const bool isDdp = r.stage == 0;
  fmt::print("  {:>5} {:>6} {:>8.1f} {:>8.1f} {:>7.1f} {:>7.1f} {:>6.1f} {:>6} {:>6} {:>8.1f} "
             "{:>8.1f} {:>6.3f} {:>7.0f} {:>7.2f}\n",
             r.world, isDdp ? "ddp" : fmt::format("zero{}", r.stage), median(r.stepMs),
             median(r.computeMs), median(r.commMs), median(r.optimizerMs), median(r.otherMs),
             isDdp ? "-" : fmt::format("{:.3f}", paired(r.stepMs, ddp.stepMs)),
             isDdp ? "-" : fmt::format("{:.2f}", paired(r.commMs, ddp.commMs)),
             r.stateBytes / MiB, formula / MiB, r.stateBytes / formula, pss / MiB,
             median(r.payloadBytes) / psi);
}

int runDriver(const Options& o) {
  char dirTemplate[] = "/tmp/zero_bench.XXXXXX";
  DTRAIN_CHECK(mkdtemp(dirTemplate) != nullptr, "mkdtemp failed: {}", std::strerror(errno));
  const std::string dir = dirTemplate;
  fmt::print("# zero_bench: Adam, DeepMlp({} -> {} x {} -> {}), batch {} per rank, 1 thread per "
             "rank, {} steps (+{} warm-up) per job, medians; {}{}\n",
             o.job.io, o.job.width, o.job.layers - 1, o.job.io, o.job.batch, o.job.steps,
             o.job.warmup, o.noShm ? "Gloo (DTRAIN_SHM=0)" : "shared memory",
             o.smoke ? ", SMOKE" : "");
  fmt::print("# ms: step = fwd+bwd (without waits) + comm (waited for) + optimizer + other; "
             "ratio, comm: per-step ratios to DDP's; state: model-state MiB per rank (storages) "
             "against the formula; pss: max over ranks, MiB; B/param: payload bytes per step\n");
  fmt::print("# {:>5} {:>6} {:>8} {:>8} {:>7} {:>7} {:>6} {:>6} {:>6} {:>8} {:>8} {:>6} {:>7} "
             "{:>7}\n",
             "world", "method", "step", "fwd+bwd", "comm", "optim", "other", "ratio", "comm",
             "state", "formula", "/form", "pss", "B/param");
  for (int world : o.worlds) {
    for (int stage : o.stages) {
      const double loadBefore = loadAverage();
      auto [ddp, zero] = runPair(o, world, stage, dir);
      const double loadAfter = loadAverage();
      printRow(ddp, ddp);
      printRow(zero, ddp);
      fmt::print("  {:>5} backend {}, {:.2f}M parameters, load {:.1f} -> {:.1f}; gradients held "
                 "after a noSync() micro-batch: DDP {:.0f} MiB, ZeRO-{} {:.0f} MiB; ZeRO-2 "
                 "buckets {:.0f} MiB\n",
                 "", zero.backend, zero.parameters / 1e6, loadBefore, loadAfter,
                 ddp.noSyncGradientBytes / (1 << 20), stage, zero.noSyncGradientBytes / (1 << 20),
                 zero.bucketBytes / (1 << 20));
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
