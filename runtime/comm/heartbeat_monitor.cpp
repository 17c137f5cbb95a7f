#include "heartbeat_monitor.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "dtrain/base/timeout.h"
#include "env_contract.h"
#include "parse_int.h"

namespace dtrain::comm {

// Note [Watchdog heartbeat]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// The NCCL watchdog (Note [NCCL watchdog] in nccl/nccl_communicator.cpp) calls beat() at every
// turn of its loop (every watchdogInterval, 20 ms) and before each call that can block: the
// failure report, the wait for the issue lock, ncclCommAbort. The monitor's thread wakes every
// checkInterval (timeout / 8) and compares the last beat with the clock. A heartbeat silent for
// longer than the timeout (8 minutes by default, as c10d's; TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC)
// means the watchdog can no longer fail anything: a CUDA or NCCL call hangs in the driver, or a
// caller holds the issue lock inside NCCL for good. Then the only way out is the process's end:
// the message names the communicator, how long the watchdog has been silent, the call it was
// in, and the collectives' state, goes to stderr and to TORCHELASTIC_ERROR_FILE (launch's report
// quotes it), and abort() ends the process, so launch tears the job down and may restart it.
// The bound: the process ends at most timeout + checkInterval after the last beat.
// The heartbeat itself is two atomics; the monitor takes no lock the watchdog holds across a CUDA
// or NCCL call (the message reads the flight recorder, whose lock is only held for a copy), so a
// stuck watchdog cannot stop the monitor too.

namespace {

int64_t nowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Millis defaultCheckInterval(Millis timeout) {
  return std::clamp<Millis>(timeout / 8, Millis(10), Millis(10000));
}

std::string jsonEscape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 16);
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

void writeAllTo(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace

HeartbeatMonitor::HeartbeatMonitor(HeartbeatMonitorOptions options)
    : options_(std::move(options)),
      timeout_(timeoutOrDefault(options_.timeout, kDefaultHeartbeatTimeout,
                                "HeartbeatMonitorOptions::timeout")),
      checkInterval_(timeoutOrDefault(options_.checkInterval, defaultCheckInterval(timeout_),
                                      "HeartbeatMonitorOptions::checkInterval")) {
  if (!options_.onStuck) options_.onStuck = [](const std::string& m) { endProcess(m); };
}

HeartbeatMonitor::~HeartbeatMonitor() { stop(); }

void HeartbeatMonitor::start() {
  DTRAIN_CHECK(!thread_.joinable(), "{}: the heartbeat monitor was started twice", options_.who);
  lastBeatNanos_.store(nowNanos());
  thread_ = std::thread([this] { run(); });
}

void HeartbeatMonitor::beat(const char* doing) {
  doing_.store(doing, std::memory_order_relaxed);
  lastBeatNanos_.store(nowNanos(), std::memory_order_release);
}

void HeartbeatMonitor::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string HeartbeatMonitor::message(Millis silent) const {
  std::string m = fmt::format(
      "{}: the NCCL watchdog thread has not run for {:.1f} s (heartbeat timeout {:g} s, "
      "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC); it was in: {}. A CUDA or NCCL call is stuck in the "
      "driver, so no collective of this process can fail or finish any more: ending the process "
      "(abort) so that launch can stop the job and restart it",
      options_.who, static_cast<double>(silent.count()) / 1000.0,
      static_cast<double>(timeout_.count()) / 1000.0, doing_.load(std::memory_order_relaxed));
  if (options_.describe) {
    try {
      std::string more = options_.describe();
      if (!more.empty()) m += "; " + more;
    } catch (const std::exception& e) {
      m += fmt::format(" (the collectives' state could not be described: {})", e.what());
    }
  }
  return m + ". HINT: check the GPU (nvidia-smi, dmesg for Xid errors) on this node";
}

void HeartbeatMonitor::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, checkInterval_);
    if (stopping_) return;
    const int64_t silentNanos = nowNanos() - lastBeatNanos_.load(std::memory_order_acquire);
    const Millis silent = std::chrono::duration_cast<Millis>(std::chrono::nanoseconds(silentNanos));
    if (silent < timeout_) continue;
    lock.unlock();
    options_.onStuck(message(silent));
    // A test's onStuck returns: the monitor has done its job once.
    return;
  }
}

HeartbeatSetting heartbeatFromEnv(Millis fromOptions) {
  HeartbeatSetting setting{true, fromOptions};
  if (const char* on = std::getenv("TORCH_NCCL_ENABLE_MONITORING"); on != nullptr && *on != '\0') {
    const std::string v = on;
    DTRAIN_CHECK_ARG(v == "0" || v == "1",
                     "TORCH_NCCL_ENABLE_MONITORING={}: expected 0 or 1 (0 "
                     "turns the NCCL watchdog's heartbeat monitor off)",
                     v);
    setting.enabled = v == "1";
  }
  const char* text = std::getenv("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC");
  if (text == nullptr || *text == '\0') return setting;
  int64_t seconds = 0;
  DTRAIN_CHECK_ARG(parseInt64(text, &seconds) && seconds >= 1 && seconds <= 86400 * 365,
                   "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC={}: expected whole seconds from 1 (the NCCL "
                   "watchdog's heartbeat timeout; TORCH_NCCL_ENABLE_MONITORING=0 turns it off)",
                   text);
  setting.timeout = std::chrono::seconds(seconds);
  return setting;
}

void endProcess(const std::string& message) {
  log::write(log::Level::Error, message);  // one write(), with the process's tag
  if (const char* path = std::getenv(env::kErrorFile); path != nullptr && *path != '\0') {
    int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      writeAllTo(fd, fmt::format("{{\"message\": {{\"message\": \"{}\", \"extraInfo\": "
                                 "{{\"py_callstack\": \"NCCL watchdog heartbeat monitor\"}}}}}}",
                                 jsonEscape(message)));
      ::close(fd);
    }
  }
  std::abort();
}

}  // namespace dtrain::comm
