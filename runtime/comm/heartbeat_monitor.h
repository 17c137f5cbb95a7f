#pragma once
// HeartbeatMonitor: who watches the watchdog. The NCCL watchdog thread is what turns a hung peer
// into an error; if the watchdog itself is stuck -- in a CUDA or NCCL call that never returns in
// the driver, or waiting for a caller that is -- nothing else in the process will end the hang,
// and the job sits there until someone notices. So the watchdog beats a heartbeat at every turn
// of its loop, and this monitor's thread ends the process when the heartbeat has been silent for
// the heartbeat timeout (Note [Watchdog heartbeat]). Torch- and CUDA-free.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "dtrain/comm/communicator.h"

namespace dtrain::comm {

// c10d's default for TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC.
constexpr Millis kDefaultHeartbeatTimeout{std::chrono::minutes(8)};

struct HeartbeatMonitorOptions {
  std::string who;  // "nccl rank 1/4 (cuda:1)": the message's subject
  // Silence after which the process ends. Zero: kDefaultHeartbeatTimeout (Note [Zero timeouts]).
  Millis timeout = kDefaultHeartbeatTimeout;
  // How often the heartbeat is looked at. Zero: timeout / 8, between 10 ms and 10 s.
  Millis checkInterval = Millis::zero();
  // What else the message should say (the flight recorder's view of the collectives); called on
  // the monitor's thread, so it must take no lock a thread may hold across a CUDA or NCCL call.
  std::function<std::string()> describe;
  // What happens when the heartbeat was silent too long. Default: endProcess() -- the message on
  // stderr and in TORCHELASTIC_ERROR_FILE, then abort(). Tests replace it.
  std::function<void(const std::string& message)> onStuck;
};

class HeartbeatMonitor {
 public:
  explicit HeartbeatMonitor(HeartbeatMonitorOptions options);
  ~HeartbeatMonitor();  // stop()
  HeartbeatMonitor(const HeartbeatMonitor&) = delete;
  HeartbeatMonitor& operator=(const HeartbeatMonitor&) = delete;

  // Starts the monitor's thread; the heartbeat counts from now.
  void start();
  // The watched thread is alive; `doing` (a string literal: it is kept as a pointer) says what it
  // does next, so that a stuck thread is named with the call it is stuck in. Lock-free.
  void beat(const char* doing);
  // Ends the monitor's thread (the watched thread is done or about to be joined).
  void stop();

  Millis timeout() const { return timeout_; }
  Millis checkInterval() const { return checkInterval_; }
  // The message onStuck gets when the heartbeat has been silent for `silent`.
  std::string message(Millis silent) const;

 private:
  void run();

  HeartbeatMonitorOptions options_;
  const Millis timeout_;
  const Millis checkInterval_;
  std::atomic<int64_t> lastBeatNanos_{0};  // steady_clock
  std::atomic<const char*> doing_{"starting"};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;  // guarded by mutex_
  std::thread thread_;
};

struct HeartbeatSetting {
  bool enabled = true;
  Millis timeout = Millis::zero();  // zero: kDefaultHeartbeatTimeout
};
// `fromOptions` as PyTorch's variables change it, so a job's settings carry over:
// TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC (whole seconds) sets the timeout, TORCH_NCCL_ENABLE_MONITORING=0
// turns the monitor off. A malformed value is an InvalidArgument naming the variable.
HeartbeatSetting heartbeatFromEnv(Millis fromOptions);

// The default onStuck: writes `message` to stderr (one write) and, when TORCHELASTIC_ERROR_FILE
// is set, into that file in torchrun's format, so launch's failure report shows it; then
// abort(): the process ends with SIGABRT (a core, where enabled, shows the stuck thread).
[[noreturn]] void endProcess(const std::string& message);

}  // namespace dtrain::comm
