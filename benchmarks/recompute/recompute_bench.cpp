// recompute_bench: what activation recompute costs and saves, dtrain::recompute beside PyTorch's
// torch.utils.checkpoint.checkpoint_sequential, on ResNet-50 (ImageNet stem, 224x224, batch 16)
// and a deep MLP (64 blocks in sqrt(64) = 8 segments). Every configuration -- model x side
// (dtrain, dtrain with its host memory cache, PyTorch) x mode (plain, recompute) -- runs in a
// process of its own, once per
// repetition, in an order that rotates from one repetition to the next (interleaved, so a load
// change on the machine hits every configuration alike). Columns: medians over the repetitions.
//
//   recompute_bench [--reps 3] [--models resnet50,mlp] [--warmup 1] [--steps 3] [--threads 1]
//                   [--batch N] [--no-peer] [--no-host-cache] [--python PATH] [--smoke]
//   recompute_bench --gpu [--batch 64] [--python PATH] ...   (cuda:0, float16 autocast)
// --python: the PyTorch peer's Python, by default the build's DTRAIN_PYTHON (the project's .venv).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/version.h>

#include "common/bench_process.h"
#include "dtrain/base/error.h"
#include "recompute_bench.h"

namespace dtrain::bench {
namespace {

struct Options {
  RecomputeRun run;
  int reps = 3;
  std::vector<std::string> models = {"resnet50", "mlp"};
  int64_t batch = 0;  // 0: the model's default
  bool peer = true;
  bool hostCacheSide = true;  // the dtrain+cache rows (CPU only)
  bool smoke = false;
  bool worker = false;
  std::string out;
  std::string python = DTRAIN_PYTHON;
  std::string peerScript = DTRAIN_RECOMPUTE_BENCH_DIR "/recompute_peer.py";
  std::string countingLibrary = DTRAIN_RECOMPUTE_COUNTING_LIBRARY;
};

const char* kUsage =
    "usage: recompute_bench [--reps 3] [--models resnet50,mlp] [--warmup 1] [--steps 3]\n"
    "                       [--threads 1] [--batch N] [--no-peer] [--no-host-cache]\n"
    "                       [--python PATH] [--smoke]\n"
    "       recompute_bench --gpu [--batch 64] [--python PATH] ...\n"
    "--python: the PyTorch peer's Python (default " DTRAIN_PYTHON ")\n"
    "Activation recompute: peak tensor bytes and step time with and without it, dtrain beside\n"
    "torch.utils.checkpoint.checkpoint_sequential; see benchmarks/README.md.\n";

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&] { return flagValue(argc, argv, i); };
    auto count = [&] { return flagCount(argc, argv, i); };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--reps") {
      o.reps = std::max(1, count());
    } else if (a == "--models") {
      o.models = split(value(), ',');
    } else if (a == "--warmup") {
      o.run.warmup = count();
    } else if (a == "--steps") {
      o.run.steps = std::max(1, count());
    } else if (a == "--threads") {
      o.run.threads = std::max(1, count());
    } else if (a == "--batch") {
      o.batch = count();
    } else if (a == "--no-peer") {
      o.peer = false;
    } else if (a == "--python") {
      o.python = value();
    } else if (a == "--smoke") {
      o.smoke = true;
    } else if (a == "--gpu") {
      o.run.gpu = true;
    } else if (a == "--worker") {  // one measured process (the driver starts it)
      o.worker = true;
    } else if (a == "--model") {
      o.run.model = value();
    } else if (a == "--size") {
      o.run.size = count();
    } else if (a == "--blocks") {
      o.run.blocks = count();
    } else if (a == "--width") {
      o.run.width = count();
    } else if (a == "--segments") {
      o.run.segments = std::max(1, count());
    } else if (a == "--recompute") {
      o.run.recompute = true;
    } else if (a == "--host-cache") {  // worker: dtrain::enableHostMemoryCache() first
      o.run.hostCache = true;
    } else if (a == "--no-host-cache") {
      o.hostCacheSide = false;
    } else if (a == "--out") {
      o.out = value();
    } else {
      DTRAIN_THROW(InvalidArgument, "unknown argument '{}'\n{}", a, kUsage);
    }
  }
  for (const auto& m : o.models) {
    DTRAIN_CHECK_ARG(m == "resnet50" || m == "mlp", "--models: unknown model '{}'", m);
  }
  if (o.worker && o.batch > 0) o.run.batch = o.batch;
  if (o.smoke) o.reps = 1;
  return o;
}

