#pragma once
// Runs a helper program (nvidia-smi, eu-stack) with a deadline and captures what it prints. A
// helper that hangs -- nvidia-smi on a wedged driver, eu-stack on a process in state D -- is
// killed at the deadline with its whole process group; launch never waits longer.

#include <chrono>
#include <string>
#include <vector>

namespace dtrain::launcher::monitor {

struct CommandResult {
  bool started = false;   // false: not found or not executable (`error` says why)
  bool timedOut = false;  // killed at the deadline
  int exitCode = -1;      // when it exited by itself
  std::string out;        // stdout, at most maxOutput bytes
  std::string err;        // stderr, at most maxOutput bytes
  std::string error;

  bool ok() const { return started && !timedOut && exitCode == 0; }
};

// `argv[0]` is looked up in PATH. The child gets default signal dispositions and an empty signal
// mask (launch blocks the signals it forwards), stdin from /dev/null, and its own process group.
CommandResult runCommand(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                         size_t maxOutput = 1 << 20);

// Whether `name` is an executable file in PATH (or a path to one).
bool commandExists(const std::string& name);

}  // namespace dtrain::launcher::monitor
