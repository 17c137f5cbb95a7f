// ft_bench --zero STAGE: what a lost node costs a job under ZeRO stage 1 or 2, whose ranks mirror
// their sharded state on a rank of the next node every K steps (docs/design.md, "Sharded state
// across a lost node"), beside the restart path from a checkpoint every K steps; and what the
// mirrors cost a job that loses nothing (benchmarks/README.md, "ft_bench"). The worker trains an
// MLP of --features -> --depth x --width -> 8 (by default 2048 -> 5 x 4096 -> 8, 92.3 M
// parameters) with Adam under a ShardedOptimizer, its real forward and backward as the step's
// compute (no sleep).
//
// The mirrors' cost: one job in blocks of B steps (--block-steps, 2 by default), the mirrors
// refreshed at the first step of every other block only; a mirrored block and the plain one
// after it are a pair. A refresh costs its step the difference, Delta; mirrored every K steps, a
// job's step takes 1 + Delta / (K x T) of a plain step's T, which each pair gives with its own
// Delta and T. B = K measures that directly, at 2K steps a pair.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_run.h"
#include "common/stats.h"
#include "ft_bench.h"

namespace dtrain::bench {

namespace {

// Rank 0's "ft zero" line: its blocks and what it holds, from the storages.
struct Holding {
  double stateBytes = -1;  // its sharded state: block of the master (or parameters) + Adam's 2
  double parameters = -1;
  double gradients = -1;
  double optimizerState = -1;
  double buckets = -1;
  double mirrorBytes = -1;
  double rssPeak = -1;
};

std::vector<Holding> holdings(const JobRun& run) {
  std::vector<Holding> out;
  for (const auto& l : run.lines) {
    if (l.text.find("ft zero rank 0 world ") == std::string::npos) continue;
    Holding h;
    h.stateBytes = field(l.text, "state_bytes");
    h.parameters = field(l.text, "parameters");
    h.gradients = field(l.text, "gradients");
    h.optimizerState = field(l.text, "optimizer_state");
    h.buckets = field(l.text, "buckets");
    h.mirrorBytes = field(l.text, "mirror_bytes");
    h.rssPeak = field(l.text, "rss_peak");
    out.push_back(h);
  }
  return out;
}

double paramsOf(const JobRun& run) {
  for (const auto& l : run.lines) {
    if (l.text.find("ft start ") != std::string::npos) return field(l.text, "params");
  }
  return -1;
}

Options withZeroDefaults(Options o) {
  if (o.kinds.empty()) o.kinds = {Loss::kKill};
  if (o.mirrorEvery < 0) o.mirrorEvery = 10;  // TrainingState's default
  if (o.blockSteps < 0) o.blockSteps = 2;
  if (o.saveEvery < 0) o.saveEvery = o.mirrorEvery;
  if (o.computeMs < 0) o.computeMs = 0;
  if (o.features < 0) o.features = 2048;
  if (o.width < 0) o.width = 4096;
  if (o.depth < 0) o.depth = 5;
  return o;
}

std::vector<std::string> zeroFlags(const Options& o, bool blocks) {
  std::vector<std::string> f = {
      "--zero",  std::to_string(o.zero),  "--features", std::to_string(o.features),
      "--width", std::to_string(o.width), "--depth",    std::to_string(o.depth)};
  if (blocks) {
    f.insert(f.end(), {"--mirror-blocks", std::to_string(o.blockSteps)});
  } else {
    f.insert(f.end(), {"--mirror-every", std::to_string(o.mirrorEvery)});
  }
  return f;
}

// The ZeRO table's: the first committed step after the loss is not the step reached again
// (up to K + 1 steps are run again), so both are given.
struct ZeroColumn : FailureColumn {
  int64_t interval = 0;  // the mirrors' (the checkpoints')
  std::vector<double> restoreSeconds, firstAny, firstWork, firstLessDetection, period, bytesMax,
      bytesTotal;
  int duringRefresh = 0;  // losses during a refresh: back to the generation before, K + 1 steps
  int atFirst = 0;        // restores of generation 0, mirrored before Adam's first step
  void add(const Failure& f) {
    if (!FailureColumn::add(f)) return;
    putMeasured(restoreSeconds, f.restoreSeconds);
    putMeasured(firstAny, f.firstAny);
    putMeasured(firstWork, f.firstWork);
    if (f.firstAny >= 0 && f.detection >= 0) firstLessDetection.push_back(f.firstAny - f.detection);
    putMeasured(period, f.period);
    if (f.stepsLost > static_cast<double>(interval)) ++duringRefresh;
    if (f.generation == 0) ++atFirst;
    // Generation 0 holds the master block alone (no moments yet): not the state a loss later
    // in training moves.
    if (f.generation > 0 && f.restoreBytesMax >= 0) bytesMax.push_back(f.restoreBytesMax / 1e6);
    if (f.generation > 0 && f.restoreBytes >= 0) bytesTotal.push_back(f.restoreBytes / 1e6);
  }
};

// No failure: one job under `--on-node-loss continue` in blocks of B steps, mirrored at the
// start of every odd block, not in the even ones (--mirror-blocks); pair i is block 2i+3 (on)
// and the block after it (off). Blocks 0 to 2 are the warm-up: the first two refreshes (steps 0
// and B) allocate the copies the later ones reuse.
struct Blocks {
  std::vector<double> on, off;             // seconds per block
  std::vector<double> plainMs, refreshMs;  // step periods: steps not mirrored, the mirrored ones
  Holding end;
  double parameters = -1;
};

int64_t blocksJobSteps(const Options& o) { return (2 * o.pairs + 3) * o.blockSteps; }

Blocks measureBlocks(const JobRun& run, int64_t steps, int pairs) {
  Blocks out;
  std::map<int64_t, double> at;
  for (const Commit& c : commits(run)) at[c.step] = c.t;
  auto t = [&](int64_t step) { return at.count(step) ? at[step] : -1.0; };
  for (int i = 0; i < pairs; ++i) {
    const int64_t on = 2 * i + 3;
    const double t0 = t(on * steps - 1), t1 = t((on + 1) * steps - 1), t2 = t((on + 2) * steps - 1);
    if (t0 < 0 || t1 < 0 || t2 < 0) break;
    out.on.push_back(t1 - t0);
    out.off.push_back(t2 - t1);
  }
  for (int64_t s = 3 * steps; at.count(s) && at.count(s - 1); ++s) {
    const double ms = (t(s) - t(s - 1)) * 1e3;
    const bool mirrored = s % steps == 0 && (s / steps) % 2 == 1;
    (mirrored ? out.refreshMs : out.plainMs).push_back(ms);
  }
  const std::vector<Holding> h = holdings(run);
  if (!h.empty()) out.end = h.back();
  out.parameters = paramsOf(run);
  return out;
}

std::string mb(double bytes) { return bytes < 0 ? "-" : fmt::format("{:.1f}", bytes / 1e6); }

// The sharded state a loss concerns, MB, from rank 0's blocks before the loss: the lost node's
// ranks' (as many elements as rank 0's: every unit splits evenly) and every rank's.
struct StateMb {
  double lost = 0;
  double all = 0;
};

StateMb stateOf(const Holding& before) {
  return {before.stateBytes * kPerNode / 1e6, before.stateBytes * kNodes * kPerNode / 1e6};
}

void printZeroFailures(const Options& o, Loss kind, const ZeroColumn& cont,
                       const ZeroColumn& restart, const std::vector<double>& lostRatio,
                       const StateMb& state) {
  fmt::print("\n# ZeRO-{}, node lost by {}: {} runs, median [min-max] over the runs that went as "
             "they should; seconds from the loss\n",
             o.zero, lossName(kind), o.runs);
  fmt::print("| measure | continue (mirrors every {} steps) | restart (checkpoint every {} "
             "steps) |\n|---|---:|---:|\n",
             o.mirrorEvery, o.saveEvery);
  fmt::print("| one step before the loss (median period), s | {} | {} |\n", cell(cont.period),
             cell(restart.period));
  fmt::print("| detection (master's line) | {} | {} |\n", cell(cont.detection),
             cell(restart.detection));
  fmt::print("| every survivor out of its step | {} | - |\n", cell(cont.out));
  fmt::print("| re-form, ms (slowest survivor) | {} | - |\n", cell(cont.reformMs, "{:.0f}"));
  fmt::print("| restore from the mirrors, s (slowest survivor's line) | {} | - |\n",
             cell(cont.restoreSeconds));
  fmt::print("| every survivor re-formed and restored | {} | - |\n", cell(cont.discarded));
  fmt::print("| first committed step after the loss | {} | {} |\n", cell(cont.firstAny),
             cell(restart.firstAny));
  fmt::print("| its tryStep(), s (continue: with the new world's first mirror refresh) | {} | {} "
             "|\n",
             cell(cont.firstWork), cell(restart.firstWork));
  fmt::print("| first committed step - detection | {} | - |\n", cell(cont.firstLessDetection));
  fmt::print("| back at the step reached | {} | {} |\n", cell(cont.first), cell(restart.first));
  fmt::print("| steps lost (run again) | {} | {} |\n", cell(cont.stepsLost, "{:.0f}"),
             cell(restart.stepsLost, "{:.0f}"));
  fmt::print("| training seconds lost | {} | {} |\n", cell(cont.secondsLost),
             cell(restart.secondsLost));
  fmt::print("| seconds lost, continue / restart (paired) | {} | |\n", cell(lostRatio, "{:.3f}"));
  fmt::print("| losses during a mirror refresh (run again: K + 1 steps) | {} | - |\n",
             cont.duringRefresh);
  fmt::print("| restores of generation 0 (before Adam's first step) | {} | - |\n", cont.atFirst);
  fmt::print("| bytes the restore sent, MB, the largest of a survivor (its line; generations > "
             "0) | {} | - |\n",
             cell(cont.bytesMax, "{:.1f}"));
  fmt::print("| bytes the restore sent, MB, every survivor summed (generations > 0) | {} | - |\n",
             cell(cont.bytesTotal, "{:.1f}"));
  fmt::print("| the lost ranks' sharded state, MB (2 x owned x 3 fields x 4 B) | {:.1f} | - |\n",
             state.lost);
  fmt::print("| every rank's sharded state, MB (6 x owned x 3 fields x 4 B) | {:.1f} | - |\n",
             state.all);
  fmt::print("| runs that failed | {} | {} |\n", cont.problems, restart.problems);
  const auto verdict = [](bool met) { return met ? "met" : "NOT met"; };
  const double total = median(cont.bytesTotal, -1);
  fmt::print("# aims: bytes moved = the lost ranks' state +-5 % (a virtual-shard layout): {} "
             "({:.1f} MB = {:.2f}x their {:.1f} MB; the re-shard's measured bytes stated "
             "beside it); first step <= detection + 2 s: {} ({:.2f} s)\n",
             verdict(total > 0 && std::abs(total / state.lost - 1) <= 0.05), total,
             total / state.lost, state.lost,
             verdict(!cont.firstLessDetection.empty() && median(cont.firstLessDetection) <= 2),
             median(cont.firstLessDetection, -1));
}

}  // namespace

int runZeroBench(const Options& given) {
  if (::geteuid() != 0) {
    std::fprintf(stderr, "ft_bench: needs root (network namespaces, sshd, nft)\n");
    return 2;
  }
  const Options o = withZeroDefaults(given);
  const int64_t k = o.mirrorEvery;
  std::mt19937 rng(o.seed);
  SimCluster cluster(DTRAIN_FT_CLUSTER_SCRIPT, "fz" + std::to_string(::getpid() % 100000), kNodes);
  fmt::print("# ft_bench --zero {}: {} nodes x {} ranks (shared memory + Gloo), MLP {} -> {} x {} "
             "-> 8 with Adam, mirrors every {} steps, seed {}; load average before: {}\n",
             o.zero, kNodes, kPerNode, o.features, o.depth, o.width, k, o.seed, loadAverage());

  // No failure first: one job, mirrored and plain blocks in turn.
  Blocks blocks;
  double stepSeconds = 1;  // a plain step, for the moment of each loss below
  if (o.pairs > 0) {
    cluster.up();
    JobSpec spec;
    spec.argv = launchArgv(o, cluster, true, blocksJobSteps(o), 0, "", zeroFlags(o, true));
    spec.timeoutSeconds = 60 + 30.0 * static_cast<double>(blocksJobSteps(o));
    const JobRun run = runJob(spec, cluster);
    cluster.down();
    blocks = measureBlocks(run, o.blockSteps, o.pairs);
    if (run.exitCode != 0 || blocks.on.empty()) {
      fmt::print(stderr, "ft_bench: the no-failure job failed, exit {}\n", run.exitCode);
      dumpJob(run);
    }
    for (size_t i = 0; i < blocks.on.size(); ++i) {
      fmt::print("raw no-failure pair {}: mirrored block {:.3f} s, plain block {:.3f} s\n", i,
                 blocks.on[i], blocks.off[i]);
    }
    if (!blocks.plainMs.empty()) stepSeconds = median(blocks.plainMs) / 1e3;
  }

  for (Loss kind : o.kinds) {
    ZeroColumn cont, restart;
    cont.interval = restart.interval = k;
    std::vector<double> lostRatio;
    Holding before;  // rank 0's blocks before the loss
    for (int r = 0; r < o.runs; ++r) {
      // The same loss for both paths of a run: after step K .. 2K-1 (or --lose-after), a random
      // moment within the next step. The step in flight is uniform over K + 1 .. 2K, so the
      // steps run again are about uniform over 1 .. K on both paths: since the mirrors of step
      // K or 2K, K + 1 when the loss hits the refresh of step 2K (the continue path); since the
      // checkpoint of step K-1 or 2K-1 (the restart path). Not before K: generation 0 was
      // mirrored before Adam's first step, its state the master block alone.
      const int64_t lastAfter =
          o.loseAfter >= 0
              ? o.loseAfter
              : k + static_cast<int64_t>(rng() % static_cast<unsigned>(std::max<int64_t>(1, k)));
      const double delay = std::uniform_real_distribution<double>(0, 0.9 * stepSeconds)(rng);
      Failure byMode[2];
      for (int side = 0; side < 2; ++side) {
        const bool on = (r + side) % 2 == 0;
        cluster.up();
        JobSpec spec;
        // The continue path keeps no checkpoint: its state survives in the mirrors.
        spec.argv = launchArgv(o, cluster, on, lastAfter + 3, on ? 0 : o.saveEvery,
                               cluster.workDir() + "/ckpt-" + std::to_string(r),
                               zeroFlags(o, false));
        spec.loss = kind;
        spec.node = kLostNode;
        spec.loseAfter = lastAfter;
        spec.loseDelay = delay;
        spec.timeoutSeconds = 120 + 30.0 * static_cast<double>(lastAfter + 3 + k);
        JobRun run;
        const Failure f = runLoss(spec, cluster, on, r, o.show, &run);
        (on ? cont : restart).add(f);
        byMode[on ? 0 : 1] = f;
        const std::vector<Holding> h = holdings(run);
        if (on && f.problem.empty() && !h.empty()) before = h.front();
      }
      if (byMode[0].problem.empty() && byMode[1].problem.empty() && byMode[1].secondsLost > 0)
        lostRatio.push_back(std::max(0.0, byMode[0].secondsLost) / byMode[1].secondsLost);
    }
    printZeroFailures(o, kind, cont, restart, lostRatio, stateOf(before));
  }

  if (o.pairs > 0) {
    const int64_t b = o.blockSteps;
    const std::vector<double> ratios = pairedRatios(blocks.on, blocks.off);
    // Each pair's Delta and T (see the top of this file): the job's step at K, per pair.
    std::vector<double> delta, atK;
    for (size_t i = 0; i < blocks.on.size() && i < blocks.off.size(); ++i) {
      const double plain = blocks.off[i] / static_cast<double>(b);
      delta.push_back(blocks.on[i] - blocks.off[i]);
      atK.push_back(1 + delta.back() / (static_cast<double>(k) * plain));
    }
    const Holding& h = blocks.end;
    fmt::print("\n# ZeRO-{}, no failure: one {}-step job under --on-node-loss continue, {:.1f} M "
               "parameters; {} pairs of {}-step blocks, mirrored at the first step / not "
               "mirrored\n",
               o.zero, blocksJobSteps(o), blocks.parameters / 1e6, blocks.on.size(), b);
    fmt::print("| measure | mirrored | not mirrored | mirrored / not (paired) |\n"
               "|---|---:|---:|---:|\n");
    fmt::print("| block of {} steps, s | {} | {} | {} |\n", b, cell(blocks.on), cell(blocks.off),
               cell(ratios, "{:.4f}"));
    fmt::print("| step period, ms: the mirrored step / the others | {} | {} | |\n",
               cell(blocks.refreshMs, "{:.0f}"), cell(blocks.plainMs, "{:.0f}"));
    fmt::print("| a refresh's cost (Delta, paired), s | {} | | |\n", cell(delta));
    fmt::print("| the step mirrored every {} steps / a plain step (1 + Delta / (K T), paired) | | "
               "| {} |\n",
               k, cell(atK, "{:.4f}"));
    fmt::print("| payload sent per rank per refresh, MB (its sharded state, computed) | {} | 0 "
               "| |\n",
               mb(h.stateBytes));
    fmt::print("\n# rank 0's memory at the end, MB, from the storages (ZeroMemory, "
               "mirrorBytes())\n");
    fmt::print("| parameters | gradients | optimizer state | buckets | sharded state | mirrors | "
               "mirrors / sharded state | peak RSS |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    fmt::print("| {} | {} | {} | {} | {} | {} | {:.3f} | {} |\n", mb(h.parameters), mb(h.gradients),
               mb(h.optimizerState), mb(h.buckets), mb(h.stateBytes), mb(h.mirrorBytes),
               h.mirrorBytes / h.stateBytes, mb(h.rssPeak));
    fmt::print("# aims: step <= 1.05x at K = {}: {} ({:.4f}); mirrors = 3 x the sharded state: "
               "{}\n",
               k, !atK.empty() && median(atK) <= 1.05 ? "met" : "NOT met", median(atK, -1),
               h.mirrorBytes > 0 && h.mirrorBytes == 3 * h.stateBytes ? "met" : "NOT met");
  }
  fmt::print("# load average after: {}\n", loadAverage());
  return 0;
}

}  // namespace dtrain::bench
