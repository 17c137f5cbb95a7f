// launch_bench: wall time from start to exit of a whole job -- `launch --nproc-per-node N`
// beside `torchrun --standalone` -- for N in {1, 2, 4}, every configuration interleaved in the
// same run (so load drifts hit all alike), medians and minima, and the ratio printed.
//
// Workloads (each joins the job's store and passes one barrier, then exits):
//   worker    the torch-free test worker (testing/worker/worker --steps 0 --quiet), C++
//   libtorch  a minimal libtorch worker (benchmarks/launch/torch_worker.cpp); "bare" is N copies
//             of the same binary started at once without a launcher (and without the store): the
//             floor every N-process libtorch job pays on this machine
//   python    benchmarks/launch/bench_worker.py (torch.distributed.TCPStore at MASTER_ADDR:PORT),
//             under launch and under `torchrun --standalone` (PyTorch 2.x: a c10d rendezvous
//             on a free loopback port, workers polled every 0.1 s)
//
//   launch_bench [--reps N] [--nprocs 1,2,4] [--no-torchrun] [--smoke] [--multinode]
//                [--launch PATH] [--worker PATH] [--torch-worker PATH]
//                [--python PATH] [--torchrun PATH] [--script PATH]
// --python, --torchrun: by default the build's DTRAIN_PYTHON (the project's .venv) and the
//   torchrun beside it.
// --smoke: one rep of the torch-free worker with N = 1, 2 (CI: checks it runs, < 15 s).
// --multinode (root): instead, 3 nodes x 2 workers in a simulated cluster, two phases each (to
//   every worker past a barrier, then to exit): see multinode_bench.cpp.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_run.h"
#include "multinode_bench.h"

