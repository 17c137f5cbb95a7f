// launch_scale_bench: launch's control plane at N simulated nodes on this machine, beside
// torchrun's c10d rendezvous (issue 23; benchmarks/README.md). Each node is a `launch` in manual
// mode on loopback with one test worker that publishes progress once a second and computes
// nothing (testing/launcher_sim/launcher_sim.h); no ssh, so a lost node is found through its
// heartbeats. Per N, in one run: the rendezvous (all started -> all plans; last join -> all
// plans; plan -> workers started), the store's steady load by class and the CPU of the master,
// the store and the agents, then one agent SIGKILLed (named after; every other worker stopped
// after; the elastic restart at N - 1), then the clean end (the last worker's exit -> the
// master's). torchrun (DTRAIN_PYTHON's, --no-python, the same worker with --steps 0) at the
// smaller sizes: all started -> all ranks and last join -> all ranks, its agents' CPU and
// memory, and no larger N than memory allows. Sizes interleaved rep by rep; medians.
//
//   launch_scale_bench [--nodes 16,64,256] [--torchrun-nodes 16,64] [--reps 3] [--no-torchrun]
//                      [--csv FILE] [--keep-logs DIR] [--heartbeat-timeout S] [--smoke]
//                      [--launch PATH] [--worker PATH]
//                      [--python PATH] [--torchrun PATH]
// --python, --torchrun: by default the build's DTRAIN_PYTHON (the project's .venv) and the
//   torchrun beside it.
// --smoke: one rep at 8 nodes, no torchrun (CI: checks that it runs).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_run.h"
#include "scale_runs.h"

