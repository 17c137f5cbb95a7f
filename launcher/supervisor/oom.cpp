#include "launcher/supervisor/oom.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace dtrain::launcher {

namespace {

std::string readSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool containsPidField(const std::string& line, const std::string& needle, const std::string& pid,
                      const char* terminators) {
  for (size_t at = line.find(needle); at != std::string::npos; at = line.find(needle, at + 1)) {
    size_t end = at + needle.size() + pid.size();
    if (line.compare(at + needle.size(), pid.size(), pid) != 0) continue;
    if (end == line.size() || std::string(terminators).find(line[end]) != std::string::npos) {
      return true;
    }
  }
  return false;
}

}  // namespace

std::string findOomKillLine(const std::string& kernelLog, pid_t pid) {
  const std::string p = std::to_string(pid);
  size_t start = 0;
  while (start < kernelLog.size()) {
    size_t nl = kernelLog.find('\n', start);
    std::string line = kernelLog.substr(start, nl == std::string::npos ? nl : nl - start);
    // "Out of memory: Killed process 1234 (x) ..." / "Memory cgroup out of memory: Killed ...",
    // and the one-line summary "oom-kill:constraint=...,task=x,pid=1234,uid=0".
    if (containsPidField(line, "Killed process ", p, " ") ||
        (line.find("oom-kill:") != std::string::npos && containsPidField(line, ",pid=", p, ","))) {
      return line;
    }
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  return "";
}

int64_t parseOomKillCount(const std::string& eventsText) {
  std::istringstream in(eventsText);
  std::string key;
  long long value = 0;
  while (in >> key >> value) {
    if (key == "oom_kill") return value;
  }
  return -1;
}

std::string oomCounterPath(const std::string& procSelfCgroup, const std::string& cgroupRoot) {
  std::istringstream in(procSelfCgroup);
  std::string line;
  std::string v2;
  while (std::getline(in, line)) {
    size_t c1 = line.find(':');
    size_t c2 = c1 == std::string::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string::npos) continue;
    std::string controllers = line.substr(c1 + 1, c2 - c1 - 1);
    std::string path = line.substr(c2 + 1);
    if (path == "/") path.clear();
    if (line.compare(0, c1, "0") == 0 && controllers.empty()) {
      v2 = cgroupRoot + path + "/memory.events";
      continue;
    }
    std::istringstream list(controllers);
    std::string controller;
    while (std::getline(list, controller, ',')) {
      if (controller == "memory") return cgroupRoot + "/memory" + path + "/memory.oom_control";
    }
  }
  return v2;
}

std::string oomNote(pid_t pid, const std::string& kernelLog, int64_t countBefore,
                    int64_t countAfter) {
  std::string line = findOomKillLine(kernelLog, pid);
  if (!line.empty()) {
    if (line.size() > 200) line = line.substr(0, 200) + "...";
    return fmt::format("likely killed by the OOM killer (kernel log: \"{}\")", line);
  }
  if (countBefore >= 0 && countAfter > countBefore) {
    return fmt::format("possibly killed by the OOM killer (the memory cgroup's oom_kill counter "
                       "went from {} to {} during this attempt)",
                       countBefore, countAfter);
  }
  return "";
}

std::string readKernelLog() {
  int fd = ::open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return "";
  std::string out;
  char record[8192];
  while (true) {
    ssize_t n = ::read(fd, record, sizeof record);
    if (n < 0) {
      if (errno == EPIPE || errno == EINTR) continue;  // EPIPE: records overwritten meanwhile
      break;                                           // EAGAIN: the end
    }
    if (n == 0) break;
    std::string r(record, static_cast<size_t>(n));
    size_t semi = r.find(';');
    std::string message = semi == std::string::npos ? r : r.substr(semi + 1);
    size_t nl = message.find('\n');  // continuation lines (" KEY=value") follow the message
    out += message.substr(0, nl) + "\n";
    if (out.size() > (16u << 20)) break;
  }
  ::close(fd);
  return out;
}

int64_t readOomKillCount() {
  std::string path = oomCounterPath(readSmallFile("/proc/self/cgroup"), "/sys/fs/cgroup");
  if (path.empty()) return -1;
  std::string text = readSmallFile(path);
  return text.empty() ? -1 : parseOomKillCount(text);
}

}  // namespace dtrain::launcher
