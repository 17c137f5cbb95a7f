#pragma once
// Per-worker and per-node resource samples from /proc and the memory cgroup: each worker's CPU
// use, resident memory and its peak, threads and storage I/O -- over the worker and every process
// it started (a Python trainer's DataLoader workers hold much of its memory) -- and the node's
// load, free memory and cgroup usage against its limit.

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/monitor/cgroup_memory.h"
#include "launcher/monitor/proc_files.h"

namespace dtrain::launcher::monitor {

// Note [Sampling cost]
// ~~~~~~~~~~~~~~~~~~~~
// launch must not cost the job what it measures: at a 1 s interval with 4 workers it stays well
// under 1 % of a core (tests/launcher/monitor/launcher_monitor_test.cpp
// measures and prints it). Each
// process costs three small reads (stat, status, io) with plain open/read/close into one reused
// buffer; no streams, no allocation once warm. Descendants of the workers are found from the
// kernel's children lists: /proc/<pid>/task/<tid>/children of every thread of every process in
// the tree, walked down from each worker at every sample -- a read per thread in the tree,
// nothing else on the machine, so a child started since the last sample counts at once. Where
// the kernel lacks them (CONFIG_PROC_CHILDREN off) a scan of /proc (one stat read per process on
// the machine) takes their place, and being far dearer it runs only every `discoverEvery` samples
// and when the set of workers changes; between scans the known descendants are sampled, and one
// whose start time changed (its pid was reused) is dropped. At 256 agents on one machine, which
// the scale benchmark simulates, those scans were nearly all the idle agents' CPU. A descendant
// that lives less than a sample interval (a scan interval without children lists) is missed --
// only short helpers (a shell, a compiler) are. The node's figures (node_sampler.h) add three
// reads (/proc/net/dev, /proc/diskstats, /proc/stat) and a stat and statvfs per watched
// directory, into buffers kept the same way: tens of microseconds a sample.

struct WorkerProcess {
  int rank = 0;
  int localRank = 0;
  pid_t pid = 0;
};

struct RankSample {
  int rank = 0;
  int localRank = 0;
  pid_t pid = 0;
  double cpuPercent = -1;    // of one core, summed over the tree; -1 until a second sample
  int64_t rssBytes = 0;      // summed over the tree (shared pages counted per process, as ps does)
  int64_t peakRssBytes = 0;  // the worker's own peak (VmHWM) or the largest tree sum seen
  int64_t threads = 0;
  int64_t processes = 0;   // the worker and its live descendants
  int64_t readBytes = -1;  // storage bytes, cumulative, including descendants that ended
  int64_t writeBytes = -1;
  std::vector<pid_t> pids;  // the worker first
};

struct NodeSample {
  std::optional<double> load1;
  MemInfo mem;
  std::optional<CgroupMemory> cgroup;

  // The fraction of memory in use that matters for the OOM killer: the larger of the cgroup's
  // working set against its limit and the machine's (total - available) / total. nullopt when
  // neither is known.
  std::optional<double> memUsedFraction() const;
  // Bytes left before that fraction reaches 1.
  std::optional<int64_t> memHeadroomBytes() const;
  // "cgroup /sys/fs/cgroup/job: 230 MiB of 256 MiB" or "machine: 20.1 GiB of 23.5 GiB".
  std::string describeMemory() const;
};

class ProcessSampler {
 public:
  // `discoverEvery`: samples between scans of /proc where the kernel has no children lists.
  // `childrenLists` false: scan even where it has them (tests compare the two).
  explicit ProcessSampler(CgroupLocation cgroup, int discoverEvery = 10, bool childrenLists = true);

  // The workers to sample from now on (an attempt started or a worker ended).
  void setWorkers(std::vector<WorkerProcess> workers);
  // `now`: steady-clock seconds.
  std::vector<RankSample> sampleWorkers(double now);
  NodeSample sampleNode();
  // Only the cgroup / machine memory: cheap enough for every tick.
  NodeSample sampleMemory();

 private:
  struct PidState {
    uint64_t startTicks = 0;
    uint64_t cpuTicks = 0;
    double time = 0;
    int64_t readBytes = -1;
    int64_t writeBytes = -1;
  };
  struct RankState {
    WorkerProcess worker;
    std::vector<pid_t> descendants;
    std::map<pid_t, PidState> seen;
    int64_t departedRead = 0;  // I/O of processes of this tree that ended
    int64_t departedWrite = 0;
    int64_t peakTree = 0;
  };
  void discover();
  // Every descendant of `root` from the kernel's children lists (see Note [Sampling cost]).
  void walkChildren(pid_t root, std::vector<pid_t>* out);
  // Samples one process into `out`; false when it is gone or its pid now names another process.
  bool sampleProcess(pid_t pid, RankState& rank, double now, RankSample& out, bool isWorker);

  FileReader reader_;
  CgroupMemoryReader cgroup_;
  const int discoverEvery_;
  const bool childrenLists_;  // /proc/<pid>/task/<tid>/children exists (CONFIG_PROC_CHILDREN)
  int samplesUntilDiscover_ = 0;
  const double ticksPerSecond_;
  const int64_t pageBytes_;
  std::vector<RankState> ranks_;
  std::string path_;                    // reused path buffer
  std::vector<pid_t> frontier_;         // walkChildren's, reused
  alignas(8) char direntBuffer_[4096];  // getdents64's, reused
};

// All descendants of `root` in a parent map (ppid -> children), breadth first.
std::vector<pid_t> descendantsOf(pid_t root, const std::multimap<pid_t, pid_t>& children);

// "1.5 GiB", "230 MiB", "12 KiB", "512 B".
std::string formatBytes(int64_t bytes);

}  // namespace dtrain::launcher::monitor
