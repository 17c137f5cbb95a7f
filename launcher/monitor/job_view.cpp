#include "launcher/monitor/job_view.h"

#include <algorithm>

#include "launcher/monitor/watches.h"

namespace dtrain::launcher::monitor {

void JobView::setJob(int attempt, int worldSize, int maxRestarts) {
  std::lock_guard<std::mutex> lock(mutex_);
  job_.attempt = attempt;
  job_.restarts = attempt;
  job_.worldSize = worldSize;
  job_.maxRestarts = maxRestarts;
}

void JobView::setStalled(bool stalled, std::vector<int> ranks) {
  std::lock_guard<std::mutex> lock(mutex_);
  job_.stalled = stalled;
  job_.stalledRanks = std::move(ranks);
}

void JobView::setHeartbeatTimeout(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  job_.heartbeatTimeout = seconds;
}

void JobView::ingest(const std::string& node, std::vector<Record> records, double now) {
  std::lock_guard<std::mutex> lock(mutex_);
  Node& n = nodes_[node];
  n.records = std::move(records);
  n.heardAt = now;
}

void JobView::setTrainerRecords(std::vector<Record> records) {
  std::lock_guard<std::mutex> lock(mutex_);
  trainer_ = std::move(records);
}

void JobView::newAttempt(int attempt) {
  std::lock_guard<std::mutex> lock(mutex_);
  job_.attempt = attempt;
  job_.restarts = attempt;
  job_.stalled = false;
  job_.stalledRanks.clear();
  trainer_.clear();
  for (auto& [name, n] : nodes_) {
    n.records.erase(std::remove_if(n.records.begin(), n.records.end(),
                                   [](const Record& r) { return r.rank.has_value(); }),
                    n.records.end());
  }
}

std::vector<Record> JobView::latest() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Record> out;
  for (const auto& [name, n] : nodes_) out.insert(out.end(), n.records.begin(), n.records.end());
  out.insert(out.end(), trainer_.begin(), trainer_.end());
  return out;
}

JobState JobView::job(double now) const {
  std::lock_guard<std::mutex> lock(mutex_);
  JobState j = job_;
  for (const auto& [name, n] : nodes_) j.heartbeatAge[name] = std::max(0.0, now - n.heardAt);
  return j;
}

std::string JobView::prometheus(double now) const { return exposition(latest(), job(now)); }

std::string JobView::statusLine(double now) const { return formatStatusLine(latest(), job(now)); }

}  // namespace dtrain::launcher::monitor
