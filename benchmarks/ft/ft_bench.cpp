// ft_bench: what a lost node costs a DDP job under `launch --on-node-loss continue` (the
// survivors re-form in memory and lose the step in flight) beside today's restart path
// (`--on-node-loss restart --max-restarts 1`: every worker torn down, started again, the last
// checkpoint read), interleaved in one run; and what the mode costs a job that loses nothing
// (benchmarks/README.md, "ft_bench"). With --zero 1|2 the same under ZeRO, its sharded state
// mirrored on another node (ft_zero.cpp); with --kinds join, a node that comes to the running job
// taken in live or by a restart (ft_join.cpp). Needs root: a simulated cluster of network
// namespaces.
//
//   ft_bench [--runs N] [--pairs N] [--steps N] [--compute-ms MS] [--save-every K]
//            [--kinds kill,drop,join] [--seed S] [--show] [--smoke]
//            [--zero STAGE [--mirror-every K] [--block-steps B] [--lose-after S] [--features F]
//             [--width W] [--depth L]]
//   ft_bench --worker ...      the job's worker (ft_worker.cpp), run by launch
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_run.h"
#include "common/stats.h"
#include "ft_bench.h"

namespace dtrain::bench {

namespace {

const char* kUsage =
    "usage: ft_bench [--runs N] [--pairs N] [--steps N] [--compute-ms MS] [--save-every K]\n"
    "                [--kinds kill,drop,join] [--seed S] [--show] [--smoke]\n"
    "                [--zero STAGE [--mirror-every K] [--block-steps B] [--lose-after S]\n"
    "                 [--features F] [--width W] [--depth L]]\n";

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "ft_bench: %s needs a value\n%s", f.c_str(), kUsage);
        std::exit(2);
      }
      return argv[++i];
    };
    if (f == "--runs") o.runs = std::stoi(value());
    else if (f == "--pairs") o.pairs = std::stoi(value());
    else if (f == "--steps") o.steps = std::stoll(value());
    else if (f == "--compute-ms") o.computeMs = std::stoll(value());
    else if (f == "--save-every") o.saveEvery = std::stoll(value());
    else if (f == "--zero") o.zero = std::stoi(value());
    else if (f == "--mirror-every") o.mirrorEvery = std::stoll(value());
    else if (f == "--block-steps") o.blockSteps = std::stoll(value());
    else if (f == "--lose-after") o.loseAfter = std::stoll(value());
    else if (f == "--features") o.features = std::stoll(value());
    else if (f == "--width") o.width = std::stoll(value());
    else if (f == "--depth") o.depth = std::stoll(value());
    else if (f == "--show") o.show = true;
    else if (f == "--seed") o.seed = static_cast<unsigned>(std::stoul(value()));
    else if (f == "--kinds") {
      o.kinds.clear();
      const std::string v = value();
      if (v.find("kill") != std::string::npos) o.kinds.push_back(Loss::kKill);
      if (v.find("drop") != std::string::npos) o.kinds.push_back(Loss::kDrop);
      if (v.find("join") != std::string::npos) o.kinds.push_back(Loss::kJoin);
    } else if (f == "--smoke") {
      o.runs = 1;
      o.pairs = 2;
      o.steps = 16;
    } else if (f == "--help" || f == "-h") {
      std::printf("%s", kUsage);
      std::exit(0);
    } else {
      std::fprintf(stderr, "ft_bench: unknown flag %s\n%s", f.c_str(), kUsage);
      std::exit(2);
    }
  }
  if (o.zero != 0 && o.zero != 1 && o.zero != 2) {
    std::fprintf(stderr, "ft_bench: --zero %d: 1 or 2\n%s", o.zero, kUsage);
    std::exit(2);
  }
  if (o.zero != 0 && std::find(o.kinds.begin(), o.kinds.end(), Loss::kJoin) != o.kinds.end()) {
    std::fprintf(stderr, "ft_bench: --kinds join is of the DDP rows, not --zero's\n%s", kUsage);
    std::exit(2);
  }
  // The DDP rows' defaults; the ZeRO rows' are ft_zero.cpp's.
  if (o.zero == 0) {
    if (o.kinds.empty()) o.kinds = {Loss::kKill, Loss::kDrop};
    if (o.steps < 0) o.steps = 40;
    if (o.computeMs < 0) o.computeMs = 150;
    if (o.saveEvery < 0) o.saveEvery = 10;
  }
  return o;
}

}  // namespace

