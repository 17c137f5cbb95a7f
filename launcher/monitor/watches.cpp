#include "launcher/monitor/watches.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace dtrain::launcher::monitor {

void MemoryWatch::addRanks(double now, const std::vector<RankSample>& ranks) {
  Point p;
  p.time = now;
  for (const auto& r : ranks) p.rss[r.rank] = r.rssBytes;
  history_.push_back(std::move(p));
  // Keep one point older than the window, so growth covers the whole window.
  while (history_.size() > 2 && history_[1].time <= now - options_.windowSeconds) {
    history_.pop_front();
  }
}

std::vector<MemoryWatch::Growth> MemoryWatch::growth(double now) const {
  std::vector<Growth> out;
  if (history_.empty()) return out;
  const Point& last = history_.back();
  for (const auto& [rank, rss] : last.rss) {
    Growth g;
    g.rank = rank;
    g.rssBytes = rss;
    // The oldest point within the window (or just before it) that knows this rank.
    for (const auto& p : history_) {
      auto it = p.rss.find(rank);
      if (it == p.rss.end() || p.time < now - options_.windowSeconds - 1e-9) continue;
      g.grownBytes = rss - it->second;
      g.seconds = last.time - p.time;
      break;
    }
    out.push_back(g);
  }
  return out;
}

std::optional<std::string> MemoryWatch::check(double now, const NodeSample& node,
                                              const std::string& nodeName) {
  auto fraction = node.memUsedFraction();
  if (!fraction) return std::nullopt;
  if (*fraction < options_.rearmFraction) warned_ = false;
  if (warned_ || *fraction < options_.warnFraction) return std::nullopt;
  warned_ = true;

  std::string text = fmt::format(
      "launch: WARNING: node {}: {:.0f} % of memory in use ({}); the OOM killer acts at 100 %\n",
      nodeName, *fraction * 100, node.describeMemory());
  std::vector<Growth> g = growth(now);
  if (!g.empty()) {
    auto bySize = g;
    std::sort(bySize.begin(), bySize.end(),
              [](const Growth& a, const Growth& b) { return a.rssBytes > b.rssBytes; });
    std::string largest;
    for (size_t i = 0; i < bySize.size() && i < 3; ++i) {
      largest += fmt::format("{}rank {} {}", i ? ", " : "", bySize[i].rank,
                             formatBytes(bySize[i].rssBytes));
    }
    text += "  largest: " + largest + "\n";
    auto byGrowth = g;
    std::sort(byGrowth.begin(), byGrowth.end(),
              [](const Growth& a, const Growth& b) { return a.grownBytes > b.grownBytes; });
    std::string fastest;
    double totalRate = 0;
    for (size_t i = 0; i < byGrowth.size(); ++i) {
      const Growth& x = byGrowth[i];
      if (x.grownBytes <= 0 || x.seconds <= 0) continue;
      totalRate += static_cast<double>(x.grownBytes) / x.seconds;
      if (i >= 3) continue;
      fastest += fmt::format(
          "{}rank {} +{} in the last {:.0f} s ({}/s)", fastest.empty() ? "" : ", ", x.rank,
          formatBytes(x.grownBytes), x.seconds,
          formatBytes(static_cast<int64_t>(static_cast<double>(x.grownBytes) / x.seconds)));
    }
    if (fastest.empty()) {
      text += "  fastest-growing: none of the ranks grew over the last minute (the memory is "
              "held elsewhere: page cache, /dev/shm, another process)\n";
    } else {
      text += "  fastest-growing: " + fastest + "\n";
      if (auto headroom = node.memHeadroomBytes(); headroom && totalRate > 0) {
        text += fmt::format("  at this rate the node runs out of memory in about {:.0f} s\n",
                            static_cast<double>(*headroom) / totalRate);
      }
    }
  }
  text += "  HINT: a smaller batch, fewer DataLoader workers, or tensors kept across steps (a "
          "growing loss history, a cache) are the usual causes\n";
  return text;
}

std::optional<std::string> GpuIdleWatch::observe(double now, const std::vector<GpuSample>& gpus,
                                                 bool workersRunning, const std::string& nodeName) {
  bool allIdle = workersRunning && !gpus.empty();
  for (const auto& g : gpus) {
    if (!g.utilPercent || *g.utilPercent >= options_.utilPercent) allIdle = false;
  }
  if (!allIdle) {
    idleSince_.reset();
    warned_ = false;
    return std::nullopt;
  }
  if (!idleSince_) idleSince_ = now;
  if (warned_ || now - *idleSince_ < options_.seconds) return std::nullopt;
  warned_ = true;
  std::string list;
  for (const auto& g : gpus) {
    list += fmt::format("{}{} ({:.0f} %)", list.empty() ? "" : ", ", g.index, *g.utilPercent);
  }
  return fmt::format(
      "launch: WARNING: node {}: GPU{} {} under {:.0f} % utilisation for {:.0f} s while the "
      "workers run: the job is paying for idle GPUs\n  HINT: a data-loading bound job (more "
      "DataLoader workers, pinned memory, a faster input format), or a stuck one "
      "(--stall-timeout reports where)\n",
      nodeName, gpus.size() == 1 ? "" : "s", list, options_.utilPercent, now - *idleSince_);
}

namespace {

std::string minMedianMax(std::vector<double> v) {
  if (v.empty()) return "n/a";
  std::sort(v.begin(), v.end());
  double median = v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  return fmt::format("{:.0f}/{:.0f}/{:.0f}", v.front(), median, v.back());
}

}  // namespace

std::string formatStatusLine(const std::vector<Record>& latest, const JobState& job) {
  int alive = 0;
  std::vector<double> cpu;
  std::vector<double> gpu;
  std::string memory;
  double worst = -1;
  for (const auto& r : latest) {
    if (r.source != "launch") continue;
    if (!r.rank && !r.gpu) {
      if (auto a = r.field("workers_alive")) alive += static_cast<int>(*a);
      auto f = r.field("mem_used_ratio");
      if (f && *f > worst) {
        worst = *f;
        auto h = r.field("mem_headroom_bytes");
        memory = fmt::format("node {} {:.0f} % in use{}", r.node, *f * 100,
                             h ? ", " + formatBytes(static_cast<int64_t>(*h)) + " headroom" : "");
      }
    } else if (r.rank && !r.gpu) {
      if (auto c = r.field("cpu_percent")) cpu.push_back(*c);
    } else if (r.gpu && !r.rank) {
      if (auto u = r.field("gpu_util")) gpu.push_back(*u);
    }
  }
  return fmt::format(
      "launch: status: attempt {}, ranks alive {}/{}; CPU % per rank "
      "min/median/max {}; GPU %{} {}; memory: {}\n",
      job.attempt, alive, job.worldSize, minMedianMax(cpu),
      gpu.empty() ? "" : fmt::format(" ({} GPU{})", gpu.size(), gpu.size() == 1 ? "" : "s"),
      gpu.empty() ? "n/a (no GPU sampled)" : minMedianMax(gpu), memory.empty() ? "n/a" : memory);
}

}  // namespace dtrain::launcher::monitor