// The configuration of `model` for this run: the sizes, or tiny ones for --smoke.
RecomputeRun configure(const Options& o, const std::string& model) {
  RecomputeRun r = o.run;
  r.model = model;
  if (o.smoke) {
    r.warmup = 0;
    r.steps = 1;
    r.batch = 2;
    r.size = 32;
    r.blocks = 16;
    r.width = 32;
    r.segments = 4;
  } else {
    r.batch = model == "resnet50" ? (r.gpu ? 64 : 16) : 2048;
  }
  if (o.batch > 0) r.batch = o.batch;
  return r;
}

std::vector<std::string> runArgs(const RecomputeRun& r) {
  std::vector<std::string> a = {"--model",    r.model,
                                "--batch",    std::to_string(r.batch),
                                "--size",     std::to_string(r.size),
                                "--blocks",   std::to_string(r.blocks),
                                "--width",    std::to_string(r.width),
                                "--segments", std::to_string(r.segments),
                                "--warmup",   std::to_string(r.warmup),
                                "--steps",    std::to_string(r.steps),
                                "--threads",  std::to_string(r.threads)};
  if (r.recompute) a.push_back("--recompute");
  if (r.gpu) a.push_back("--gpu");
  if (r.hostCache) a.push_back("--host-cache");
  return a;
}

RecomputeResult parseResult(const std::string& text, const std::string& what) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    DTRAIN_THROW(Error, "{}: unreadable result '{}': {}", what, text, e.what());
  }
  RecomputeResult r;
  r.forwardSeconds = j.at("forward_s");
  r.backwardSeconds = j.at("backward_s");
  r.stepSeconds = j.at("step_s");
  r.keptBytes = j.at("kept_bytes");
  r.peakBytes = j.at("peak_bytes");
  r.firstLoss = j.at("first_loss");
  r.firstGradSum = j.at("first_grad_sum");
  r.peakRssBytes = j.value("peak_rss_bytes", int64_t{0});
  return r;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string loadAverage() {
  std::string text = readFile("/proc/loadavg");
  auto parts = split(text, ' ');
  return parts.size() >= 3 ? parts[0] + " " + parts[1] + " " + parts[2] : "?";
}

// One configuration in a process of its own: dtrain's (this program with --worker) or PyTorch's.
RecomputeResult measure(const Options& o, const RecomputeRun& r, bool peer) {
  static int counter = 0;
  const std::string out = (std::filesystem::temp_directory_path() /
                           fmt::format("recompute_bench.{}.{}.json", getpid(), counter++))
                              .string();
  std::vector<std::string> argv;
  if (peer) {
    argv = {o.python, o.peerScript, "--counting-lib", o.countingLibrary};
  } else {
    argv = {std::filesystem::read_symlink("/proc/self/exe").string(), "--worker"};
  }
  for (const auto& a : runArgs(r)) argv.push_back(a);
  argv.push_back("--out");
  argv.push_back(out);
  const std::string what = fmt::format("{} {} {}",
                                       peer          ? "PyTorch"
                                       : r.hostCache ? "dtrain+cache"
                                                     : "dtrain",
                                       r.model, r.recompute ? "recompute" : "plain");
  waitAll({spawn(argv, {{"OMP_NUM_THREADS", std::to_string(r.threads)}})}, what);
  std::string text = readFile(out);
  std::filesystem::remove(out);
  return parseResult(text, what);
}

