#pragma once
// Verbose logging by layer: DTRAIN_VERBOSE=1|2|3, every line prefixed with
// the process's tag (e.g. "[dtrain rank 3]"), written to stderr in one write() so lines from
// several threads or processes never interleave mid-line.

#include <string>

#include <fmt/format.h>

namespace dtrain::log {

enum class Level { Error = 0, Warn = 0, Info = 1, Debug = 2, Trace = 3 };

// Level from DTRAIN_VERBOSE (0 when unset): messages at or below it are printed.
int verbosity();
void setVerbosity(int level);
// "[dtrain rank 3]" once the rank is known; "[dtrain]" before.
void setTag(const std::string& tag);
void write(Level level, const std::string& message);

inline bool enabled(Level level) { return static_cast<int>(level) <= verbosity(); }

}  // namespace dtrain::log

#define DTRAIN_LOG(level, ...)                                                       \
  do {                                                                               \
    if (::dtrain::log::enabled(::dtrain::log::Level::level)) {                       \
      ::dtrain::log::write(::dtrain::log::Level::level, ::fmt::format(__VA_ARGS__)); \
    }                                                                                \
  } while (0)
