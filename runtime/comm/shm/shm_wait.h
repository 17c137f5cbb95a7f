#pragma once
// Waiting between processes on words of the shared segment: futex wrappers, and PeerWatch, which
// tells whether a peer process is still alive. See Note [Waiting] in shm_engine.cpp.

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

// Note [Watching peers]
// A waiting rank must tell a dead peer (fail now, naming it) from a slow one (keep waiting). A
// pid alone cannot: ranks that share a node's network and IPC need not share a PID namespace
// (containers, Kubernetes pods with shared IPC), and there a peer's own getpid() names another
// process or none at all -- kill(pid, 0) would call a live peer dead at its first slow wait, or
// watch an unrelated process forever. A pidfd names one process whatever the namespaces, so each
// rank opens one of itself (pidfd_open(getpid()), valid in its own namespace) and sends it with
// its request for the segment; rank 0 hands every rank all of them (shm_handover.h), and a waiter
// polls its peers' pidfds: readable means exited. kill(pid, 0) serves only where the kernel has
// no pidfd (before Linux 5.3), and only for a peer known to share this rank's PID namespace; a
// peer in another one without a pidfd is watched through its control block and the deadline
// alone.
class PeerWatch {
 public:
  struct Peer {
    int pidfd = -1;  // borrowed (the segment owns it); -1: none
    int pid = 0;     // as the peer sees itself
    bool samePidNamespace = false;
    bool self = false;  // this rank: never watched
  };
  PeerWatch() = default;
  explicit PeerWatch(std::vector<Peer> peers);

  // The first rank whose process has exited, or -1. One poll() over all pidfds.
  int firstDead();
  const Peer& peer(int rank) const { return peers_[static_cast<size_t>(rank)]; }

 private:
  std::vector<Peer> peers_;
  std::vector<int> polled_;  // ranks with a pidfd, in poll order
};

}  // namespace dtrain::comm::shm
