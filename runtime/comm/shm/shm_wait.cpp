#include "shm_wait.h"

#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <ctime>
#include <utility>

namespace dtrain::comm::shm {

void futexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds timeout) {
  if (timeout.count() <= 0) return;
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000) * 1000;
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futexWakeAll(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

PeerWatch::PeerWatch(std::vector<Peer> peers) : peers_(std::move(peers)) {
  for (size_t r = 0; r < peers_.size(); ++r) {
    if (!peers_[r].self && peers_[r].pidfd >= 0) polled_.push_back(static_cast<int>(r));
  }
}

int PeerWatch::firstDead() {
  if (!polled_.empty()) {
    std::vector<pollfd> p;
    p.reserve(polled_.size());
    for (int r : polled_) p.push_back(pollfd{peers_[r].pidfd, POLLIN, 0});
    if (::poll(p.data(), p.size(), 0) > 0) {
      for (size_t i = 0; i < p.size(); ++i) {
        if (p[i].revents & (POLLIN | POLLHUP | POLLERR)) return polled_[i];
      }
    }
  }
  // Note [Watching peers]: a pid means something only within the peer's own PID namespace.
  for (size_t r = 0; r < peers_.size(); ++r) {
    const Peer& p = peers_[r];
    if (p.self || p.pidfd >= 0 || !p.samePidNamespace || p.pid <= 0) continue;
    if (::kill(p.pid, 0) != 0 && errno == ESRCH) return static_cast<int>(r);
  }
  return -1;
}

}  // namespace dtrain::comm::shm
