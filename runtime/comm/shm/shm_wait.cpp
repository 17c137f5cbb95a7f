#include "shm_wait.h"

#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <ctime>

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

PeerWatch::PeerWatch(const std::vector<int>& pids) : pids_(pids), fds_(pids.size(), -1) {
  const int self = static_cast<int>(::getpid());
  for (size_t r = 0; r < pids.size(); ++r) {
    if (pids[r] <= 0 || pids[r] == self) continue;
    fds_[r] = static_cast<int>(::syscall(SYS_pidfd_open, pids[r], 0));
    if (fds_[r] >= 0) ranks_.push_back(static_cast<int>(r));
  }
}

PeerWatch::~PeerWatch() {
  for (int fd : fds_) {
    if (fd >= 0) ::close(fd);
  }
}

int PeerWatch::firstDead() {
  if (!ranks_.empty()) {
    std::vector<pollfd> p;
    p.reserve(ranks_.size());
    for (int r : ranks_) p.push_back(pollfd{fds_[r], POLLIN, 0});
    if (::poll(p.data(), p.size(), 0) > 0) {
      for (size_t i = 0; i < p.size(); ++i) {
        if (p[i].revents & (POLLIN | POLLHUP | POLLERR)) return ranks_[i];
      }
    }
  }
  // Peers without a pidfd (kernels before 5.3): existence only.
  const int self = static_cast<int>(::getpid());
  for (size_t r = 0; r < pids_.size(); ++r) {
    if (fds_[r] >= 0 || pids_[r] <= 0 || pids_[r] == self) continue;
    if (::kill(pids_[r], 0) != 0 && errno == ESRCH) return static_cast<int>(r);
  }
  return -1;
}

}  // namespace dtrain::comm::shm