namespace {

using namespace dtrain::bench;

struct Options {
  std::vector<int> nodes = {16, 64, 256};
  std::vector<int> torchrunNodes = {16, 64};
  int reps = 3;
  bool torchrun = true;
  std::string csv;
  ScaleOptions run;
};

constexpr const char* kUsage =
    "usage: launch_scale_bench [--nodes 16,64,256] [--torchrun-nodes 16,64] [--reps 3]\n"
    "                          [--no-torchrun] [--csv FILE] [--keep-logs DIR] [--smoke]\n"
    "                          [--heartbeat-timeout S (10)]\n"
    "                          [--launch PATH]\n"
    "                          [--worker PATH] [--python PATH] [--torchrun PATH]\n"
    "launch's rendezvous, heartbeats and store at N simulated nodes beside torchrun's c10d\n"
    "rendezvous; see benchmarks/README.md.\n";

std::vector<int> parseInts(const std::string& list) {
  std::vector<int> out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = list.find(',', start);
    out.push_back(std::atoi(list.substr(start, comma - start).c_str()));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// Medians of a field over the reps that worked.
template <typename Run>
double med(const std::vector<Run>& runs, double Run::*field) {
  std::vector<double> v;
  for (const auto& r : runs) {
    if (r.ok && r.*field >= 0) v.push_back(r.*field);
  }
  return median(v, -1);
}

std::string cell(double v, const char* format = "{:.2f}") {
  return v < 0 ? std::string("-") : fmt::format(fmt::runtime(format), v);
}

uint64_t memAvailableBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

void printLaunchTable(const std::map<int, std::vector<LaunchRun>>& runs, double heartbeatTimeout) {
  fmt::print("# launch: medians of the reps; times in s, load in store requests/s at steady state, "
             "CPU in % of one core\n");
  fmt::print("{:>5} {:>9} {:>9} {:>9} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} "
             "{:>7} {:>7} {:>7} {:>5}\n",
             "N", "start>pl", "join>pl", "pl>work", "rdzv/N", "hb/s", "mon/s", "rest/s", "master",
             "store", "agents", "detect", "stopped", "restart", "rst/N", "exit", "ok");
  for (const auto& [n, rs] : runs) {
    int ok = 0;
    for (const auto& r : rs) ok += r.ok ? 1 : 0;
    fmt::print("{:>5} {:>9} {:>9} {:>9} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} "
               "{:>7} {:>7} {:>7} {:>5}\n",
               n, cell(med(rs, &LaunchRun::allStartedToPlans)),
               cell(med(rs, &LaunchRun::lastJoinToPlans), "{:.3f}"),
               cell(med(rs, &LaunchRun::planToWorkers)),
               cell(med(rs, &LaunchRun::rendezvousRequestsPerNode), "{:.1f}"),
               cell(med(rs, &LaunchRun::heartbeatsPerSecond), "{:.0f}"),
               cell(med(rs, &LaunchRun::monitoringPerSecond), "{:.0f}"),
               cell(med(rs, &LaunchRun::restPerSecond), "{:.0f}"),
               cell(100 * med(rs, &LaunchRun::masterCpu), "{:.1f}"),
               cell(100 * med(rs, &LaunchRun::storeCpu), "{:.1f}"),
               cell(100 * med(rs, &LaunchRun::agentsCpu), "{:.1f}"),
               cell(med(rs, &LaunchRun::detect)), cell(med(rs, &LaunchRun::killToWorkersStopped)),
               cell(med(rs, &LaunchRun::restart)),
               cell(med(rs, &LaunchRun::restartRequestsPerNode), "{:.1f}"),
               cell(med(rs, &LaunchRun::exitToMaster)), fmt::format("{}/{}", ok, rs.size()));
  }
  fmt::print("# start>pl: the last agent started -> every agent holds its plan; join>pl: the last "
             "join -> every agent holds its plan; pl>work: -> every worker started; rdzv/N: store "
             "requests until round 0's plan was out, per node; hb/mon/rest: heartbeats, "
             "monitoring (the workers' progress, the agents' samples), everything else; detect: "
             "an agent SIGKILLed -> the master names it (--heartbeat-timeout {:g}); stopped: the "
             "SIGKILL -> every other worker has SIGTERM; restart: -> every remaining agent holds "
             "round 1's "
             "plan (elastic, N - 1); rst/N: requests of that rendezvous per node; exit: the last "
             "worker done -> the master's launch exited\n",
             heartbeatTimeout);
}

void printTorchrunTable(const std::map<int, std::vector<TorchrunRun>>& runs,
                        const std::map<int, std::vector<LaunchRun>>& launchRuns,
                        const std::map<int, std::string>& skipped) {
  fmt::print("# torchrun c10d (--no-python, the same worker --steps 0): medians; times in s\n");
  fmt::print("{:>5} {:>10} {:>10} {:>10} {:>10} {:>10} {:>13} {:>13} {:>5}\n", "N", "start>rank",
             "join>rank", "rank>work", "cpu/agent", "MiB/agent", "launch start", "launch join",
             "ok");
  for (const auto& [n, rs] : runs) {
    int ok = 0;
    for (const auto& r : rs) ok += r.ok ? 1 : 0;
    const auto l = launchRuns.find(n);
    const double ls = l == launchRuns.end() ? -1 : med(l->second, &LaunchRun::allStartedToPlans);
    const double lj = l == launchRuns.end() ? -1 : med(l->second, &LaunchRun::lastJoinToPlans);
    const double ts = med(rs, &TorchrunRun::allStartedToRanks);
    const double tj = med(rs, &TorchrunRun::lastJoinToRanks);
    fmt::print("{:>5} {:>10} {:>10} {:>10} {:>10} {:>10} {:>13} {:>13} {:>5}\n", n, cell(ts),
               cell(tj, "{:.3f}"), cell(med(rs, &TorchrunRun::ranksToWorkers)),
               cell(med(rs, &TorchrunRun::cpuPerAgent)),
               cell(med(rs, &TorchrunRun::rssPerAgent), "{:.0f}"),
               ts > 0 && ls > 0 ? fmt::format("{:.1f}x", ts / ls) : "-",
               tj > 0 && lj > 0 ? fmt::format("{:.1f}x", tj / lj) : "-",
               fmt::format("{}/{}", ok, rs.size()));
  }
  for (const auto& [n, why] : skipped) fmt::print("# torchrun at {} nodes not run: {}\n", n, why);
  fmt::print("# launch start / launch join: torchrun's time over launch's at the same N (the aim "
             "for join>rank at 64: >= 10x)\n");
}

void writeCsv(const std::string& path, const std::map<int, std::vector<LaunchRun>>& launchRuns,
              const std::map<int, std::vector<TorchrunRun>>& torchRuns) {
  std::ofstream out(path);
  out << "who,nodes,start_to_plans,join_to_plans,rendezvous_requests_per_node,heartbeats_per_s,"
         "monitoring_per_s,rest_per_s\n";
  for (const auto& [n, rs] : launchRuns) {
    out << fmt::format(
        "launch,{},{},{},{},{},{},{}\n", n, med(rs, &LaunchRun::allStartedToPlans),
        med(rs, &LaunchRun::lastJoinToPlans), med(rs, &LaunchRun::rendezvousRequestsPerNode),
        med(rs, &LaunchRun::heartbeatsPerSecond), med(rs, &LaunchRun::monitoringPerSecond),
        med(rs, &LaunchRun::restPerSecond));
  }
  for (const auto& [n, rs] : torchRuns) {
    out << fmt::format("torchrun,{},{},{},-1,-1,-1,-1\n", n,
                       med(rs, &TorchrunRun::allStartedToRanks),
                       med(rs, &TorchrunRun::lastJoinToRanks));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.run.launch = DTRAIN_BENCH_LAUNCH;
  o.run.worker = DTRAIN_BENCH_WORKER;
  Flags flags("launch_scale_bench", kUsage, argc, argv);
  while (flags.next()) {
    const std::string& f = flags.flag();
    if (f == "--nodes") o.nodes = parseInts(flags.value());
    else if (f == "--torchrun-nodes") o.torchrunNodes = parseInts(flags.value());
    else if (f == "--reps") o.reps = std::atoi(flags.value().c_str());
    else if (f == "--no-torchrun") o.torchrun = false;
    else if (f == "--csv") o.csv = flags.value();
    else if (f == "--keep-logs") o.run.keepLogs = flags.value();
    else if (f == "--heartbeat-timeout") o.run.heartbeatTimeout = std::atof(flags.value().c_str());
    else if (f == "--launch") o.run.launch = flags.value();
    else if (f == "--worker") o.run.worker = flags.value();
    else if (f == "--python") o.run.python = flags.value();
    else if (f == "--torchrun") o.run.torchrun = flags.value();
    else if (f == "--smoke") {
      o.nodes = {8};
      o.reps = 1;
      o.torchrun = false;
      o.run.settleSeconds = 2;
      o.run.steadySeconds = 2;
      o.run.heartbeatInterval = 1;
      o.run.heartbeatTimeout = 3;
      o.run.restartSteps = 1;
    } else {
      flags.usageError("unknown flag " + f);
    }
  }
  const bool torchrun = o.torchrun && executable(o.run.torchrun) && executable(o.run.python);
  const std::string loadBefore = loadAverage();
  std::map<int, std::vector<LaunchRun>> launchRuns;
  std::map<int, std::vector<TorchrunRun>> torchRuns;
  std::map<int, std::string> skipped;
  // What one more torchrun agent costs the machine: its proportional set after importing torch
  // (PSS ~150 MiB here; its RSS, ~230 MiB, also counts libtorch's file pages, which every agent
  // shares), and some margin.
  constexpr double kTorchrunMiBPerAgent = 160;
  for (int rep = 0; rep < o.reps; ++rep) {
    for (int n : o.nodes) {
      LaunchRun r = runLaunchScale(o.run, n);
      std::fprintf(stderr, "launch_scale_bench: rep %d, launch at %d nodes: %s (load %s)\n", rep, n,
                   r.ok ? "ok" : r.failure.c_str(), loadAverage().c_str());
      launchRuns[n].push_back(r);
    }
    if (!torchrun) continue;
    for (int n : o.torchrunNodes) {
      // Every torchrun agent imports torch: hundreds of MiB each. Stop where memory would run out.
      const double need = n * kTorchrunMiBPerAgent * 1.15 * (1 << 20);
      const double have = static_cast<double>(memAvailableBytes()) * 0.85;
      if (need > have) {
        skipped[n] = fmt::format("{} agents x ~{:.0f} MiB need ~{:.1f} GiB, {:.1f} GiB available "
                                 "(85 %)",
                                 n, kTorchrunMiBPerAgent, need / (1 << 30), have / (1 << 30));
        continue;
      }
      TorchrunRun r = runTorchrunScale(o.run, n);
      std::fprintf(stderr, "launch_scale_bench: rep %d, torchrun at %d nodes: %s (load %s)\n", rep,
                   n, r.ok ? "ok" : r.failure.c_str(), loadAverage().c_str());
      torchRuns[n].push_back(r);
    }
  }
  fmt::print("# launch_scale_bench: {} rep(s), sizes interleaved; load average {} before, {} "
             "after; heartbeat every {:g} s, dead after {:g} s\n",
             o.reps, loadBefore, loadAverage(), o.run.heartbeatInterval, o.run.heartbeatTimeout);
  printLaunchTable(launchRuns, o.run.heartbeatTimeout);
  if (torchrun) printTorchrunTable(torchRuns, launchRuns, skipped);
  if (!o.csv.empty()) writeCsv(o.csv, launchRuns, torchRuns);
  int failures = 0;
  for (const auto& [n, rs] : launchRuns) {
    for (const auto& r : rs) failures += r.ok ? 0 : 1;
  }
  return failures == 0 ? 0 : 1;
}