// Why the peer cannot run here; empty when it can. On the CPU it loads librecompute_counting.so,
// which links this build's libtorch: a Python whose torch is another release (the .venv's 2.x
// beside a build against Debian's 1.13) would hold two libtorchs in one process, and aborts.
std::string peerMissing(const Options& o) {
  auto runs = [&o](const std::string& code) {
    try {
      waitAll({spawn({o.python, "-c", code}, {})}, "the peer's Python");
      return true;
    } catch (const std::exception&) {
      return false;
    }
  };
  if (!runs("import torch, torchvision")) return o.python + " cannot import torch and torchvision";
  const std::string release = fmt::format("{}.{}", TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR);
  if (!o.run.gpu &&
      !runs("import sys, torch; sys.exit(not torch.__version__.startswith('" + release + ".'))")) {
    return fmt::format("the torch of {} is not this build's libtorch {}, which its counting "
                       "allocator (librecompute_counting.so) links",
                       o.python, release);
  }
  return "";
}

struct Cell {
  std::vector<RecomputeResult> reps;
  double med(double RecomputeResult::*field) const {
    std::vector<double> v;
    for (const auto& r : reps) v.push_back(r.*field);
    return median(v);
  }
  double medBytes(int64_t RecomputeResult::*field) const {
    std::vector<double> v;
    for (const auto& r : reps) v.push_back(static_cast<double>(r.*field));
    return median(v);
  }
};

// results[model][side][recompute]; side: dtrain, dtrain+cache, torch
using Results = std::map<std::string, std::map<std::string, std::map<bool, Cell>>>;

void printTable(const Options& o, const Results& results) {
  std::printf("%-9s %-12s %-10s %8s %8s %8s %8s %6s %9s %9s %6s %6s %6s %8s %6s\n", "model", "side",
              "mode", "fwd_ms", "bwd_ms", "step_ms", "sampl/s", "fwd%", "kept_MB", "peak_MB",
              "r_peak", "r_step", "pred", "rss_MB", "#wrong");
  for (const auto& [model, sides] : results) {
    const auto batch = static_cast<double>(configure(o, model).batch);
    for (const auto& [side, modes] : sides) {
      const Cell& plain = modes.at(false);
      for (const auto& [recompute, cell] : modes) {
        const double step = cell.med(&RecomputeResult::stepSeconds);
        const double fwd = cell.med(&RecomputeResult::forwardSeconds);
        const double peak = cell.medBytes(&RecomputeResult::peakBytes);
        const double plainStep = plain.med(&RecomputeResult::stepSeconds);
        const double plainFwd = plain.med(&RecomputeResult::forwardSeconds);
        int wrong = 0;
        for (size_t i = 0; i < cell.reps.size() && i < plain.reps.size(); ++i) {
          wrong += cell.reps[i].firstLoss != plain.reps[i].firstLoss ||
                   cell.reps[i].firstGradSum != plain.reps[i].firstGradSum;
        }
        std::printf("%-9s %-12s %-10s %8.0f %8.0f %8.0f %8.1f %5.0f%% %9.1f %9.1f %6.3f %6.3f "
                    "%6.3f %8.0f %6d\n",
                    model.c_str(), side.c_str(), recompute ? "recompute" : "plain", 1e3 * fwd,
                    1e3 * cell.med(&RecomputeResult::backwardSeconds), 1e3 * step, batch / step,
                    100 * fwd / step, cell.medBytes(&RecomputeResult::keptBytes) / 1e6, peak / 1e6,
                    peak / plain.medBytes(&RecomputeResult::peakBytes), step / plainStep,
                    1 + plainFwd / plainStep, cell.medBytes(&RecomputeResult::peakRssBytes) / 1e6,
                    wrong);
      }
    }
    for (const char* ours : {"dtrain", "dtrain+cache"}) {
      if (!sides.count(ours) || !sides.count("torch")) continue;
      const Cell& d = sides.at(ours).at(true);
      const Cell& t = sides.at("torch").at(true);
      std::printf(
          "%s with recompute, PyTorch / %s: step time %.3f, peak bytes %.3f\n", model.c_str(), ours,
          t.med(&RecomputeResult::stepSeconds) / d.med(&RecomputeResult::stepSeconds),
          t.medBytes(&RecomputeResult::peakBytes) / d.medBytes(&RecomputeResult::peakBytes));
    }
    if (model == "mlp" && !o.run.gpu) {
      // The sqrt(n) bound for k segments: the k segment inputs, one segment's activations (n/k
      // blocks of what a block keeps without recompute) and the plain backward's transient.
      const RecomputeRun r = configure(o, "mlp");
      for (const auto& [side, modes] : sides) {
        const Cell& plain = modes.at(false);
        const double kept = plain.medBytes(&RecomputeResult::keptBytes);
        const double transient = plain.medBytes(&RecomputeResult::peakBytes) - kept;
        const double input = static_cast<double>(r.batch * r.width * 4);
        const double bound = static_cast<double>(r.segments) * input +
                             kept / static_cast<double>(r.segments) + transient;
        std::printf("mlp %s: %lld blocks in %lld segments, sqrt(n) bound %.1f MB, peak / bound "
                    "%.3f\n",
                    side.c_str(), static_cast<long long>(r.blocks),
                    static_cast<long long>(r.segments), bound / 1e6,
                    modes.at(true).medBytes(&RecomputeResult::peakBytes) / bound);
      }
    }
  }
}

