#pragma once
// Reading and parsing the small kernel files launch samples: /proc/<pid>/{stat,status,io},
// /proc/loadavg, /proc/meminfo. The parsers are pure functions of the file's text (tested by
// tables); FileReader reads with plain open/read/close into one buffer it keeps, so sampling
// allocates nothing once warm (see Note [Sampling cost] in monitor/process_sampler.h).

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::launcher::monitor {

class FileReader {
 public:
  explicit FileReader(size_t capacity = 64 * 1024);
  // The file's content (at most the capacity), valid until the next read; nullopt when it cannot
  // be opened or read (a process that has ended: ENOENT or ESRCH).
  std::optional<std::string_view> read(const char* path);
  std::optional<std::string_view> read(const std::string& path) { return read(path.c_str()); }

 private:
  std::vector<char> buffer_;
};

// /proc/<pid>/stat: the fields launch uses.
struct ProcStat {
  char state = 0;
  pid_t ppid = 0;
  pid_t pgrp = 0;
  uint64_t cpuTicks = 0;  // utime + stime, in clock ticks
  int64_t threads = 0;
  uint64_t startTicks = 0;  // since boot
  int64_t rssPages = 0;
};
// nullopt for text that is not a stat line. The command name may hold spaces and parentheses:
// fields are counted from the last ')'.
std::optional<ProcStat> parseProcStat(std::string_view text);

// /proc/<pid>/status: VmRSS, VmHWM (peak RSS) and Threads; -1 where absent (kernel threads,
// zombies).
struct ProcStatus {
  int64_t rssBytes = -1;
  int64_t peakRssBytes = -1;
  int64_t threads = -1;
};
ProcStatus parseProcStatus(std::string_view text);

// /proc/<pid>/io: bytes the process caused to be read from / written to storage; -1 where
// absent (the file needs ptrace access to the process).
struct ProcIo {
  int64_t readBytes = -1;
  int64_t writeBytes = -1;
};
ProcIo parseProcIo(std::string_view text);

// /proc/meminfo: MemTotal, MemAvailable, SwapTotal and SwapFree in bytes; -1 where absent.
struct MemInfo {
  int64_t totalBytes = -1;
  int64_t availableBytes = -1;
  int64_t swapTotalBytes = -1;
  int64_t swapFreeBytes = -1;
};
MemInfo parseMemInfo(std::string_view text);

// /proc/loadavg: the 1-minute load average; nullopt when malformed.
std::optional<double> parseLoadAvg(std::string_view text);

// "key value" lines (memory.stat, /proc/<pid>/io): the integer after `key`, or -1. `key` must
// start a line and be followed by `separator` (' ' or ':').
int64_t findKeyedValue(std::string_view text, std::string_view key, char separator);

// A field of /proc/<pid>/mountinfo as the path it names: mountinfo writes a space, tab, newline
// or backslash in a path as \ooo (octal).
std::string unescapeMountField(std::string_view field);

}  // namespace dtrain::launcher::monitor
