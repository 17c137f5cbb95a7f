// train_bench: samples/s of train_resnet's training step against PyTorch DDP's, at world size 2
// with one compute thread per rank (plus each side's data loader): ResNet-18 on CIFAR-sized
// images (32x32, batch 32 per rank, through the loader thread with crop, flip and normalisation)
// and ResNet-50 at 224x224 (batch 4 per rank, a fixed batch). Both jobs run at once and take
// turns step by step (Note [Turns] in benchmarks/common/bench_process.h); the ratio is the median
// of the per-step ratios dtrain / PyTorch samples/s (Note [Paired statistics] in
// benchmarks/common/stats.h).
//
//   train_bench [--rounds 3] [--steps 10] [--warmup 3] [--models resnet18,resnet50] [--no-peer]
//               [--amp] [--python PATH] [--smoke]
//   train_bench --gpu [--batch 64] [--python PATH] ...
//
// --python: the PyTorch peer's Python, by default the build's DTRAIN_PYTHON (the project's .venv).
// --gpu: ResNet-50 at 224x224 with --amp (float16 autocast + GradScaler) at world size 1 on
// cuda:0 (NCCL), beside PyTorch eager with torch.autocast and its GradScaler on the same GPU, also
// in turns (scripts/gpu_check.sh runs it).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

#include <fmt/format.h>
#include <torch/torch.h>

#include "common/bench_process.h"
#include "data/cifar10.h"
#include "dtrain/base/error.h"
#include "train_bench.h"

namespace dtrain::bench {
namespace {

struct Options {
  TrainConfig train;
  int world = 2;
  int batch = 0;  // per rank; 0: the model's default
  int rounds = 3;
  std::vector<std::string> models = {"resnet18", "resnet50"};
  bool peer = true;
  bool smoke = false;
  bool worker = false;
  std::string python = DTRAIN_PYTHON;
  std::string peerScript = DTRAIN_TRAIN_BENCH_DIR "/train_peer.py";
};

int batchFor(const Options& o, const std::string& model) {
  if (o.batch > 0) return o.batch;
  if (o.smoke) return 2;
  if (o.train.device == "cuda") return 64;
  return model == "resnet50" ? 4 : 32;
}

Options parse(int argc, char** argv) {
  Options o;
  bool modelsSet = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&] { return flagValue(argc, argv, i); };
    auto count = [&] { return flagCount(argc, argv, i); };
    if (a == "--help" || a == "-h") {
      std::fputs("usage: train_bench [--rounds 3] [--steps 10] [--warmup 3] "
                 "[--models resnet18,resnet50] [--no-peer]\n"
                 "                   [--amp] [--batch N] [--python PATH] [--smoke]\n"
                 "       train_bench --gpu [--batch 64] [--python PATH] ...\n"
                 "--python: the PyTorch peer's Python (default " DTRAIN_PYTHON ")\n"
                 "train_resnet's step against PyTorch DDP's, interleaved; see "
                 "benchmarks/README.md.\n",
                 stdout);
      std::exit(0);
    }
    if (a == "--smoke") o.smoke = true;
    else if (a == "--gpu") o.train.device = "cuda", o.world = 1, o.train.amp = true;
    else if (a == "--amp") o.train.amp = true;
    else if (a == "--device") o.train.device = value();
    else if (a == "--worker") o.worker = true;
    else if (a == "--no-peer") o.peer = false;
    else if (a == "--rounds") o.rounds = count();
    else if (a == "--steps") o.train.steps = count();
    else if (a == "--warmup") o.train.warmup = count();
    else if (a == "--batch") o.batch = o.train.batch = count();
    else if (a == "--model") o.train.model = value();
    else if (a == "--models") o.models = split(value(), ','), modelsSet = true;
    else if (a == "--data") o.train.data = value();
    else if (a == "--out") o.train.out = value();
    else if (a == "--turns") o.train.turns = value();
    else if (a == "--python") o.python = value();
    else DTRAIN_THROW(InvalidArgument, "unknown argument {} (see train_bench --help)", a);
  }
  if (o.train.device == "cuda" && !modelsSet) o.models = {"resnet50"};
  DTRAIN_CHECK_ARG(o.train.device == "cpu" || o.train.device == "cuda",
                   "--device must be cpu or cuda, got '{}'", o.train.device);
  for (const auto& m : o.models) {
    DTRAIN_CHECK_ARG(m == "resnet18" || m == "resnet50", "unknown model '{}' (resnet18 | resnet50)",
                     m);
  }
  if (o.smoke && !o.worker) {
    // The plumbing only, in CI time: one round of ResNet-18 (on the GPU: ResNet-50) at batch 2.
    o.rounds = 1;
    o.train.warmup = 1;
    o.train.steps = 2;
    if (!modelsSet && o.train.device == "cpu") o.models = {"resnet18"};
  }
  return o;
}

