#pragma once
// What launch says on its own while a job runs, decided by pure functions of the samples:
//   - MemoryWatch: a node's memory passes 90 % in use (its memory cgroup against the limit, or
//     the whole machine) -- a warning naming the node, the largest ranks and the fastest-growing
//     ones with their growth over the last minute, before the OOM killer acts;
//   - GpuIdleWatch: every GPU the job uses on a node stays under 5 % utilisation for 5 minutes
//     while workers run -- one warning (the job pays for idle GPUs);
//   - formatStatusLine: the --status-interval line.

#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/monitor/gpu_sampler.h"
#include "launcher/monitor/process_sampler.h"
#include "launcher/monitor/records.h"

namespace dtrain::launcher::monitor {

struct MemoryWatchOptions {
  double warnFraction = 0.90;
  double rearmFraction = 0.85;  // a second warning only after use fell below this
  double windowSeconds = 60;    // growth is measured over this window
};

class MemoryWatch {
 public:
  explicit MemoryWatch(MemoryWatchOptions options = {}) : options_(options) {}

  // Each rank's resident memory at `now` (steady seconds): the history growth is measured on.
  void addRanks(double now, const std::vector<RankSample>& ranks);
  // A new attempt: the ranks' history starts over (new processes).
  void resetRanks() { history_.clear(); }
  // The warning to print now, if any.
  std::optional<std::string> check(double now, const NodeSample& node, const std::string& nodeName);

  struct Growth {
    int rank = 0;
    int64_t rssBytes = 0;
    int64_t grownBytes = 0;  // over `seconds`
    double seconds = 0;
  };
  // Per rank: its latest RSS and its growth since the oldest sample in the window.
  std::vector<Growth> growth(double now) const;

 private:
  struct Point {
    double time = 0;
    std::map<int, int64_t> rss;
  };
  MemoryWatchOptions options_;
  std::deque<Point> history_;
  bool warned_ = false;
};

struct GpuIdleOptions {
  double utilPercent = 5;
  double seconds = 300;
};

class GpuIdleWatch {
 public:
  explicit GpuIdleWatch(GpuIdleOptions options = {}) : options_(options) {}
  // `gpus`: the GPUs the job uses on this node (launch passes those a worker runs on, or all of
  // them when it cannot tell). Returns the warning once per idle spell.
  std::optional<std::string> observe(double now, const std::vector<GpuSample>& gpus,
                                     bool workersRunning, const std::string& nodeName);
  void reset() { idleSince_.reset(); }

 private:
  GpuIdleOptions options_;
  std::optional<double> idleSince_;
  bool warned_ = false;
};

// "launch: status: attempt 0, ranks alive 4/4; CPU % per rank min/median/max 12/50/98; GPU %
// 0/3/10; memory: node h 41 % in use, 1.2 GiB headroom" from the latest records of every node.
std::string formatStatusLine(const std::vector<Record>& latest, const JobState& job);

}  // namespace dtrain::launcher::monitor
