#pragma once
// Waiting between processes on words of the shared segment: futex wrappers, and PeerWatch, which
// tells whether a peer process is still alive (a pidfd per peer; kill(pid, 0) where the kernel has
// no pidfd). See Note [Waiting] in shm_engine.cpp.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

namespace dtrain::comm::shm {

// Sleeps while *word == expected, at most `timeout` (shared, not process-private: the word lives
// in memory other processes map). Returns on a wake-up, a timeout, a signal or a changed value.
void futexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds timeout);
void futexWakeAll(std::atomic<uint32_t>* word);

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class PeerWatch {
 public:
  PeerWatch() = default;
  // pids by rank; this process's own pid (ranks as threads) is never reported dead.
  explicit PeerWatch(const std::vector<int>& pids);
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // The first rank whose process has exited, or -1. One poll() over all pidfds.
  int firstDead();
  int pid(int rank) const { return pids_[rank]; }

 private:
  std::vector<int> pids_;
  std::vector<int> fds_;   // pidfd by rank; -1 for this process, or without pidfd support
  std::vector<int> ranks_; // ranks with a pidfd, in fds_ order for poll
};

}  // namespace dtrain::comm::shm