std::vector<std::string> workerArgs(const TrainConfig& c) {
  std::vector<std::string> a = {"--model",  c.model,
                                "--batch",  std::to_string(c.batch),
                                "--warmup", std::to_string(c.warmup),
                                "--steps",  std::to_string(c.steps),
                                "--out",    c.out,
                                "--turns",  c.turns,
                                "--device", c.device};
  if (!c.data.empty()) a.insert(a.end(), {"--data", c.data});
  if (c.amp) a.push_back("--amp");
  return a;
}

Job startOurs(const Options& o, const TrainConfig& c) {
  return startWorkers("dtrain workers (" + c.model + ")", o.world, workerArgs(c), {}, c.out);
}

Job startPeer(const Options& o, const TrainConfig& c) {
  std::vector<std::string> argv;
  if (o.world == 1) {  // PyTorch eager in one process: no torchrun, no process group
    argv = {o.python, o.peerScript};
  } else {
    argv = torchrunArgv(o.python, o.world, "train_bench", o.smoke);
    argv.push_back(o.peerScript);
  }
  auto rest = workerArgs(c);
  argv.insert(argv.end(), rest.begin(), rest.end());
  return Job{
      "PyTorch peer (" + c.model + ")", {spawn(argv, {{"OMP_NUM_THREADS", "1"}})}, nullptr, c.out};
}

TrainResult finish(Job& job) { return trainResultFromJson(finishJob(job)); }

// One round: both jobs taking turns step by step, or dtrain's alone.
std::pair<TrainResult, TrainResult> runRound(const Options& o, bool peer, TrainConfig c,
                                             const std::string& dir, int round) {
  auto path = [&](const char* impl, const char* suffix) {
    return fmt::format("{}/{}_{}_{}{}", dir, impl, c.model, round, suffix);
  };
  TrainConfig ours = c, theirs = c;
  ours.out = path("dtrain", ".json");
  theirs.out = path("pytorch", ".json");
  TurnGiver oursTurns(path("dtrain", "")), peerTurns(path("pytorch", ""));
  ours.turns = oursTurns.path();
  theirs.turns = peerTurns.path();
  Job a = startOurs(o, ours), b;
  try {
    if (peer) b = startPeer(o, theirs);
    oursTurns.connect(a.pids, 120);
    if (peer) peerTurns.connect(b.pids, 120);
    for (int t = 0; t < c.warmup + c.steps; ++t) {
      // Alternate who goes first, so neither always follows the other.
      if (peer && t % 2 == 1) peerTurns.give();
      oursTurns.give();
      if (peer && t % 2 == 0) peerTurns.give();
    }
  } catch (const Error&) {
    killAll(a.pids);
    killAll(b.pids);
    throw;
  }
  TrainResult r = finish(a);
  return {r, peer ? finish(b) : TrainResult{}};
}

