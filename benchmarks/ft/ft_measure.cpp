// What a job's lines say about a lost node (ft_bench.h's Failure): the master's decision, the
// survivors' way out of their step, re-form and restore, the commits before and after.
#include <algorithm>
#include <cstdio>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/stats.h"
#include "ft_bench.h"

namespace dtrain::bench {

namespace {

int rankOf(const std::string& text) {
  const size_t at = text.find(" rank ", text.find("ft "));
  return at == std::string::npos ? -1 : std::stoi(text.substr(at + 6));
}

// A survivor's restore from the mirrors, as TrainingState::tryStep logs it: the bytes it sent
// (or, as the first restore counted them, its communicator's payload bytes meanwhile).
const std::regex kRestoreLine(
    R"(the sharded state of step (\d+) restored from the mirrors on \d+ ranks)"
    R"((?: \(\d+ of them joined\))? in ([0-9.]+) s, )"
    R"((\d+) (?:payload bytes through|bytes sent by) rank \d+ .*; (\d+) step\(s\) run again)");

}  // namespace

std::vector<Commit> commits(const JobRun& run) {
  std::vector<Commit> out;
  for (const auto& l : run.lines) {
    const size_t at = l.text.find("ft step ");
    if (l.err || at == std::string::npos) continue;
    // "ft step S world W t=... work_ms=..."
    const size_t world = l.text.find(" world ", at);
    out.push_back({std::stoll(l.text.substr(at + 8)),
                   world == std::string::npos ? -1 : std::stoi(l.text.substr(world + 7)),
                   field(l.text, "t"), field(l.text, "work_ms")});
  }
  return out;
}

Failure measure(const JobRun& run, bool continueMode) {
  Failure f;
  const std::vector<Commit> all = commits(run);
  std::vector<double> periods;
  double tLast = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].t >= run.lostAt) break;
    f.lastBefore = all[i].step;
    tLast = all[i].t;
    if (i >= 2) periods.push_back(all[i].t - all[i - 1].t);
  }
  f.period = median(periods, -1);
  for (const auto& c : all) {
    if (c.t > run.lostAt && f.firstAny < 0) {
      f.firstAny = c.t - run.lostAt;
      f.firstWork = c.workMs / 1e3;
    }
    if (c.t > run.lostAt && c.step == f.lastBefore + 1) {
      f.first = c.t - run.lostAt;
      f.secondsLost = c.t - tLast - median(periods);
      break;
    }
  }
  std::set<int64_t> discardedSteps;
  double rerun = -1;
  std::smatch m;
  for (const auto& l : run.lines) {
    if (l.t < run.lostAt) continue;
    const double t = field(l.text, "t");
    if (l.text.find("launch: round 0 goes on without") != std::string::npos && f.detection < 0)
      f.detection = l.t - run.lostAt;
    if (!continueMode && l.text.find("launch: stopping round 0") != std::string::npos &&
        f.detection < 0)
      f.detection = l.t - run.lostAt;
    if (l.text.find("ft restored step ") != std::string::npos)
      f.restored = std::stoll(l.text.substr(l.text.find("ft restored step ") + 17));
    // Only the survivors, ranks 0-3 of the first epoch: the lost node's ranks were 4 and 5.
    if (l.text.find("ft out step ") != std::string::npos && rankOf(l.text) < kLostNode * kPerNode)
      f.out = std::max(f.out, t - run.lostAt);
    if (l.text.find("ft discarded step ") != std::string::npos) {
      f.discarded = std::max(f.discarded, t - run.lostAt);
      discardedSteps.insert(std::stoll(l.text.substr(l.text.find("ft discarded step ") + 18)));
    }
    const size_t re = l.text.find("re-formed in membership epoch");
    if (re != std::string::npos) {
      const size_t in = l.text.rfind(", in ");
      if (in != std::string::npos)
        f.reformMs = std::max(f.reformMs, std::stod(l.text.substr(in + 5)));
    }
    if (std::regex_search(l.text, m, kRestoreLine)) {
      f.generation = std::stoll(m[1].str());
      f.restoreSeconds = std::max(f.restoreSeconds, std::stod(m[2].str()));
      const double bytes = std::stod(m[3].str());
      f.restoreBytes = std::max(0.0, f.restoreBytes) + bytes;
      f.restoreBytesMax = std::max(f.restoreBytesMax, bytes);
      rerun = std::max(rerun, std::stod(m[4].str()));
    }
  }
  if (continueMode) {
    // ZeRO: every step since the generation rolled back to; DDP: the step in flight.
    f.stepsLost = rerun >= 0 ? rerun : static_cast<double>(discardedSteps.size());
  } else if (f.restored >= -1 && f.first >= 0) {
    // Recomputed since the checkpoint, and the step in flight.
    f.stepsLost = static_cast<double>(f.lastBefore - f.restored + 1);
  }
  int finals = 0, restarts = 0;
  for (const auto& l : run.lines) {
    if (l.text.find("ft done rank ") != std::string::npos) ++finals;
    if (l.text.find("ft start ") != std::string::npos) ++restarts;
  }
  if (run.exitCode != 0) f.problem = fmt::format("launch exited {}", run.exitCode);
  else if (f.first < 0) f.problem = "no step committed after the loss";
  else if (finals != (kNodes - 1) * kPerNode)
    f.problem = fmt::format("{} workers finished, not {}", finals, (kNodes - 1) * kPerNode);
  else if (continueMode && restarts != 1) f.problem = "fell back to the restart path";
  else if (!continueMode && restarts != 2) f.problem = "did not restart";
  return f;
}

