#pragma once
// How much freed memory the host memory cache may keep by default (dtrain/torch/host_memory.h):
// a quarter of the memory this process may use, shared among the ranks of its node. Apart from
// the cache so that tests can hand it a cgroup tree of their own.

#include <cstddef>
#include <string>

namespace dtrain::host_memory {

// The memory this process may use: `physicalBytes`, or less where a cgroup v2 `memory.max` on
// the way from the process's cgroup up to the root says less. `procSelfCgroup` is the text of
// /proc/self/cgroup ("0::/a/b" for cgroup v2); `cgroupRoot` where the hierarchy is mounted
// (/sys/fs/cgroup). A missing file or "max" is no limit.
size_t memoryLimit(const std::string& procSelfCgroup, const std::string& cgroupRoot,
                   size_t physicalBytes);

// A quarter of `limitBytes`, divided among `localRanks` (LOCAL_WORLD_SIZE; 1 when unknown).
size_t defaultMaxCachedBytes(size_t limitBytes, int localRanks);

// The two above for this process: /proc/self/cgroup, /sys/fs/cgroup, the machine's memory and
// the LOCAL_WORLD_SIZE of its environment.
size_t defaultMaxCachedBytes();

}  // namespace dtrain::host_memory