bool peerAvailable(const Options& o) {
  std::string cmd = o.python + " -c 'import torch.distributed.run, torchvision' >/dev/null 2>&1";
  return access(o.peerScript.c_str(), R_OK) == 0 && std::system(cmd.c_str()) == 0;
}

int runDriver(Options o) {
  const bool peer = o.peer && peerAvailable(o);
  char dirTemplate[] = "/tmp/train_bench.XXXXXX";
  DTRAIN_CHECK(mkdtemp(dirTemplate) != nullptr, "mkdtemp failed: {}", std::strerror(errno));
  const std::string dir = dirTemplate;
  struct RemoveAtExit {  // the data, FIFOs and results, also when a job fails
    std::string path;
    ~RemoveAtExit() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  } cleanup{dir};
  fmt::print("# train_bench: world size {} on {}{}, 1 compute thread per rank, {} round(s) x {} "
             "steps (+{} warm-up){}\n",
             o.world, o.train.device, o.train.amp ? " with amp" : "", o.rounds, o.train.steps,
             o.train.warmup, o.smoke ? ", SMOKE" : "");
  fmt::print("# samples/s: median over steps of world x batch / step time; ratio: median of the "
             "paired per-step ratios dtrain / PyTorch\n");
  if (!peer) {
    fmt::print("# PyTorch peer skipped (--no-peer, or {} cannot import torch and torchvision)\n",
               o.python);
  }
  if (std::find(o.models.begin(), o.models.end(), "resnet18") != o.models.end()) {
    o.train.data = dir + "/cifar";
    // Enough images that an epoch holds many steps; both sides read these files.
    examples::writeSyntheticCifar10(o.train.data, o.smoke ? 200 : 5000, 10);
  }
  fmt::print("# {:>9} {:>8} {:>5} {:>7} {:>10} {:>10} {:>7} {:>9} {:>9}\n", "model", "input",
             "batch", "params", "dtrain/s", "pytorch/s", "ratio", "d-step-ms", "p-step-ms");
  for (const auto& model : o.models) {
    TrainConfig c = o.train;
    c.model = model;
    c.batch = batchFor(o, model);
    std::vector<double> ours, theirs, ratios;
    int64_t params = 0;
    for (int round = 0; round < o.rounds; ++round) {
      auto [r, p] = runRound(o, peer, c, dir, round);
      params = r.parameters;
      ours.insert(ours.end(), r.stepMs.begin(), r.stepMs.end());
      if (peer) {
        DTRAIN_CHECK(p.parameters == params, "the PyTorch model has {} parameters, ours {}",
                     p.parameters, params);
        theirs.insert(theirs.end(), p.stepMs.begin(), p.stepMs.end());
        // Step i of both ran next to each other: the ratio of samples/s is theirs / ours in time.
        const auto paired = pairedRatios(p.stepMs, r.stepMs);
        ratios.insert(ratios.end(), paired.begin(), paired.end());
      }
    }
    auto rate = [&](const std::vector<double>& ms) {
      std::vector<double> perSecond;
      for (double m : ms) perSecond.push_back(o.world * c.batch * 1000.0 / m);
      return median(perSecond);
    };
    fmt::print("  {:>9} {:>8} {:>5} {:>6.2f}M {:>10.1f} {:>10} {:>7} {:>9.1f} {:>9}\n", model,
               model == "resnet18" ? "32x32" : "224x224", c.batch, params / 1e6, rate(ours),
               peer ? fmt::format("{:.1f}", rate(theirs)) : "-",
               peer ? fmt::format("{:.3f}", median(ratios)) : "-", median(ours),
               peer ? fmt::format("{:.1f}", median(theirs)) : "-");
  }
  return 0;
}

}  // namespace
}  // namespace dtrain::bench

int main(int argc, char** argv) {
  return dtrain::bench::benchMain("train_bench", [&] {
    auto options = dtrain::bench::parse(argc, argv);
    if (options.worker) return dtrain::bench::runTrainWorker(options.train);
    return dtrain::bench::runDriver(options);
  });
}
