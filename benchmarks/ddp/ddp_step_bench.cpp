// ddp_step_bench: median training-step time of dtrain's DistributedDataParallel against PyTorch's,
// at world size 2 with one thread per rank, for an MLP of ~25M parameters (batch 64 per rank) and
// ResNet-18 on 3x32x32 (batch 32 per rank). Both jobs run at once and take turns step by step, so
// that both see the same machine load (Note [Turns] in benchmarks/common/bench_process.h); each
// alternates synchronised and communication-free (noSync / no_sync) steps. Prints, per model: both
// medians, the ratio dtrain / PyTorch, the overhead of communication over the communication-free
// step, and the exposed communication share (step - communication-free step) / step; ratios and
// shares are medians of per-sample values (Note [Paired statistics] in benchmarks/common/stats.h).
//
// The communication-free step is the floor of any DDP step: `floor` prints dtrain's
// communication-free step over PyTorch's synchronised one, the best ratio dtrain could reach.
//
//   ddp_step_bench [--rounds 3] [--steps 10] [--warmup 3] [--models mlp,resnet18] [--no-peer]
//                  [--grad-as-bucket-view | --grad-copies] [--compression none|fp16|bf16]
//                  [--no-shm]
//                  [--python PATH] [--smoke]
// --python: the PyTorch peer's Python, by default the build's DTRAIN_PYTHON (the project's .venv).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "common/bench_process.h"
#include "ddp_step_bench.h"
#include "dtrain/base/error.h"

namespace dtrain::bench {
namespace {

constexpr int kWorld = 2;

struct Options {
  StepConfig step;
  int rounds = 3;
  std::vector<std::string> models = {"mlp", "resnet18"};
  bool peer = true;
  std::string python = DTRAIN_PYTHON;
  std::string peerScript = DTRAIN_DDP_BENCH_DIR "/ddp_step_peer.py";
  bool worker = false;
};

Options parse(int argc, char** argv) {
  Options o;
  bool batchSet = false, modelsSet = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&] { return flagValue(argc, argv, i); };
    if (a == "--help" || a == "-h") {
      std::fputs("usage: ddp_step_bench [--rounds 3] [--steps 10] [--warmup 3] "
                 "[--models mlp,resnet18] [--no-peer]\n"
                 "                      [--grad-as-bucket-view | --grad-copies] [--compression "
                 "none|fp16|bf16]\n"
                 "                      [--no-shm]\n"
                 "                      [--python PATH] [--smoke]\n"
                 "--python: the PyTorch peer's Python (default " DTRAIN_PYTHON ")\n"
                 "DDP step time against PyTorch's DistributedDataParallel, interleaved; see "
                 "benchmarks/README.md.\n",
                 stdout);
      std::exit(0);
    }
    if (a == "--smoke") o.step.smoke = true;
    else if (a == "--worker") o.worker = true;
    else if (a == "--no-peer") o.peer = false;
    else if (a == "--rounds") o.rounds = std::stoi(value());
    else if (a == "--steps") o.step.steps = std::stoi(value());
    else if (a == "--warmup") o.step.warmup = std::stoi(value());
    else if (a == "--batch") o.step.batch = std::stoi(value()), batchSet = true;
    else if (a == "--model") o.step.model = value();
    else if (a == "--models") o.models = split(value(), ','), modelsSet = true;
    else if (a == "--out") o.step.out = value();
    else if (a == "--turns") o.step.turns = value();
    else if (a == "--grad-as-bucket-view") o.step.gradAsBucketView = 1;
    else if (a == "--grad-copies") o.step.gradAsBucketView = 0;
    else if (a == "--no-shm") o.step.noShm = true;
    else if (a == "--compression") o.step.compression = value();
    else if (a == "--python") o.python = value();
    else if (a == "--peer-script") o.peerScript = value();
    else DTRAIN_THROW(InvalidArgument, "unknown argument {} (see ddp_step_bench --help)", a);
  }
  if (o.step.smoke && !o.worker) {
    // The plumbing only, in CI time: one round of a narrow ResNet-18 (convolutions, BatchNorm
    // buffers, several buckets) unless --models says otherwise.
    o.rounds = 1;
    o.step.warmup = 1;
    o.step.steps = 2;
    if (!modelsSet) o.models = {"resnet18"};
  }
  if (!batchSet && o.worker) o.step.batch = o.step.model == "mlp" ? 64 : 32;
  return o;
}

