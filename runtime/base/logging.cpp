#include "dtrain/base/logging.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

namespace dtrain::log {

namespace {

std::atomic<int> gVerbosity{-1};
// Never destroyed: background threads (the progress publisher, the communicators' watchdogs) may
// log while the process's exit handlers run.
std::mutex& tagMutex() {
  static auto* const mutex = new std::mutex;
  return *mutex;
}
std::string& tag() {  // guarded by tagMutex()
  static auto* const text = new std::string("[dtrain]");
  return *text;
}

const char* levelName(Level level) {
  switch (level) {
    case Level::Error: return "";
    case Level::Info: return "info: ";
    case Level::Debug: return "debug: ";
    case Level::Trace: return "trace: ";
  }
  return "";
}

}  // namespace

int verbosity() {
  int v = gVerbosity.load(std::memory_order_relaxed);
  if (v >= 0) return v;
  const char* env = std::getenv("DTRAIN_VERBOSE");
  v = env ? std::atoi(env) : 0;
  if (v < 0) v = 0;
  gVerbosity.store(v, std::memory_order_relaxed);
  return v;
}

void setVerbosity(int level) { gVerbosity.store(level < 0 ? 0 : level); }

void setTag(const std::string& text) {
  std::lock_guard<std::mutex> lock(tagMutex());
  tag() = text;
}

void write(Level level, const std::string& message) {
  std::string line;
  {
    std::lock_guard<std::mutex> lock(tagMutex());
    line = tag();
  }
  line += ' ';
  line += levelName(level);
  line += message;
  if (line.empty() || line.back() != '\n') line += '\n';
  // One write(): whole lines, never interleaved with other threads' or processes' lines.
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace dtrain::log
