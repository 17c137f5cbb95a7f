#pragma once
// A stuck worker's native stack, from Debian's elfutils (`eu-stack -p PID`), under a deadline: a
// process in uninterruptible sleep can make any ptrace-based tool wait, and launch never does.

#include <sys/types.h>

#include <chrono>
#include <string>

namespace dtrain::launcher::monitor {

struct NativeStackOptions {
  std::string program = "eu-stack";
  std::chrono::milliseconds timeout{10000};
  int framesPerThread = 24;
  size_t maxLines = 120;  // per process; the rest is counted, not printed
};

// Every thread's stack of `pid`, or one line saying why there is none (eu-stack missing, ptrace
// refused, timed out), each with a HINT where the user can do something.
std::string nativeStack(pid_t pid, const NativeStackOptions& options = {});

}  // namespace dtrain::launcher::monitor
