#include "scale_runs.h"

#include <signal.h>

#include <algorithm>
#include <fstream>
#include <map>

#include <fmt/format.h>

#include "bench_run.h"
#include "free_port.h"
#include "launcher_sim.h"

namespace dtrain::bench {

namespace {

using sim::Fleet;
using sim::LaunchSim;

// CPU seconds so far of the master's and the store's threads (node 0) and of every agent.
struct CpuSnapshot {
  double at = 0;
  double master = 0;
  double store = 0;
  double agents = 0;
};

CpuSnapshot cpuNow(LaunchSim& s, int lost) {
  CpuSnapshot c;
  c.at = sim::monotonicSeconds();
  const Fleet& fleet = s.fleet();
  for (const auto& [name, seconds] : sim::threadCpuSeconds(fleet.member(0).pid)) {
    if (name == "dtrain-store") {
      c.store += seconds;
    } else if (name == "launch-coord" || name == "launch-jobmon") {
      c.master += seconds;
    } else {
      c.agents += seconds;
    }
  }
  for (int i = 1; i < static_cast<int>(fleet.size()); ++i) {
    if (i == lost || fleet.member(i).exited) continue;
    c.agents += std::max(0.0, sim::processCpuSeconds(fleet.member(i).pid));
  }
  return c;
}

const sim::StoreCount* findCount(const std::vector<sim::StoreCount>& counts,
                                 const std::string& when) {
  for (const auto& c : counts) {
    if (c.when == when) return &c;
  }
  return nullptr;
}

void keepLogs(const ScaleOptions& o, const Fleet& fleet, const std::string& run) {
  if (o.keepLogs.empty()) return;
  const std::string dir = o.keepLogs + "/" + run;
  shellOut("mkdir -p '" + dir + "'");
  for (int i = 0; i < static_cast<int>(fleet.size()); ++i) {
    std::ofstream out(fmt::format("{}/node{}.log", dir, i));
    for (const auto& l : fleet.member(i).lines)
      out << fmt::format("{:.6f} ", l.at) << l.text << "\n";
  }
}

std::string fail(LaunchRun& r, const std::string& why, const Fleet& fleet, const ScaleOptions& o) {
  keepLogs(o, fleet, fmt::format("launch-{}-failed-{:.0f}", r.nodes, sim::monotonicSeconds()));
  r.ok = false;
  r.failure = why + "; node 0 said:\n" + fleet.text(0, 3000);
  return r.failure;
}

sim::LaunchSimOptions simOptions(const ScaleOptions& o, int nodes) {
  sim::LaunchSimOptions so;
  so.launch = o.launch;
  so.worker = o.worker;
  so.nodes = nodes;
  so.minNodes = nodes - 1;
  so.heartbeatInterval = o.heartbeatInterval;
  so.heartbeatTimeout = o.heartbeatTimeout;
  so.gracePeriod = 10;
  so.rdzvTimeout = 600;
  so.maxRestarts = 1;
  so.workerSteps = 100000;  // until the loss stops them
  so.restartSteps = o.restartSteps;
  so.token = "scale-bench-0123456789abcdef0123456789";
  return so;
}

// Every worker started: how long the plan took and what the rendezvous cost the store.
bool measureStart(LaunchSim& s, const ScaleOptions& o, LaunchRun& r) {
  Fleet& fleet = s.fleet();
  const int nodes = r.nodes;
  if (!fleet.pumpUntil([&] { return LaunchSim::count(s.workerStarted(0)) == nodes; }, 600)) {
    fail(r, fmt::format("{} of {} workers started", LaunchSim::count(s.workerStarted(0)), nodes),
         fleet, o);
    return false;
  }
  const double plans = LaunchSim::latest(s.planned(0));
  r.allStartedToPlans = plans - s.startedAt();
  r.lastJoinToPlans = plans - LaunchSim::latest(s.joined(0));
  r.planToWorkers = LaunchSim::latest(s.workerStarted(0)) - plans;
  if (const auto* c = findCount(s.storeCounts(), "round 0 planned")) {
    r.rendezvousRequestsPerNode = static_cast<double>(c->total()) / nodes;
  }
  return true;
}

// Steady state: o.settleSeconds for every worker's progress and every agent's first sample, then
// CPU and the store's periodic counts over the window.
void measureSteadyState(LaunchSim& s, const ScaleOptions& o, LaunchRun& r) {
  Fleet& fleet = s.fleet();
  fleet.pump(static_cast<int>(o.settleSeconds * 1000));
  const CpuSnapshot a = cpuNow(s, -1);
  fleet.pumpUntil([] { return false; }, o.steadySeconds);
  const CpuSnapshot b = cpuNow(s, -1);
  const double wall = b.at - a.at;
  r.masterCpu = (b.master - a.master) / wall;
  r.storeCpu = (b.store - a.store) / wall;
  r.agentsCpu = (b.agents - a.agents) / wall;
  std::vector<sim::StoreCount> periodic;
  for (const auto& c : s.storeCounts()) {
    if (c.when == "periodic" && c.at >= a.at && c.at <= b.at) periodic.push_back(c);
  }
  if (periodic.size() >= 2) {
    const auto& x = periodic.front();
    const auto& y = periodic.back();
    const double t = y.at - x.at;
    r.heartbeatsPerSecond = static_cast<double>(y.heartbeats - x.heartbeats) / t;
    r.monitoringPerSecond = static_cast<double>(y.monitoring - x.monitoring) / t;
    r.restPerSecond = static_cast<double>(y.rest - x.rest) / t;
  }
}

// One agent SIGKILLed: named, the round stopped, the job restarted elastic at N - 1.
bool measureLostAgent(LaunchSim& s, const ScaleOptions& o, LaunchRun& r) {
  Fleet& fleet = s.fleet();
  const int nodes = r.nodes;
  const int lost = nodes - 1;
  fleet.signal(lost, SIGKILL);
  const double killedAt = sim::monotonicSeconds();
  const std::string silent = fmt::format("stopping round 0 on every node: node {} (", lost);
  if (!fleet.pumpUntil([&] { return s.masterSaid(silent) >= 0; }, 4 * o.heartbeatTimeout + 30)) {
    fail(r, "the lost agent was not named", fleet, o);
    return false;
  }
  const double named = s.masterSaid(silent);
  r.detect = named - killedAt;
  // An agent that exits meanwhile (it lost the store, or was dropped) cannot be planned: say so
  // at once instead of waiting for the rendezvous timeout.
  const auto anotherExited = [&] {
    for (int node = 0; node < lost; ++node) {
      if (fleet.member(node).exited) return true;
    }
    return false;
  };
  if (!fleet.pumpUntil(
          [&] { return LaunchSim::count(s.planned(1)) == nodes - 1 || anotherExited(); }, 300) ||
      anotherExited()) {
    fail(r,
         fmt::format("{} of {} agents hold round 1's plan", LaunchSim::count(s.planned(1)),
                     nodes - 1),
         fleet, o);
    return false;
  }
  r.restart = LaunchSim::latest(s.planned(1)) - named;
  double lastStop = -1;
  for (int node = 0; node < lost; ++node) lastStop = std::max(lastStop, s.workerStopped(node));
  r.killToWorkersStopped = lastStop - killedAt;
  const auto counts = s.storeCounts();
  const auto* stopped = findCount(counts, "round 0 stopped");
  const auto* replanned = findCount(counts, "round 1 planned");
  if (stopped && replanned) {
    r.restartRequestsPerNode = static_cast<double>(replanned->total() - stopped->total()) /
                               (nodes - 1);
  }
  return true;
}

// The clean end: every worker's last steps, then every agent's exit.
bool measureCleanEnd(LaunchSim& s, const ScaleOptions& o, LaunchRun& r) {
  Fleet& fleet = s.fleet();
  const int lost = r.nodes - 1;
  if (!fleet.pumpUntil(
          [&] {
            for (int node = 0; node < lost; ++node) {
              if (!fleet.member(node).exited) return false;
            }
            return true;
          },
          o.restartSteps + 120)) {
    fail(r, "the agents did not exit", fleet, o);
    return false;
  }
  keepLogs(o, fleet, fmt::format("launch-{}-{:.0f}", r.nodes, s.startedAt()));
  for (int node = 0; node < lost; ++node) {
    if (fleet.exitCode(node) != 0) {
      fail(
          r,
          fmt::format("node {} exited {}:\n{}", node, fleet.exitCode(node), fleet.text(node, 2000)),
          fleet, o);
      return false;
    }
  }
  r.exitToMaster = fleet.member(0).exitedAt - LaunchSim::latest(s.workerDone(1));
  return true;
}

}  // namespace

LaunchRun runLaunchScale(const ScaleOptions& o, int nodes) {
  LaunchRun r;
  r.nodes = nodes;
  LaunchSim s(simOptions(o, nodes));
  s.start();
  if (!measureStart(s, o, r)) return r;
  measureSteadyState(s, o, r);
  if (!measureLostAgent(s, o, r)) return r;
  if (!measureCleanEnd(s, o, r)) return r;
  r.ok = true;
  return r;
}

TorchrunRun runTorchrunScale(const ScaleOptions& o, int nodes) {
  TorchrunRun r;
  r.nodes = nodes;
  Fleet fleet;
  const int port = testing::freePortOn("127.0.0.1");
  const std::string id = fmt::format("scale{}", port);
  for (int k = 0; k < nodes; ++k) {
    fleet.spawn({o.python, o.torchrun, "--nnodes", std::to_string(nodes), "--nproc_per_node", "1",
                 "--rdzv_backend", "c10d", "--rdzv_endpoint", fmt::format("127.0.0.1:{}", port),
                 "--rdzv_id", id,
                 // Every agent is on this host: say which one hosts the store.
                 "--rdzv_conf",
                 k == 0 ? "is_host=1,join_timeout=900" : "is_host=0,join_timeout=900",
                 "--no_python", o.worker, "--no-store", "--progress", "--quiet", "--steps", "0"},
                {"LOGLEVEL=INFO"});
  }
  const double startedAt = sim::monotonicSeconds();
  if (!fleet.pumpUntil([&] { return fleet.allExited(); }, 1200)) {
    r.failure = "torchrun agents did not exit within 1200 s";
    return r;
  }
  std::vector<double> attempts, ranks, workers, cpu, rss;
  for (int k = 0; k < nodes; ++k) {
    if (fleet.exitCode(k) != 0) {
      r.failure = fmt::format("torchrun {} exited {}:\n{}", k, fleet.exitCode(k),
                              fleet.text(k, 3000));
      return r;
    }
    // The agent's own INFO lines (LOGLEVEL reaches its logger, not the rendezvous module's): it
    // starts joining, then holds its ranks.
    auto attempt = fleet.linesWith(k, "Rendezvous'ing worker group");
    auto joined = fleet.linesWith(k, "Rendezvous complete for workers");
    auto started = fleet.linesWith(k, ": started attempt=");
    if (attempt.empty() || joined.empty() || started.empty()) {
      r.failure = fmt::format("torchrun {} printed no join or worker line:\n{}", k,
                              fleet.text(k, 3000));
      return r;
    }
    attempts.push_back(attempt.front().at);
    ranks.push_back(joined.front().at);
    workers.push_back(sim::timeIn(started.front().text));
    cpu.push_back(fleet.member(k).cpuSeconds);
    rss.push_back(static_cast<double>(fleet.member(k).maxRssBytes) / (1 << 20));
  }
  const double lastRank = *std::max_element(ranks.begin(), ranks.end());
  r.allStartedToRanks = lastRank - startedAt;
  r.lastJoinToRanks = lastRank - *std::max_element(attempts.begin(), attempts.end());
  r.ranksToWorkers = *std::max_element(workers.begin(), workers.end()) - lastRank;
  keepLogs(o, fleet, fmt::format("torchrun-{}-{:.0f}", nodes, startedAt));
  r.cpuPerAgent = median(cpu, -1);
  r.rssPerAgent = median(rss, -1);
  r.ok = true;
  return r;
}

}  // namespace dtrain::bench
