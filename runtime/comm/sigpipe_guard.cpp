#include "sigpipe_guard.h"

#include <pthread.h>
#include <time.h>

namespace dtrain::comm {

namespace {
sigset_t pipeSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  return set;
}
}  // namespace

SigpipeGuard::SigpipeGuard() {
  const sigset_t set = pipeSet();
  pthread_sigmask(SIG_BLOCK, &set, &previous_);
  wasBlocked_ = sigismember(&previous_, SIGPIPE) == 1;
}

SigpipeGuard::~SigpipeGuard() {
  if (wasBlocked_) return;  // the caller blocks it itself: leave pending signals to the caller
  sigset_t pending;
  sigemptyset(&pending);
  if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
    const sigset_t set = pipeSet();
    timespec zero{0, 0};
    sigtimedwait(&set, nullptr, &zero);  // consume ours (a process-wide one is consumed too)
  }
  pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
}

void blockSigpipeOnThisThread() {
  const sigset_t set = pipeSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

}  // namespace dtrain::comm
