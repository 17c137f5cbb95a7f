#pragma once
// The memory cgroup launch (and so every worker it starts) runs in: where it is, and how much of
// its limit is in use. cgroup v2 (memory.current / memory.max, the smallest limit on the way up
// to the root applies) and v1 (memory.usage_in_bytes, memory.stat's hierarchical_memory_limit).
//
// "In use" is the working set as the kubelet and docker count it: usage minus inactive file
// pages, which the kernel reclaims before it invokes the OOM killer. A cgroup full of page cache
// from reading a dataset is not about to OOM; one full of anonymous memory is.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "launcher/monitor/proc_files.h"

namespace dtrain::launcher::monitor {

struct CgroupLocation {
  int version = 0;       // 0: no memory cgroup found; 1 or 2
  std::string dir;       // the cgroup's directory, e.g. /sys/fs/cgroup/memory/job
  std::string mountDir;  // the hierarchy's mount point (v2: where the walk up stops)
};

// Pure: from the text of /proc/self/cgroup and /proc/self/mountinfo. v1's memory controller wins
// when both are mounted (a hybrid system limits memory through v1).
CgroupLocation locateMemoryCgroup(std::string_view procSelfCgroup, std::string_view mountinfo);

struct CgroupMemory {
  int64_t usageBytes = -1;        // the cgroup's charge, page cache included
  int64_t limitBytes = -1;        // -1: no limit on the way up to the root
  int64_t inactiveFileBytes = 0;  // reclaimable page cache
  std::string limitDir;           // the cgroup whose limit applies (v2: possibly an ancestor)

  int64_t workingSetBytes() const {
    return usageBytes < 0 ? -1 : std::max<int64_t>(0, usageBytes - inactiveFileBytes);
  }
};

// A limit this large means "none" (v1 writes 2^63 rounded down to a page).
constexpr int64_t kNoCgroupLimit = int64_t{1} << 60;

// Reads the current figures of `location`. Remembers which cgroup's limit applies and looks again
// only every `rescanEvery` reads (limits rarely change; the walk up costs a read per level).
class CgroupMemoryReader {
 public:
  explicit CgroupMemoryReader(CgroupLocation location, int rescanEvery = 60);
  // nullopt when the cgroup cannot be read (none found, or it went away).
  std::optional<CgroupMemory> read(FileReader& reader);
  const CgroupLocation& location() const { return location_; }

 private:
  void findLimit(FileReader& reader);

  CgroupLocation location_;
  int rescanEvery_;
  int readsUntilRescan_ = 0;
  std::string limitDir_;  // v2: the directory with the smallest memory.max; empty: none
  int64_t limitBytes_ = -1;
};

// The cgroup of this process, from /proc/self.
CgroupLocation locateOwnMemoryCgroup();

}  // namespace dtrain::launcher::monitor