namespace {

using namespace dtrain::bench;

struct Options {
  int reps = 7;
  std::vector<int> nprocs = {1, 2, 4};
  bool torchrun = true;
  bool smoke = false;
  std::string launch = DTRAIN_BENCH_LAUNCH;
  std::string worker = DTRAIN_BENCH_WORKER;
  std::string torchWorker = DTRAIN_BENCH_TORCH_WORKER;  // empty when not built
  std::string python = DTRAIN_PYTHON;
  std::string torchrunPath = DTRAIN_TORCHRUN;
  std::string script = DTRAIN_BENCH_SCRIPT;
  bool multinode = false;
  std::string clusterScript = DTRAIN_BENCH_CLUSTER_SCRIPT;
};

constexpr const char* kUsage =
    "usage: launch_bench [--reps N] [--nprocs 1,2,4] [--no-torchrun] [--smoke] [--multinode]\n"
    "                    [--launch PATH] [--worker PATH] [--torch-worker PATH]\n"
    "                    [--python PATH] [--torchrun PATH] [--script PATH]\n"
    "--python, --torchrun: default " DTRAIN_PYTHON " and " DTRAIN_TORCHRUN "\n"
    "Start-to-exit wall time of `launch --nproc-per-node N` (torch-free worker, libtorch worker,\n"
    "Python script) beside torchrun; see benchmarks/README.md.\n";

std::vector<int> parseInts(const std::string& list) {
  std::vector<int> out;
  size_t start = 0;
  while (start < list.size()) {
    size_t comma = list.find(',', start);
    out.push_back(std::atoi(list.substr(start, comma - start).c_str()));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  Flags flags("launch_bench", kUsage, argc, argv);
  while (flags.next()) {
    const std::string& a = flags.flag();
    if (a == "--reps") o.reps = std::max(1, std::atoi(flags.value().c_str()));
    else if (a == "--nprocs") o.nprocs = parseInts(flags.value());
    else if (a == "--no-torchrun") o.torchrun = false;
    else if (a == "--smoke") o.smoke = true;
    else if (a == "--multinode") o.multinode = true;
    else if (a == "--launch") o.launch = flags.value();
    else if (a == "--worker") o.worker = flags.value();
    else if (a == "--torch-worker") o.torchWorker = flags.value();
    else if (a == "--python") o.python = flags.value();
    else if (a == "--torchrun") o.torchrunPath = flags.value();
    else if (a == "--script") o.script = flags.value();
    else flags.usageError("unknown flag " + a);
  }
  if (o.smoke) {
    o.reps = 1;
    o.nprocs = {1, 2};
    o.torchrun = false;
    o.torchWorker.clear();
  }
  return o;
}

struct Config {
  std::string workload;  // worker | libtorch | python
  std::string runner;    // launch | bare | torchrun
  int nproc;
  std::vector<std::string> argv;
  int copies = 1;  // bare: nproc copies at once, no launcher
  std::vector<double> samples;
  int failures = 0;
  std::string lastFailure;
};

// The jobs to time, for every N of --nprocs: each workload under launch, and beside it.
std::vector<Config> jobs(const Options& o) {
  std::vector<Config> configs;
  const std::string np = "--nproc-per-node";
  for (int n : o.nprocs) {
    const std::string ns = std::to_string(n);
    configs.push_back({"worker",
                       "launch",
                       n,
                       {o.launch, np, ns, o.worker, "--steps", "0", "--quiet"},
                       1,
                       {},
                       0,
                       {}});
    if (executable(o.torchWorker)) {
      configs.push_back({"libtorch", "launch", n, {o.launch, np, ns, o.torchWorker}, 1, {}, 0, {}});
      configs.push_back({"libtorch", "bare", n, {o.torchWorker, "--bare"}, n, {}, 0, {}});
    }
    if (o.torchrun && executable(o.python)) {
      configs.push_back({"python",
                         "launch",
                         n,
                         {o.launch, np, ns, "--python", o.python, o.script},
                         1,
                         {},
                         0,
                         {}});
    }
    if (o.torchrun && executable(o.torchrunPath)) {
      // As a user runs one node: --standalone (2.x rendezvouses on a free port) and the default
      // --monitor-interval (0.1 s in 2.x).
      configs.push_back(
          {"python",
           "torchrun",
           n,
           {o.python, o.torchrunPath, "--standalone", "--nproc-per-node", ns, o.script},
           1,
           {},
           0,
           {}});
    }
  }
  return configs;
}

// A warm-up run of each (page cache, dynamic loader caches), then --reps interleaved rounds.
void measure(std::vector<Config>& configs, int reps) {
  for (auto& c : configs) timeRun(c.argv, nullptr, c.copies);
  for (int rep = 0; rep < reps; ++rep) {
    for (auto& c : configs) {
      std::string failure;
      double s = timeRun(c.argv, &failure, c.copies);
      if (s < 0) {
        ++c.failures;
        c.lastFailure = failure;
      } else {
        c.samples.push_back(s * 1e3);
      }
    }
  }
}

void printTable(const Options& o, const std::vector<Config>& configs) {
  auto find = [&](const std::string& workload, const std::string& runner, int n) -> const Config* {
    for (const auto& c : configs) {
      if (c.workload == workload && c.runner == runner && c.nproc == n) return &c;
    }
    return nullptr;
  };
  auto cell = [](const Config* c) {
    if (!c || c->samples.empty()) return std::string("-");
    return fmt::format("{:.1f} ({:.1f})", median(c->samples), spread(c->samples).min);
  };

  char load[128] = {};
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (!std::fgets(load, sizeof load, f)) load[0] = '\0';
    std::fclose(f);
  }
  fmt::print("# launch_bench: wall time start->exit in ms, median (min) of {} interleaved reps; "
             "load {}",
             o.reps, load[0] ? load : "?\n");
  fmt::print("# worker: C++ test worker, join store + barrier; libtorch: minimal libtorch worker "
             "(bare = N copies at once, no launcher);\n# python: TCPStore join + barrier with "
             "torch imported\n");
  fmt::print("{:>6} {:>9} {:>16} {:>16} {:>16} {:>10}\n", "nproc", "workload", "launch", "bare",
             "torchrun", "tr/launch");
  for (int n : o.nprocs) {
    for (const char* w : {"worker", "libtorch", "python"}) {
      const Config* l = find(w, "launch", n);
      if (!l) continue;
      const Config* t = find(w, "torchrun", n);
      std::string ratio = "-";
      if (t && !t->samples.empty() && !l->samples.empty()) {
        ratio = fmt::format("{:.1f}x", median(t->samples) / median(l->samples));
      }
      fmt::print("{:>6} {:>9} {:>16} {:>16} {:>16} {:>10}\n", n, w, cell(l),
                 cell(find(w, "bare", n)), cell(t), ratio);
    }
  }
  for (int n : o.nprocs) {
    const Config* l = find("libtorch", "launch", n);
    const Config* bare = find("libtorch", "bare", n);
    if (l && bare && !l->samples.empty() && !bare->samples.empty()) {
      fmt::print("# libtorch nproc={}: launch adds {:+.1f} ms to {} bare start-up(s) at once "
                 "(aim: < 100)\n",
                 n, median(l->samples) - median(bare->samples), n);
    }
  }
}

// Says which runs failed; smoke mode is a check: every run must have worked.
int failureCode(const std::vector<Config>& configs) {
  int failures = 0;
  for (const auto& c : configs) {
    if (c.failures) {
      failures += c.failures;
      fmt::print(stderr, "launch_bench: {} {} nproc={} failed {} time(s); last: {}\n", c.workload,
                 c.runner, c.nproc, c.failures, c.lastFailure);
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  if (o.multinode) {
    dtrain::bench::MultinodeBenchOptions m;
    m.reps = o.reps;
    m.torchrun = o.torchrun;
    m.launch = o.launch;
    m.worker = o.worker;
    m.python = o.python;
    m.torchrunPath = o.torchrunPath;
    m.clusterScript = o.clusterScript;
    return dtrain::bench::multinodeBench(m);
  }
  std::vector<Config> configs = jobs(o);
  measure(configs, o.reps);
  printTable(o, configs);
  return failureCode(configs);
}