int runDriver(Options o) {
  if (const std::string missing = o.peer ? peerMissing(o) : ""; !missing.empty()) {
    std::printf("# peer skipped: %s\n", missing.c_str());
    o.peer = false;
  }
  std::printf("# recompute_bench: %d reps, %d warm-up + %d timed steps, %d thread(s)%s; load "
              "average %s\n",
              o.reps, o.smoke ? 0 : o.run.warmup, o.smoke ? 1 : o.run.steps, o.run.threads,
              o.run.gpu ? ", cuda:0 float16 autocast" : "", loadAverage().c_str());
  std::fflush(stdout);
  Results results;
  for (int rep = 0; rep < o.reps; ++rep) {
    for (const auto& model : o.models) {
      std::vector<std::pair<std::string, bool>> order;  // (side, recompute)
      for (const char* side : {"dtrain", "dtrain+cache", "torch"}) {
        if (side == std::string("torch") && !o.peer) continue;
        if (side == std::string("dtrain+cache") && (!o.hostCacheSide || o.run.gpu)) continue;
        for (bool recompute : {false, true}) order.emplace_back(side, recompute);
      }
      std::rotate(order.begin(), order.begin() + rep % order.size(), order.end());
      for (const auto& [side, recompute] : order) {
        RecomputeRun r = configure(o, model);
        r.recompute = recompute;
        r.hostCache = side == "dtrain+cache";
        results[model][side][recompute].reps.push_back(measure(o, r, side == "torch"));
      }
    }
    std::fprintf(stderr, "rep %d/%d done, load average %s\n", rep + 1, o.reps,
                 loadAverage().c_str());
  }
  printTable(o, results);
  std::printf("# load average at the end: %s\n", loadAverage().c_str());
  int wrong = 0;
  for (const auto& [model, sides] : results) {
    const auto& p = sides.at("dtrain").at(false).reps.front();
    for (const auto& [side, modes] : sides) {
      if (side == "torch") continue;
      for (const auto& [recompute, cell] : modes) {
        for (const auto& c : cell.reps) {
          wrong += c.firstLoss != p.firstLoss || c.firstGradSum != p.firstGradSum;
        }
      }
    }
  }
  if (wrong) {
    std::printf("# FAILED: dtrain's recompute or its host memory cache changed a loss or the "
                "gradients\n");
  }
  return wrong ? 1 : 0;
}

}  // namespace
}  // namespace dtrain::bench

int main(int argc, char** argv) {
  try {
    auto options = dtrain::bench::parse(argc, argv);
    if (options.worker) {
      DTRAIN_CHECK_ARG(!options.out.empty(), "--worker needs --out FILE");
      dtrain::bench::runRecomputeWorker(options.run, options.out);
      return 0;
    }
    return dtrain::bench::runDriver(options);
  } catch (const dtrain::InvalidArgument& e) {
    std::fprintf(stderr, "recompute_bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "recompute_bench: %s\n", e.what());
    return 1;
  }
}
