#pragma once
// Evidence that a worker killed by SIGKILL was the OOM killer's victim. The kernel log says so
// outright ("Killed process 1234 (train)", "oom-kill:...,pid=1234,...") when we may read it; the
// memory cgroup's oom_kill counter rising during the attempt only says "possibly". Without either
// the report says nothing about memory: a SIGKILL has many senders.

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace dtrain::launcher {

// The kernel log line naming `pid` as an OOM kill, or empty. `kernelLog` holds one message per
// line (as readKernelLog() returns it, or dmesg prints it).
std::string findOomKillLine(const std::string& kernelLog, pid_t pid);

// The oom_kill counter in the text of cgroup v2 memory.events or v1 memory.oom_control; -1 when
// absent.
int64_t parseOomKillCount(const std::string& eventsText);

// The file holding the oom_kill counter of the memory cgroup named in /proc/self/cgroup's text
// (v2 "0::/path" or v1 "N:memory:/path"), under `cgroupRoot` (/sys/fs/cgroup). Empty when none.
std::string oomCounterPath(const std::string& procSelfCgroup, const std::string& cgroupRoot);

// The note for the report ("likely killed by the OOM killer (kernel log: ...)", "possibly ...")
// or empty. `countBefore`/`countAfter` -1 when unknown.
std::string oomNote(pid_t pid, const std::string& kernelLog, int64_t countBefore,
                    int64_t countAfter);

// I/O: the kernel log via /dev/kmsg (empty when not readable), and this process's cgroup counter
// (-1 when unavailable).
std::string readKernelLog();
int64_t readOomKillCount();

}  // namespace dtrain::launcher