std::vector<std::string> launchArgv(const Options& o, const SimCluster& c, bool continueMode,
                                    int64_t steps, int64_t saveEvery,
                                    const std::string& checkpointDir,
                                    const std::vector<std::string>& extra) {
  std::vector<std::string> a = {
      DTRAIN_FT_LAUNCH, "--hosts", c.hostList(), "--ssh-config", c.sshConfig(), "--rdzv-endpoint",
      c.endpoint(), "--nnodes", fmt::format("2:{}", kNodes), "--nproc-per-node",
      std::to_string(kPerNode), "--on-node-loss", continueMode ? "continue" : "restart",
      "--max-restarts", "1",
      // The e2e tests' timings; ssh's connect timeout as the cluster's ssh_config has it (3 s),
      // not launch's 10 s, which a restart would wait on a silent node.
      "--heartbeat-interval", "0.5", "--heartbeat-timeout", "3", "--rdzv-timeout", "20",
      "--grace-period", "2", "--ssh-connect-timeout", "3",
      // The worker: this program.
      DTRAIN_FT_SELF, "--worker", "--steps", std::to_string(steps), "--compute-ms",
      std::to_string(o.computeMs)};
  if (saveEvery > 0) {
    a.insert(a.end(),
             {"--save-every", std::to_string(saveEvery), "--checkpoint-dir", checkpointDir});
  }
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

namespace {

// The DDP table's: the first committed step is the step reached again (one step lost).
struct Column : FailureColumn {
  std::vector<double> firstLessDetection;
  void add(const Failure& f) {
    if (FailureColumn::add(f) && f.first >= 0 && f.detection >= 0) {
      firstLessDetection.push_back(f.first - f.detection);
    }
  }
};

void printFailures(const Options& o, Loss kind, const Column& cont, const Column& restart,
                   const std::vector<double>& lostRatio) {
  const double bound = kind == Loss::kKill ? 2.0 : kHeartbeatTimeout + 1;
  fmt::print("\n# node lost by {}: {} runs, median [min-max] over the runs that went as they "
             "should; seconds from the loss\n",
             lossName(kind), o.runs);
  fmt::print("| measure | continue | restart (checkpoint every {} steps) |\n|---|---:|---:|\n",
             o.saveEvery);
  fmt::print("| detection (master's line) | {} | {} |\n", cell(cont.detection),
             cell(restart.detection));
  fmt::print("| every survivor out of its step | {} | - |\n", cell(cont.out));
  fmt::print("| re-form, ms (slowest survivor) | {} | - |\n", cell(cont.reformMs, "{:.0f}"));
  fmt::print("| every survivor re-formed | {} | - |\n", cell(cont.discarded));
  fmt::print("| first committed step after the loss | {} | {} |\n", cell(cont.first),
             cell(restart.first));
  fmt::print("| first step - detection | {} | - |\n", cell(cont.firstLessDetection));
  fmt::print("| steps lost | {} | {} |\n", cell(cont.stepsLost, "{:.0f}"),
             cell(restart.stepsLost, "{:.0f}"));
  fmt::print("| training seconds lost | {} | {} |\n", cell(cont.secondsLost),
             cell(restart.secondsLost));
  fmt::print("| runs that failed | {} | {} |\n", cont.problems, restart.problems);
  const auto verdict = [](bool met) { return met ? "met" : "NOT met"; };
  fmt::print("# aims: survivors out <= {:.0f} s: {}; first step <= detection + 1 s: {}; steps "
             "lost <= 1: {}; seconds lost <= 1/10 of restart's (paired): {:.3f} {}\n",
             bound, verdict(!cont.out.empty() && median(cont.out) <= bound),
             verdict(!cont.firstLessDetection.empty() && median(cont.firstLessDetection) <= 1),
             verdict(!cont.stepsLost.empty() && median(cont.stepsLost) <= 1), median(lostRatio),
             verdict(!lostRatio.empty() && median(lostRatio) <= 0.1));
}

// No failure: the mode on and off, job by job, alternating which goes first.
struct NoFailure {
  double periodMs = -1;  // median step period of rank 0's commits
  double workMs = -1;    // median of tryStep's time less the compute sleep
  double perStep = -1;   // collectives per step (rank 0's communicator)
};

NoFailure measureNoFailure(const JobRun& run) {
  NoFailure n;
  const std::vector<Commit> all = commits(run);
  std::vector<double> periods, work;
  for (size_t i = 2; i < all.size(); ++i) {
    periods.push_back((all[i].t - all[i - 1].t) * 1e3);
    work.push_back(all[i].workMs);
  }
  n.periodMs = median(periods, -1);
  n.workMs = median(work, -1);
  for (const auto& l : run.lines) {
    if (l.text.find("ft done rank 0 ") == std::string::npos) continue;
    n.perStep = field(l.text, "collectives") / field(l.text, "steps");
  }
  return n;
}

int runBench(const Options& o) {
  if (::geteuid() != 0) {
    std::fprintf(stderr, "ft_bench: needs root (network namespaces, sshd, nft)\n");
    return 2;
  }
  std::mt19937 rng(o.seed);
  SimCluster cluster(DTRAIN_FT_CLUSTER_SCRIPT, "ft" + std::to_string(::getpid() % 100000), kNodes);
  fmt::print("# ft_bench: {} nodes x {} ranks (DDP, shared memory + Gloo), {} steps of {} ms "
             "compute, seed {}; load average before: ",
             kNodes, kPerNode, o.steps, o.computeMs, o.seed);
  fmt::print("{}\n", loadAverage());

  // No failure first: one cluster for every pair.
  std::vector<double> periodOn, periodOff, workOn, workOff, perStepOn, perStepOff;
  cluster.up();
  for (int p = 0; p < o.pairs; ++p) {
    for (int side = 0; side < 2; ++side) {
      const bool on = (p + side) % 2 == 0;
      JobSpec spec;
      spec.argv = launchArgv(o, cluster, on, o.steps, 0, "");
      const JobRun run = runJob(spec, cluster);
      const NoFailure n = measureNoFailure(run);
      if (run.exitCode != 0 || n.periodMs < 0) {
        fmt::print(stderr, "ft_bench: no-failure job (mode {}) failed, exit {}\n",
                   on ? "continue" : "restart", run.exitCode);
        dumpJob(run);
        continue;
      }
      fmt::print("raw no-failure pair {} {}: period_ms {:.2f} work_ms {:.3f} collectives/step "
                 "{:.3f}\n",
                 p, on ? "continue" : "restart", n.periodMs, n.workMs, n.perStep);
      (on ? periodOn : periodOff).push_back(n.periodMs);
      (on ? workOn : workOff).push_back(n.workMs);
      (on ? perStepOn : perStepOff).push_back(n.perStep);
    }
  }
  cluster.down();
  const std::vector<double> periodRatios = pairedRatios(periodOn, periodOff);
  const std::vector<double> workRatios = pairedRatios(workOn, workOff);

  std::vector<std::pair<Loss, std::pair<Column, Column>>> results;
  std::vector<std::vector<double>> lostRatios;
  for (Loss kind : o.kinds) {
    if (kind == Loss::kJoin) continue;  // runJoinBench's
    Column cont, restart;
    std::vector<double> lostRatio;
    for (int r = 0; r < o.runs; ++r) {
      // The same loss for both paths of a run: after step 15-24 (scaled to --steps), a random
      // moment within the next step.
      const int64_t lo = o.steps * 15 / 40;
      const int64_t after = lo +
                            static_cast<int64_t>(
                                rng() % static_cast<unsigned>(std::max<int64_t>(1, o.steps / 4)));
      const double delay = std::uniform_real_distribution<double>(
          0, static_cast<double>(o.computeMs) / 1e3)(rng);
      Failure byMode[2];
      for (int side = 0; side < 2; ++side) {
        const bool on = (r + side) % 2 == 0;
        cluster.up();
        JobSpec spec;
        spec.argv = launchArgv(o, cluster, on, o.steps, o.saveEvery,
                               cluster.workDir() + "/ckpt-" + std::to_string(r));
        spec.loss = kind;
        spec.node = kLostNode;
        spec.loseAfter = after;
        spec.loseDelay = delay;
        const Failure f = runLoss(spec, cluster, on, r, o.show);
        (on ? cont : restart).add(f);
        byMode[on ? 0 : 1] = f;
      }
      if (byMode[0].problem.empty() && byMode[1].problem.empty() && byMode[1].secondsLost > 0)
        lostRatio.push_back(std::max(0.0, byMode[0].secondsLost) / byMode[1].secondsLost);
    }
    results.push_back({kind, {cont, restart}});
    lostRatios.push_back(lostRatio);
  }

  for (size_t i = 0; i < results.size(); ++i) {
    printFailures(o, results[i].first, results[i].second.first, results[i].second.second,
                  lostRatios[i]);
  }
  if (std::find(o.kinds.begin(), o.kinds.end(), Loss::kJoin) != o.kinds.end()) {
    runJoinBench(o, o.seed);
  }
  if (o.pairs > 0) {  // --pairs 0: the failure rows only
    fmt::print("\n# no failure: {} interleaved pairs of {}-step jobs, continue / restart\n",
               o.pairs, o.steps);
    fmt::print(
        "| measure | continue | restart | continue / restart (paired) |\n|---|---:|---:|---:|\n");
    fmt::print("| step period, ms | {} | {} | {} |\n", cell(periodOn), cell(periodOff),
               cell(periodRatios, "{:.4f}"));
    fmt::print("| step's work less compute, ms | {} | {} | {} |\n", cell(workOn, "{:.3f}"),
               cell(workOff, "{:.3f}"), cell(workRatios, "{:.3f}"));
    fmt::print("| collectives per step | {} | {} | {:+.3f} |\n", cell(perStepOn, "{:.3f}"),
               cell(perStepOff, "{:.3f}"), median(perStepOn) - median(perStepOff));
    fmt::print("# aims: step <= 1.03x: {}; 0 extra messages per step: {}\n",
               !periodRatios.empty() && median(periodRatios) <= 1.03 ? "met" : "NOT met",
               !perStepOn.empty() && median(perStepOn) == median(perStepOff) ? "met" : "NOT met");
  }
  fmt::print("# torchft's published figures, NOT measured here: a failure a minute, 11 s steps, "
             "81 % efficiency; Gloo re-formed in < 1 s; ~1 step lost per failure\n");
  fmt::print("# load average after: {}\n", loadAverage());
  return 0;
}

}  // namespace

}  // namespace dtrain::bench

int main(int argc, char** argv) {
  try {
    if (argc > 1 && std::string(argv[1]) == "--worker")
      return dtrain::bench::ftWorker(argc - 2, argv + 2);
    const dtrain::bench::Options o = dtrain::bench::parse(argc, argv);
    return o.zero > 0 ? dtrain::bench::runZeroBench(o) : dtrain::bench::runBench(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ft_bench: %s\n", e.what());
    return 1;
  }
}
