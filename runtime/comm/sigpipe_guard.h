#pragma once
// SIGPIPE and sockets. Gloo writes to its TCP sockets with writev(2), which raises SIGPIPE when the
// peer has gone away; with the default disposition that kills this process before Gloo can report
// EPIPE, so a rank that dies takes its peers down silently (PyTorch is spared only because Python
// ignores SIGPIPE). A library must not change the process's disposition, so every thread that can
// write a Gloo socket blocks SIGPIPE instead:
//   - Gloo's event-loop thread, created with SIGPIPE blocked (it inherits the mask);
//   - the comm thread, for its whole life;
//   - a caller's thread while it runs a collective inline (SigpipeGuard), which also discards a
//     SIGPIPE raised meanwhile so the caller never sees it once the mask is restored.

#include <signal.h>

namespace dtrain::comm {

// Blocks SIGPIPE on this thread for its scope; on exit consumes a SIGPIPE that became pending
// meanwhile, then restores the previous mask.
class SigpipeGuard {
 public:
  SigpipeGuard();
  ~SigpipeGuard();
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t previous_;
  bool wasBlocked_ = false;
};

// Blocks SIGPIPE on the calling thread for good (threads dtrain owns).
void blockSigpipeOnThisThread();

}  // namespace dtrain::comm
