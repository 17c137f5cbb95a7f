#include "failure_report.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace dtrain::comm {

namespace {

std::string oneLine(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  if (text.size() > 400) text = text.substr(0, 397) + "...";
  return text;
}

std::string encode(const RankReport& r) {
  return fmt::format("{}\n{}\n{}", r.seq, oneLine(r.collective), oneLine(r.error));
}

bool decode(const std::string& text, RankReport& r) {
  size_t a = text.find('\n');
  if (a == std::string::npos) return false;
  size_t b = text.find('\n', a + 1);
  if (b == std::string::npos) return false;
  try {
    r.seq = std::stoull(text.substr(0, a));
  } catch (...) {
    return false;
  }
  r.collective = text.substr(a + 1, b - a - 1);
  r.error = text.substr(b + 1);
  r.reported = true;
  return true;
}

}  // namespace

Millis reportGrace(Millis collectiveTimeout) {
  return std::clamp(collectiveTimeout / 3, Millis(200), Millis(1000));
}

Millis defaultWaitBudget(Millis collectiveTimeout) {
  return collectiveTimeout + reportGrace(collectiveTimeout) + Millis(1000);
}

std::vector<RankReport> exchangeReports(store::Store& store, const std::string& prefix, int size,
                                        const RankReport& mine, Millis grace,
                                        const std::function<bool()>& stop) {
  std::vector<RankReport> reports(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) reports[r].rank = r;
  reports[mine.rank] = mine;
  reports[mine.rank].reported = true;
  auto key = [&](int r) { return fmt::format("{}/{}", prefix, r); };
  // The store's host may be gone as well (a rank that hosted it, a lost node): no call may
  // outlast the grace by more than a second (Note [Store calls with a deadline]).
  store::ScopedStoreDeadline bounded(std::chrono::steady_clock::now() + grace + Millis(1000));
  try {
    store.setString(key(mine.rank), encode(mine));
    // The others poll with check(), which does not wait for a key, and this process may end
    // soon after: the report must be applied, not merely sent (TcpStore pipelines sets).
    store.flush();
  } catch (const std::exception&) {
    return reports;  // the store is gone too: report what we know
  }
  const auto deadline = std::chrono::steady_clock::now() + grace;
  std::vector<int> missing;
  for (int r = 0; r < size; ++r) {
    if (r != mine.rank) missing.push_back(r);
  }
  // Poll rather than wait(keys): one absent rank must not hide the others that did answer.
  while (!missing.empty()) {
    std::vector<int> still;
    for (int r : missing) {
      try {
        if (store.check({key(r)})) {
          decode(store.getString(key(r)), reports[r]);
          continue;
        }
      } catch (const std::exception&) {
        return reports;
      }
      still.push_back(r);
    }
    missing.swap(still);
    if (missing.empty() || std::chrono::steady_clock::now() >= deadline) break;
    if (stop && stop()) break;
    std::this_thread::sleep_for(Millis(20));
  }
  return reports;
}

std::string summarizeReports(const std::vector<RankReport>& reports, const RankReport& mine,
                             Millis grace) {
  std::vector<std::string> parts;
  std::vector<int> silent;
  std::vector<int> same;
  for (const auto& r : reports) {
    if (r.rank == mine.rank) continue;
    if (!r.reported) {
      silent.push_back(r.rank);
      continue;
    }
    if (r.seq < mine.seq) {
      parts.push_back(fmt::format("rank {} is behind at seq {} ({}; this rank is at seq {})",
                                  r.rank, r.seq, r.collective, mine.seq));
    } else if (r.seq > mine.seq) {
      parts.push_back(fmt::format("rank {} is ahead at seq {} ({}; this rank is at seq {})", r.rank,
                                  r.seq, r.collective, mine.seq));
    } else if (r.collective != mine.collective) {
      parts.push_back(fmt::format("rank {} calls {} at seq {} where this rank calls {}: the "
                                  "ranks disagree on the collective",
                                  r.rank, r.collective, r.seq, mine.collective));
    } else {
      same.push_back(r.rank);
    }
  }
  if (!silent.empty()) {
    parts.push_back(fmt::format("rank{} {} did not report within {} ms (frozen, dead, or not "
                                "inside a collective)",
                                silent.size() > 1 ? "s" : "", fmt::join(silent, ", "),
                                grace.count()));
  }
  if (!same.empty() && parts.empty()) {
    parts.push_back(fmt::format("rank{} {} reached the same collective", same.size() > 1 ? "s" : "",
                                fmt::join(same, ", ")));
  }
  // The first error another rank saw often names the root cause (a peer that died).
  for (const auto& r : reports) {
    if (r.rank != mine.rank && r.reported && !r.error.empty()) {
      parts.push_back(fmt::format("rank {} reported: {}", r.rank, r.error));
      break;
    }
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

}  // namespace dtrain::comm