void putMeasured(std::vector<double>& v, double x) {
  if (x >= 0) v.push_back(x);
}

bool FailureColumn::add(const Failure& f) {
  if (!f.problem.empty()) {
    ++problems;
    return false;
  }
  putMeasured(detection, f.detection);
  putMeasured(out, f.out);
  putMeasured(reformMs, f.reformMs);
  putMeasured(discarded, f.discarded);
  putMeasured(first, f.first);
  putMeasured(stepsLost, f.stepsLost);
  putMeasured(secondsLost, f.secondsLost);
  return true;
}

std::string cell(const std::vector<double>& v, const char* format) {
  if (v.empty()) return "-";
  return fmt::format(fmt::runtime(std::string(format) + " [" + format + "-" + format + "]"),
                     median(v), spread(v).min, spread(v).max);
}

void printRaw(const char* mode, Loss kind, int run, const Failure& f) {
  fmt::print("raw {} {} run {}: lost after step {} detection {:.3f} out {:.3f} reform_ms {:.0f} "
             "discarded {:.3f} first {:.3f} steps_lost {:.0f} seconds_lost {:.3f} restored {}",
             mode, lossName(kind), run, f.lastBefore, f.detection, f.out, f.reformMs, f.discarded,
             f.first, f.stepsLost, f.secondsLost, f.restored);
  if (f.generation >= 0) {
    fmt::print(" first_any {:.3f} first_work {:.3f} generation {} restore_s {:.3f} restore_bytes "
               "{:.0f} (max {:.0f})",
               f.firstAny, f.firstWork, f.generation, f.restoreSeconds, f.restoreBytes,
               f.restoreBytesMax);
  }
  fmt::print("{}\n", f.problem.empty() ? "" : " PROBLEM: " + f.problem);
  std::fflush(stdout);
}

Failure runLoss(const JobSpec& spec, SimCluster& cluster, bool continueMode, int r, bool show,
                JobRun* job) {
  JobRun run = runJob(spec, cluster);
  cluster.down();
  const Failure f = run.lostAt > 0 ? measure(run, continueMode)
                                   : Failure{"the node was never lost"};
  printRaw(continueMode ? "continue" : "restart", spec.loss, r, f);
  if (!f.problem.empty() || show) dumpJob(run);
  if (job) *job = std::move(run);
  return f;
}

void dumpJob(const JobRun& run) {
  for (const auto& l : run.lines)
    fmt::print(stderr, "  {:.3f} {} {}\n", l.t - run.started, l.err ? "E" : "O", l.text);
}

}  // namespace dtrain::bench
