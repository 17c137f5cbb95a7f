#include "launcher/monitor/stall_detector.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

namespace dtrain::launcher::monitor {

namespace {

const progress::CollectiveEntry* newest(const progress::CollectiveState* c) {
  return c == nullptr || c->tail.empty() ? nullptr : &c->tail.back();
}

std::string describeEntry(const progress::CollectiveEntry& e) {
  return fmt::format("seq {} {}", e.seq, e.what);
}

std::string plural(const std::vector<int>& ranks) {
  return ranks.size() == 1 ? "rank " + formatRanks(ranks) : "ranks " + formatRanks(ranks);
}

}  // namespace

std::string formatRanks(const std::vector<int>& ranksIn) {
  std::vector<int> ranks = ranksIn;
  std::sort(ranks.begin(), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += j > i + 1    ? fmt::format("{}-{}", ranks[i], ranks[j])
           : j == i + 1 ? fmt::format("{}, {}", ranks[i], ranks[j])
                        : std::to_string(ranks[i]);
    i = j + 1;
  }
  return out;
}

const progress::CollectiveState* primaryCollectives(const progress::RankReport& report) {
  for (const auto& c : report.collectives) {
    if (c.name == "pg/default") return &c;
  }
  return report.collectives.empty() ? nullptr : &report.collectives.front();
}

void StallDetector::reset(int worldSize) {
  worldSize_ = worldSize;
  ranks_.clear();
  reported_ = false;
}

void StallDetector::update(double now, const progress::RankReport& report) {
  auto it = ranks_.find(report.rank);
  if (it == ranks_.end()) {
    RankProgress p;
    p.report = report;
    p.lastAdvance = now;
    ranks_.emplace(report.rank, std::move(p));
    return;
  }
  if (progress::advanced(it->second.report, report)) {
    it->second.lastAdvance = now;
    it->second.report = report;
  }
}

void StallDetector::rankEnded(int rank) {
  auto it = ranks_.find(rank);
  if (it != ranks_.end()) it->second.ended = true;
}

std::optional<Stall> StallDetector::check(double now) {
  if (timeout_ <= 0) return std::nullopt;
  Stall stall;
  double newestStuck = 0;  // every stuck rank has been quiet at least since then
  for (const auto& [rank, p] : ranks_) {
    if (p.ended) continue;
    if (now - p.lastAdvance >= timeout_) {
      stall.stuck.push_back(rank);
      newestStuck = std::max(newestStuck, p.lastAdvance);
    } else {
      stall.moving.push_back(rank);
    }
  }
  if (stall.stuck.empty()) {
    reported_ = false;  // every live rank advanced within the timeout: any stall is over
    return std::nullopt;
  }
  if (reported_) return std::nullopt;
  for (int r = 0; r < worldSize_; ++r) {
    if (ranks_.count(r) == 0) stall.silent.push_back(r);
  }
  stall.kind = stall.moving.empty() ? Stall::Kind::NoProgress : Stall::Kind::Lagging;
  stall.quietSeconds = now - newestStuck;
  findBehind(stall, ranks_);
  reported_ = true;
  return stall;
}

namespace {

const progress::RankReport& reportOf(const std::map<int, RankProgress>& ranks, int r) {
  return ranks.at(r).report;
}

// 1. Collectives issued: the stuck ranks that issued `least`, fewer than the most advanced live
// rank (`most`), are behind.
void behindInCollectiveCount(Stall& stall, const std::map<int, RankProgress>& ranks, uint64_t least,
                             uint64_t most) {
  std::vector<int> ahead;
  const progress::CollectiveEntry* aheadEntry = nullptr;
  for (const auto& [rank, p] : ranks) {
    const auto* c = primaryCollectives(p.report);
    if (p.ended || c == nullptr) continue;
    if (c->issued == least) stall.behind.push_back(rank);
    if (c->issued == most) {
      ahead.push_back(rank);
      if (aheadEntry == nullptr) aheadEntry = newest(c);
    }
  }
  const auto* mine = newest(primaryCollectives(reportOf(ranks, stall.behind.front())));
  stall.where = fmt::format("{} {} issued {} collective{} ({}); {} {} at {}", plural(stall.behind),
                            stall.behind.size() == 1 ? "has" : "have", least, least == 1 ? "" : "s",
                            mine ? "the last: " + describeEntry(*mine) + ", " + mine->state
                                 : "none yet",
                            plural(ahead), ahead.size() == 1 ? "is" : "are",
                            aheadEntry ? describeEntry(*aheadEntry) + " (" + aheadEntry->state + ")"
                                       : fmt::format("{} collectives", most));
}

// 2. The same count everywhere: a newest collective still queued (never started) holds up the
// ranks running it; or every stuck rank is in the same one. False when that says nothing.
bool behindInSameCollective(Stall& stall, const std::map<int, RankProgress>& ranks) {
  std::vector<int> queued;
  std::vector<int> started;
  const progress::CollectiveEntry* entry = nullptr;
  for (int r : stall.stuck) {
    const auto* e = newest(primaryCollectives(reportOf(ranks, r)));
    if (e == nullptr) continue;
    entry = entry ? entry : e;
    (e->state == "queued" ? queued : started).push_back(r);
  }
  if (!queued.empty() && !started.empty()) {
    stall.behind = queued;
    const auto* e = newest(primaryCollectives(reportOf(ranks, queued.front())));
    stall.where = fmt::format("{} {} not started {} (queued), which {} {} running", plural(queued),
                              queued.size() == 1 ? "has" : "have", describeEntry(*e),
                              plural(started), started.size() == 1 ? "is" : "are");
    return true;
  }
  if (entry != nullptr && stall.moving.empty()) {
    stall.where = fmt::format("every stuck rank is in {} ({}): none stands out -- suspect the "
                              "network or the GPU driver; the native stacks show where each "
                              "one waits",
                              describeEntry(*entry), entry->state);
    return true;
  }
  return false;
}

// 3. Steps only (or ranks stuck while others move): the lowest step, else the stuck ranks.
void behindInSteps(Stall& stall, const std::map<int, RankProgress>& ranks) {
  std::optional<int64_t> lowest;
  std::optional<int64_t> highest;
  for (int r : stall.stuck) {
    if (auto s = reportOf(ranks, r).step) {
      lowest = lowest ? std::min(*lowest, *s) : *s;
      highest = highest ? std::max(*highest, *s) : *s;
    }
  }
  if (lowest && highest && *lowest < *highest) {
    for (int r : stall.stuck) {
      if (reportOf(ranks, r).step == lowest) stall.behind.push_back(r);
    }
    stall.where = fmt::format("{} {} at step {}, others at up to step {}", plural(stall.behind),
                              stall.behind.size() == 1 ? "is" : "are", *lowest, *highest);
    return;
  }
  if (!stall.moving.empty()) {
    stall.behind = stall.stuck;
    stall.where = fmt::format("{} made no progress while {} did", plural(stall.stuck),
                              plural(stall.moving));
    return;
  }
  stall.where = "no rank stands out (every rank reports the same place); the native stacks show "
                "where each one waits";
}

}  // namespace

void findBehind(Stall& stall, const std::map<int, RankProgress>& ranks) {
  uint64_t most = 0;
  bool anyCollectives = false;
  for (const auto& [rank, p] : ranks) {
    if (p.ended) continue;
    if (const auto* c = primaryCollectives(p.report)) {
      anyCollectives = true;
      most = std::max(most, c->issued);
    }
  }
  if (anyCollectives) {
    uint64_t least = most;
    for (int r : stall.stuck) {
      if (const auto* c = primaryCollectives(reportOf(ranks, r)))
        least = std::min(least, c->issued);
    }
    if (least < most) {
      behindInCollectiveCount(stall, ranks, least, most);
      return;
    }
    if (behindInSameCollective(stall, ranks)) return;
  }
  behindInSteps(stall, ranks);
}

std::string formatStallReport(const Stall& stall, const std::map<int, RankProgress>& ranks,
                              const StallReportContext& ctx) {
  std::string out;
  if (stall.kind == Stall::Kind::NoProgress) {
    out += fmt::format("launch: STALL: no rank has made progress for {:.1f} s ({} {:g})",
                       stall.quietSeconds, ctx.option, ctx.timeout);
  } else {
    out += fmt::format("launch: STALL: {} made no progress for {:.1f} s while {} did ({} {:g})",
                       plural(stall.stuck), stall.quietSeconds, plural(stall.moving), ctx.option,
                       ctx.timeout);
  }
  out += stall.behind.empty() ? "\n" : fmt::format("; behind: {}\n", plural(stall.behind));
  out += "  " + stall.where + "\n";
  // The behind ranks first, then the other stuck ones.
  std::vector<int> order = stall.behind;
  for (int r : stall.stuck) {
    if (std::find(order.begin(), order.end(), r) == order.end()) order.push_back(r);
  }
  for (int r : order) {
    const auto& p = ranks.at(r);
    auto node = ctx.nodes.find(r);
    std::string tail;
    if (const auto* c = primaryCollectives(p.report)) {
      size_t from = c->tail.size() > 4 ? c->tail.size() - 4 : 0;
      for (size_t i = from; i < c->tail.size(); ++i) {
        const auto& e = c->tail[i];
        if (!tail.empty()) tail += "; ";
        tail += fmt::format("{} {}", describeEntry(e), e.state);
        if (!e.open()) tail += fmt::format(" {:.1f} ms", e.ms);
      }
    }
    out += fmt::format("  rank {} (pid {}{}{}): last collectives: {}\n", r, p.report.pid,
                       node != ctx.nodes.end() ? ", node " + node->second : "",
                       p.report.step ? fmt::format(", step {}", *p.report.step) : "",
                       tail.empty() ? "none recorded" : tail);
  }
  if (!stall.silent.empty()) {
    out += fmt::format("  {} publish no progress (not using dtrain's runtime?) and are not "
                       "judged\n",
                       plural(stall.silent));
  }
  for (int r : order) {
    auto s = ctx.stacks.find(r);
    if (s == ctx.stacks.end()) continue;
    out += fmt::format("  native stack of rank {}:\n", r);
    size_t at = 0;
    const std::string& text = s->second;
    while (at < text.size()) {
      size_t nl = text.find('\n', at);
      if (nl == std::string::npos) nl = text.size();
      out += "    " + text.substr(at, nl - at) + "\n";
      at = nl + 1;
    }
  }
  out += ctx.stopping
             ? "  launch stops the job (--stall-action stop) and exits 124\n"
             : "  HINT: the job keeps running (--stall-action report); --stall-action stop ends "
               "it with exit code 124\n";
  return out;
}

}  // namespace dtrain::launcher::monitor
