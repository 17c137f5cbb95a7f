#include "launcher/monitor/native_stack.h"

#include <fmt/format.h>

#include "launcher/monitor/command.h"

namespace dtrain::launcher::monitor {

namespace {

// At most `maxLines` lines of `text`, and a count of the rest.
std::string firstLines(const std::string& text, size_t maxLines) {
  size_t at = 0;
  size_t lines = 0;
  while (at < text.size() && lines < maxLines) {
    size_t nl = text.find('\n', at);
    at = nl == std::string::npos ? text.size() : nl + 1;
    ++lines;
  }
  std::string out = text.substr(0, at);
  size_t rest = 0;
  for (size_t i = at; i < text.size(); ++i) rest += text[i] == '\n';
  if (at < text.size() && text.back() != '\n') ++rest;
  if (rest > 0) out += fmt::format("... ({} more lines)\n", rest);
  return out;
}

}  // namespace

std::string nativeStack(pid_t pid, const NativeStackOptions& options) {
  if (!commandExists(options.program)) {
    return fmt::format("(no native stack: {} is not installed; HINT: apt-get install elfutils)",
                       options.program);
  }
  CommandResult r = runCommand(
      {options.program, "-p", std::to_string(pid), "-n", std::to_string(options.framesPerThread)},
      options.timeout, 1 << 20);
  if (r.timedOut) {
    return fmt::format("(no native stack: {} -p {} did not finish within {} ms; the process may "
                       "be in uninterruptible sleep (state D))",
                       options.program, pid, options.timeout.count());
  }
  // Exit 1: some frames could not be unwound; what was shown is still worth printing.
  if (!r.started || (r.exitCode != 0 && r.exitCode != 1) || r.out.empty()) {
    std::string why = r.err.empty() ? r.error : r.err;
    while (!why.empty() && why.back() == '\n') why.pop_back();
    std::string hint;
    if (why.find("ptrace") != std::string::npos || why.find("ermission") != std::string::npos) {
      hint = "; HINT: attaching needs ptrace rights over the worker (root, or "
             "/proc/sys/kernel/yama/ptrace_scope 0)";
    }
    return fmt::format("(no native stack: {} -p {} failed: {}{})", options.program, pid,
                       why.empty() ? fmt::format("exit {}", r.exitCode) : why, hint);
  }
  return firstLines(r.out, options.maxLines);
}

}  // namespace dtrain::launcher::monitor
