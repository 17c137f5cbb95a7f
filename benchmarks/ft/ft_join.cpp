// ft_bench --kinds join: what a node that comes to a running job costs it (benchmarks/README.md,
// "ft_bench"). A manual job -- a launch per host, node 0's hosting the store -- of 2 nodes x 2
// ranks under `--nnodes 2:3 --on-node-loss continue`, the DDP rows' worker with a checkpoint every
// --save-every steps; after step 15-24 (scaled to --steps), at a random moment within the next
// step, node 2's launch starts. Under `--on-node-join live` the master takes it into the running
// round (the members train on until its ranks reach their first step, then discard their step in
// flight and hand it their state); under `restart` (the default) it stops the round and every node
// starts again from the last checkpoint. Both per run, interleaved, each on a fresh cluster.
#include <algorithm>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/stats.h"
#include "ft_bench.h"

namespace dtrain::bench {

namespace {

// One join's figures, in seconds from node 2's launch starting unless named otherwise; -1 where
// not seen.
struct Join {
  std::string problem;
  double decided = -1;    // -> the master's line: taken in, or the round stopped
  double ready = -1;      // -> live: the newcomer's ranks at their first step (the epoch in effect)
  double reformMs = -1;   // the slowest member's re-form (live)
  double first = -1;      // -> the step after the last one committed before `cut`, committed
                          // (live: the step in flight, run once -- Note [Joins at step
                          // boundaries] -- or again when the join cut it short)
  double wide = -1;       // -> the first step committed at 6 ranks
  double stepsLost = -1;  // trained and thrown away
  // The members' stall: live, the first commit at 6 ranks - the commit before it - one period
  // (the re-form and the settling, with the step in flight when the join cut it short);
  // restart, `first`'s commit - the last before `cut` - one period.
  double secondsLost = -1;
  int64_t lastBefore = -1;
};

Join measureJoin(const JobRun& run, bool live, int codes) {
  Join j;
  double decidedAt = 0;
  for (const auto& l : run.lines) {
    const bool decision = live ? l.text.find("launch: round 0 takes in node 2") != std::string::npos
                               : l.text.find("launch: stopping round 0") != std::string::npos;
    if (decision && l.t >= run.lostAt) {
      decidedAt = l.t;
      break;
    }
  }
  if (run.lostAt > 0 && decidedAt > 0) j.decided = decidedAt - run.lostAt;
  // Where the members are interrupted: live, when their watchers take the epoch in -- once the
  // newcomer's ranks are ready (Note [Joining a running round] in
  // launcher/cluster/master/node_loss.h); the master says so within its heartbeat-read period.
  // Else at the decision.
  double cut = live ? 0 : decidedAt;
  bool masterSaw = !live;
  for (const auto& l : run.lines) {
    if (!live || decidedAt == 0 || l.t < decidedAt) continue;
    if (cut == 0 && l.text.find("membership epoch 1: ") != std::string::npos) {
      cut = l.t;
      j.ready = cut - run.lostAt;
    }
    masterSaw = masterSaw || l.text.find("epoch 1 takes effect") != std::string::npos;
  }
  const std::vector<Commit> all = commits(run);
  std::vector<double> periods;
  double tLast = 0;
  for (size_t i = 0; i < all.size() && cut > 0; ++i) {
    if (all[i].t >= cut) break;
    j.lastBefore = all[i].step;
    tLast = all[i].t;
    if (i >= 2) periods.push_back(all[i].t - all[i - 1].t);
  }
  double previous = tLast;  // the commit before the one looked at
  for (const auto& c : all) {
    if (cut == 0 || c.t < cut) continue;
    if (j.first < 0 && c.step == j.lastBefore + 1) {
      j.first = c.t - run.lostAt;
      if (!live) j.secondsLost = c.t - tLast - median(periods, 0);
    }
    if (j.wide < 0 && c.world == kNodes * kPerNode) {
      j.wide = c.t - run.lostAt;
      if (live) j.secondsLost = c.t - previous - median(periods, 0);
    }
    previous = c.t;
  }
  std::set<int64_t> discarded;
  int64_t restored = -2;
  for (const auto& l : run.lines) {
    if (cut == 0 || l.t < cut) continue;
    const size_t d = l.text.find("ft discarded step ");
    if (d != std::string::npos) discarded.insert(std::stoll(l.text.substr(d + 18)));
    const size_t r = l.text.find("ft restored step ");
    if (r != std::string::npos) restored = std::stoll(l.text.substr(r + 17));
    const size_t re = l.text.find("re-formed in membership epoch");
    const size_t in = l.text.rfind(", in ");
    if (re != std::string::npos && in != std::string::npos) {
      j.reformMs = std::max(j.reformMs, std::stod(l.text.substr(in + 5)));
    }
  }
  if (live) {
    j.stepsLost = static_cast<double>(discarded.size());
  } else if (restored >= -1 && j.lastBefore >= 0) {
    j.stepsLost = static_cast<double>(j.lastBefore - restored + 1);  // since the checkpoint
  }
  if (codes != 0) j.problem = fmt::format("a node's launch did not exit 0 ({})", codes);
  else if (decidedAt == 0) j.problem = "the master did not decide on node 2";
  else if (cut == 0 || !masterSaw) j.problem = "the newcomer never became ready";
  else if (j.first < 0 || j.wide < 0) j.problem = "no step committed at 6 ranks";
  else if (live && restored >= -1) j.problem = "fell back to the restart path";
  else if (!live && restored < -1) j.problem = "did not restart from the checkpoint";
  return j;
}

void printJoinRaw(bool live, int run, const Join& j) {
  fmt::print("raw {} join run {}: after step {} decided {:.3f} ready {:.3f} reform_ms {:.0f} first "
             "{:.3f} wide {:.3f} steps_lost {:.0f} seconds_lost {:.3f}{}\n",
             live ? "live" : "restart", run, j.lastBefore, j.decided, j.ready, j.reformMs, j.first,
             j.wide, j.stepsLost, j.secondsLost, j.problem.empty() ? "" : " PROBLEM: " + j.problem);
  std::fflush(stdout);
}

struct JoinColumn {
  std::vector<double> decided, ready, reformMs, first, wide, stepsLost, secondsLost;
  int problems = 0;
  bool add(const Join& j) {
    if (!j.problem.empty()) {
      ++problems;
      return false;
    }
    putMeasured(decided, j.decided);
    putMeasured(ready, j.ready);
    putMeasured(reformMs, j.reformMs);
    putMeasured(first, j.first);
    putMeasured(wide, j.wide);
    putMeasured(stepsLost, j.stepsLost);
    putMeasured(secondsLost, j.secondsLost);
    return true;
  }
};

// One side of run `r`: nodes 0 and 1 started together, node 2 on cue; the figures of node 0's
// lines (the master's decisions, rank 0's commits).
Join runOne(const Options& o, bool live, int r, int64_t after, double delay) {
  SimCluster cluster(DTRAIN_FT_CLUSTER_SCRIPT, "fj" + std::to_string(::getpid() % 100000), kNodes);
  cluster.up();
  const std::string token = cluster.stateDir() + "/job.token";
  if (FILE* f = std::fopen(token.c_str(), "w")) {
    std::fputs("0123456789abcdef0123456789abcdef\n", f);
    std::fclose(f);
  }
  const std::string endpoint = cluster.hostList().substr(0, cluster.hostList().find(',')) +
                               ":29400";
  auto node = [&](int k) {
    return cluster.onHost(k, {DTRAIN_FT_LAUNCH,
                              "--nnodes",
                              fmt::format("2:{}", kNodes),
                              "--node-rank",
                              std::to_string(k),
                              "--nproc-per-node",
                              std::to_string(kPerNode),
                              "--rdzv-endpoint",
                              endpoint,
                              "--token-file",
                              token,
                              "--rdzv-timeout",
                              "3",
                              "--on-node-loss",
                              "continue",
                              "--on-node-join",
                              live ? "live" : "restart",
                              "--max-restarts",
                              "1",
                              "--heartbeat-interval",
                              "0.5",
                              "--heartbeat-timeout",
                              "3",
                              "--grace-period",
                              "2",
                              DTRAIN_FT_SELF,
                              "--worker",
                              "--steps",
                              std::to_string(o.steps),
                              "--compute-ms",
                              std::to_string(o.computeMs),
                              "--save-every",
                              std::to_string(o.saveEvery),
                              "--checkpoint-dir",
                              cluster.workDir() + "/ckpt"});
  };
  Background node1 = startBackground(node(1), cluster.stateDir() + "/node1.log");
  Background node2;
  JobSpec spec;
  spec.argv = node(0);
  spec.loseAfter = after;
  spec.loseDelay = delay;
  spec.cue = [&] {
    const double at = wallNow();
    node2 = startBackground(node(2), cluster.stateDir() + "/node2.log");
    return at;
  };
  JobRun run = runJob(spec, cluster);
  const int codes = std::abs(run.exitCode) + std::abs(finish(node1, 30)) +
                    (node2.pid > 0 ? std::abs(finish(node2, 30)) : 1);
  const Join j = measureJoin(run, live, codes);
  printJoinRaw(live, r, j);
  if (!j.problem.empty() || o.show) {
    dumpJob(run);
    for (const std::string& log :
         {cluster.stateDir() + "/node1.log", cluster.stateDir() + "/node2.log"}) {
      if (FILE* f = std::fopen(log.c_str(), "r")) {
        fmt::print(stderr, "  -- {}\n", log);
        char buf[4096];
        while (std::fgets(buf, sizeof buf, f)) fmt::print(stderr, "  {}", buf);
        std::fclose(f);
      }
    }
  }
  cluster.down();
  return j;
}

}  // namespace

void runJoinBench(const Options& o, unsigned seed) {
  std::mt19937 rng(seed);
  JoinColumn live, restart;
  std::vector<double> lostRatio;
  for (int r = 0; r < o.runs; ++r) {
    const int64_t lo = o.steps * 15 / 40;
    const int64_t after =
        lo + static_cast<int64_t>(rng() % static_cast<unsigned>(std::max<int64_t>(1, o.steps / 4)));
    const double delay = std::uniform_real_distribution<double>(
        0, static_cast<double>(o.computeMs) / 1e3)(rng);
    Join bySide[2];
    for (int side = 0; side < 2; ++side) {
      const bool on = (r + side) % 2 == 0;
      bySide[on ? 0 : 1] = runOne(o, on, r, after, delay);
      (on ? live : restart).add(bySide[on ? 0 : 1]);
    }
    if (bySide[0].problem.empty() && bySide[1].problem.empty() && bySide[1].secondsLost > 0) {
      lostRatio.push_back(std::max(0.0, bySide[0].secondsLost) / bySide[1].secondsLost);
    }
  }
  fmt::print("\n# node 2 joins: {} runs, median [min-max] over the runs that went as they should; "
             "seconds from node 2's launch starting\n",
             o.runs);
  fmt::print("| measure | --on-node-join live | restart (checkpoint every {} steps) |\n"
             "|---|---:|---:|\n",
             o.saveEvery);
  fmt::print("| the master's decision (taken in / round stopped) | {} | {} |\n", cell(live.decided),
             cell(restart.decided));
  fmt::print("| the newcomer's ranks at their first step (the epoch takes effect) | {} | - |\n",
             cell(live.ready));
  fmt::print("| re-form, ms (slowest member) | {} | - |\n", cell(live.reformMs, "{:.0f}"));
  fmt::print("| the step in flight committed (restart: again) | {} | {} |\n", cell(live.first),
             cell(restart.first));
  fmt::print("| first step at 6 ranks | {} | {} |\n", cell(live.wide), cell(restart.wide));
  fmt::print("| steps lost | {} | {} |\n", cell(live.stepsLost, "{:.0f}"),
             cell(restart.stepsLost, "{:.0f}"));
  fmt::print("| members' training seconds lost | {} | {} |\n", cell(live.secondsLost),
             cell(restart.secondsLost));
  fmt::print("| runs that failed | {} | {} |\n", live.problems, restart.problems);
  fmt::print("# seconds lost, live / restart (paired median): {}\n", cell(lostRatio, "{:.3f}"));
}

}  // namespace dtrain::bench
