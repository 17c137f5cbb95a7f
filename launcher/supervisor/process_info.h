#pragma once
// What /proc says about a process, for reports: its state, where in the kernel it waits, and its
// command line. Plain read(2) throughout: a process may end while it is being read, which must
// give "gone", never an exception out of a teardown.

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace dtrain::launcher {

struct ProcessInfo {
  pid_t pid = -1;
  char stateLetter = 0;   // 'R', 'S', 'D', 'T', 't', 'Z', ...
  std::string state;      // /proc/PID/status's, e.g. "D (disk sleep)"
  std::string waitingIn;  // /proc/PID/wchan: the kernel function it sleeps in; may be empty
  std::string command;    // its argv joined by spaces, printable, at most ~300 characters
};

// Empty when the process is gone (or /proc cannot be read).
std::optional<ProcessInfo> inspectProcess(pid_t pid);

// The state letter of /proc/PID/stat, or 0 when the process is gone.
char processState(pid_t pid);

// The children of a single-threaded process (/proc/PID/task/PID/children); empty when it is gone.
std::vector<pid_t> childProcesses(pid_t pid);

}  // namespace dtrain::launcher
