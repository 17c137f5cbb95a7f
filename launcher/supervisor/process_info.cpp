#include "launcher/supervisor/process_info.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>

#include "launcher/supervisor/failure_report.h"

namespace dtrain::launcher {

namespace {

constexpr size_t kCommandChars = 300;

// At most `max` bytes of a /proc file; empty when it cannot be read.
std::string readProcFile(const std::string& path, size_t max) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string text(max, '\0');
  size_t got = 0;
  while (got < max) {
    ssize_t n = ::read(fd, text.data() + got, max - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  text.resize(got);
  return text;
}

std::string procPath(pid_t pid, const char* file) {
  return "/proc/" + std::to_string(pid) + "/" + file;
}

}  // namespace

char processState(pid_t pid) {
  std::string text = readProcFile(procPath(pid, "stat"), 1024);
  size_t paren = text.rfind(')');
  if (paren == std::string::npos || paren + 2 >= text.size()) return 0;
  return text[paren + 2];
}

std::optional<ProcessInfo> inspectProcess(pid_t pid) {
  ProcessInfo info;
  info.pid = pid;
  info.stateLetter = processState(pid);
  if (info.stateLetter == 0) return std::nullopt;
  const std::string status = readProcFile(procPath(pid, "status"), 4096);
  if (size_t at = status.find("\nState:"); at != std::string::npos) {
    size_t begin = status.find_first_not_of(" \t", at + 7);
    size_t end = status.find('\n', at + 1);
    if (begin != std::string::npos && begin < end) info.state = status.substr(begin, end - begin);
  }
  if (info.state.empty()) info.state = std::string(1, info.stateLetter);
  info.waitingIn = readProcFile(procPath(pid, "wchan"), 128);
  if (info.waitingIn == "0") info.waitingIn.clear();
  std::string argv = readProcFile(procPath(pid, "cmdline"), kCommandChars + 1);
  while (!argv.empty() && argv.back() == '\0') argv.pop_back();
  for (char& c : argv) {
    if (c == '\0') c = ' ';
  }
  info.command = printable(argv, kCommandChars);
  if (info.command.empty()) {  // a kernel thread, or a zombie: its name at least
    std::string name = readProcFile(procPath(pid, "comm"), 64);
    if (!name.empty() && name.back() == '\n') name.pop_back();
    info.command = "[" + printable(name, 64) + "]";
  }
  return info;
}

std::vector<pid_t> childProcesses(pid_t pid) {
  std::vector<pid_t> out;
  const std::string text = readProcFile(
      "/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children", 65536);
  const char* p = text.c_str();
  while (*p) {
    char* end = nullptr;
    long v = std::strtol(p, &end, 10);
    if (end == p) break;
    out.push_back(static_cast<pid_t>(v));
    p = end;
    while (*p == ' ') ++p;
  }
  return out;
}

}  // namespace dtrain::launcher
