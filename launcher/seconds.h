#pragma once
// launch's options give durations in seconds (30, 0.5); these turn them into the steady clock's
// terms, one way everywhere.

#include <chrono>
#include <cstdint>

namespace dtrain::launcher {

// `seconds` in whole milliseconds (cut, not rounded), for store timeouts and waits.
inline std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

// The moment `seconds` after `t`.
inline std::chrono::steady_clock::time_point after(std::chrono::steady_clock::time_point t,
                                                   double seconds) {
  return t + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                 std::chrono::duration<double>(seconds));
}

// CLOCK_MONOTONIC in seconds (the steady clock on Linux): one clock for every process of the
// host, in every network namespace, so the "t=" of the agents', the master's and the workers'
// lines can be subtracted from one another.
inline double monotonicSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds from `t` until now.
inline double secondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace dtrain::launcher