std::vector<std::string> workerArgs(const Options& o, const std::string& model, int batch,
                                    const std::string& out, const std::string& turns) {
  std::vector<std::string> a = {"--model",  model,
                                "--batch",  std::to_string(batch),
                                "--warmup", std::to_string(o.step.warmup),
                                "--steps",  std::to_string(o.step.steps),
                                "--out",    out};
  if (!turns.empty()) a.insert(a.end(), {"--turns", turns});
  if (o.step.gradAsBucketView >= 0) {
    a.push_back(o.step.gradAsBucketView == 1 ? "--grad-as-bucket-view" : "--grad-copies");
  }
  a.insert(a.end(), {"--compression", o.step.compression});
  if (o.step.smoke) a.push_back("--smoke");
  return a;
}

Job startOurs(const Options& o, const std::string& model, int batch, const std::string& out,
              const std::string& turns) {
  return startWorkers("dtrain workers (" + model + ")", kWorld,
                      workerArgs(o, model, batch, out, turns),
                      {{"DTRAIN_SHM", o.step.noShm ? "0" : "1"}}, out);
}

Job startPeer(const Options& o, const std::string& model, int batch, const std::string& out,
              const std::string& turns) {
  std::vector<std::string> argv = torchrunArgv(o.python, kWorld, "ddp_step_bench", o.step.smoke);
  argv.push_back(o.peerScript);
  auto rest = workerArgs(o, model, batch, out, turns);
  argv.insert(argv.end(), rest.begin(), rest.end());
  return Job{
      "PyTorch peer (" + model + ")", {spawn(argv, {{"OMP_NUM_THREADS", "1"}})}, nullptr, out};
}

StepResult finish(Job& job) { return fromJson(finishJob(job)); }

// One round: dtrain's job alone, or both jobs taking turns (Note [Turns]).
std::pair<StepResult, StepResult> runRound(const Options& o, bool peer, const std::string& model,
                                           int batch, const std::string& dir, int round) {
  auto out = [&](const char* impl) {
    return fmt::format("{}/{}_{}_{}.json", dir, impl, model, round);
  };
  if (!peer) {
    Job ours = startOurs(o, model, batch, out("dtrain"), "");
    return {finish(ours), StepResult{}};
  }
  auto turnPath = [&](const char* impl) {
    return fmt::format("{}/{}_{}_{}", dir, impl, model, round);
  };
  TurnGiver oursTurns(turnPath("dtrain")), peerTurns(turnPath("pytorch"));
  Job ours = startOurs(o, model, batch, out("dtrain"), oursTurns.path());
  Job theirs;
  try {
    theirs = startPeer(o, model, batch, out("pytorch"), peerTurns.path());
    oursTurns.connect(ours.pids, 120);
    peerTurns.connect(theirs.pids, 120);
    int turns = o.step.warmup + 2 * o.step.steps;
    for (int t = 0; t < turns; ++t) {
      // Alternate who goes first, so neither always follows the other.
      if (t % 2 == 0) {
        oursTurns.give();
        peerTurns.give();
      } else {
        peerTurns.give();
        oursTurns.give();
      }
    }
  } catch (const Error&) {
    killAll(ours.pids);
    killAll(theirs.pids);
    throw;
  }
  return {finish(ours), finish(theirs)};
}

void append(std::vector<double>& to, const std::vector<double>& from) {
  to.insert(to.end(), from.begin(), from.end());
}

bool peerAvailable(const Options& o) {
  std::string cmd = o.python + " -c 'import torch.distributed.run' >/dev/null 2>&1";
  return access(o.peerScript.c_str(), R_OK) == 0 && std::system(cmd.c_str()) == 0;
}

