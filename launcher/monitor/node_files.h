#pragma once
// The kernel files behind a node's network, disk and scheduler figures: /proc/net/dev,
// /proc/diskstats, /proc/stat and /proc/self/mountinfo. Pure parsers of the file's text, tested
// by tables on recorded files; the ones read at every sample fill vectors the caller keeps, so
// sampling allocates nothing once warm (Note [Sampling cost] in monitor/process_sampler.h).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::launcher::monitor {

// One interface's line of /proc/net/dev: cumulative counters since the interface came up.
struct NetDevCounters {
  char name[16] = {};  // IFNAMSIZ, NUL-terminated
  uint64_t rxBytes = 0;
  uint64_t rxErrors = 0;
  uint64_t rxDrops = 0;
  uint64_t txBytes = 0;
  uint64_t txErrors = 0;
  uint64_t txDrops = 0;

  std::string_view interface() const { return name; }
};
// Every interface line into `out` (cleared first, its capacity kept). Lines that are not an
// interface's (the two header lines, a malformed one) are skipped.
void parseNetDev(std::string_view text, std::vector<NetDevCounters>& out);

// One block device's line of /proc/diskstats: sectors are 512 bytes whatever the device's own.
struct DiskCounters {
  unsigned major = 0;
  unsigned minor = 0;
  uint64_t readBytes = 0;
  uint64_t writtenBytes = 0;
};
// The line of device major:minor, else the one named `name` ("sda1"; empty: not looked for);
// nullopt when neither is there (a filesystem with no block device of its own: tmpfs, overlay,
// NFS).
std::optional<DiskCounters> findDiskStats(std::string_view text, unsigned major, unsigned minor,
                                          std::string_view name = {});

// /proc/stat: context switches since boot (the `ctxt` line); nullopt when absent.
std::optional<uint64_t> parseContextSwitches(std::string_view text);

// The mount that holds a path, from /proc/self/mountinfo.
struct MountPoint {
  std::string mountPoint;  // "/", "/scratch"
  std::string source;      // "/dev/nvme0n1p2", "tmpfs"
  std::string fsType;      // "ext4"
  unsigned major = 0;
  unsigned minor = 0;
};
// The mount of device major:minor (the directory's st_dev) whose mount point is the longest
// prefix of `path` (absolute, without symlinks): bind mounts of one device are told apart by
// where they are mounted. nullopt when no line matches.
std::optional<MountPoint> findMount(std::string_view mountinfo, std::string_view path,
                                    unsigned major, unsigned minor);

}  // namespace dtrain::launcher::monitor