int runDriver(const Options& o) {
  bool peer = o.peer && peerAvailable(o);
  char dirTemplate[] = "/tmp/ddp_step_bench.XXXXXX";
  DTRAIN_CHECK(mkdtemp(dirTemplate) != nullptr, "mkdtemp failed: {}", std::strerror(errno));
  std::string dir = dirTemplate;
  fmt::print("# ddp_step_bench: world size {}, 1 thread per rank, {} round(s) x {} steps "
             "(+{} warm-up), medians in ms{}\n",
             kWorld, o.rounds, o.step.steps, o.step.warmup,
             o.step.smoke ? ", SMOKE (tiny models)" : "");
  fmt::print("# gradients as bucket views: {}; compression {}\n",
             o.step.gradAsBucketView < 0    ? "each side's default (dtrain on, PyTorch off)"
             : o.step.gradAsBucketView == 1 ? "on for both"
                                            : "off for both (copies)",
             o.step.compression);
  if (!peer)
    fmt::print("# PyTorch peer skipped (--no-peer, or {} cannot import torch)\n", o.python);
  fmt::print("# {:>8} {:>5} {:>7} {:>9} {:>9} {:>6} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9}\n", "model",
             "batch", "params", "dtrain", "pytorch", "ratio", "floor", "d-nosync", "p-nosync",
             "overhead", "exposed-d", "exposed-p");
  for (const auto& model : o.models) {
    int batch = o.step.smoke ? 2 : (model == "mlp" ? 64 : 32);
    std::vector<double> ours, oursLocal, peerStep, peerLocal, waits;
    int64_t params = 0;
    std::string backend;
    for (int round = 0; round < o.rounds; ++round) {
      auto [r, p] = runRound(o, peer, model, batch, dir, round);
      params = r.parameters;
      backend = r.backend;
      append(ours, r.stepMs);
      append(oursLocal, r.noSyncMs);
      append(waits, r.waitMs);
      if (peer) {
        DTRAIN_CHECK(p.parameters == params, "the PyTorch model has {} parameters, ours {}",
                     p.parameters, params);
        append(peerStep, p.stepMs);
        append(peerLocal, p.noSyncMs);
      }
    }
    // Samples i of the four series ran next to each other in time (Note [Turns]): ratios and
    // shares are taken per sample, their medians printed (Note [Paired statistics]).
    auto exposed = [](double step, double local) { return (step - local) / step; };
    auto overhead = [](double step, double local) { return (step - local) / local; };
    auto paired = [](const std::vector<double>& a, const std::vector<double>& b,
                     double (*f)(double, double)) { return median(pairwise(a, b, f)); };
    auto pct = [](double x) { return fmt::format("{:.1f}%", 100 * x); };
    fmt::print(
        "  {:>8} {:>5} {:>6.2f}M {:>9.1f} {:>9} {:>6} {:>6} {:>9.1f} {:>9} {:>9} {:>9} {:>9}\n",
        model, batch, params / 1e6, median(ours),
        peer ? fmt::format("{:.1f}", median(peerStep)) : "-",
        peer ? fmt::format("{:.3f}", pairedRatio(ours, peerStep)) : "-",
        peer ? fmt::format("{:.3f}", pairedRatio(oursLocal, peerStep)) : "-", median(oursLocal),
        peer ? fmt::format("{:.1f}", median(peerLocal)) : "-",
        pct(paired(ours, oursLocal, overhead)), pct(paired(ours, oursLocal, exposed)),
        peer ? pct(paired(peerStep, peerLocal, exposed)) : "-");
    fmt::print("  {:>8} dtrain ({}) end-of-backward wait (median): {:.1f} ms = {} of the step\n",
               "", backend, median(waits), pct(median(waits) / median(ours)));
  }
  std::system(("rm -rf " + dir).c_str());
  return 0;
}

}  // namespace
}  // namespace dtrain::bench

int main(int argc, char** argv) {
  return dtrain::bench::benchMain("ddp_step_bench", [&] {
    auto options = dtrain::bench::parse(argc, argv);
    if (options.worker) return dtrain::bench::runWorker(options.step);
    return dtrain::bench::runDriver(options);
  });
}
