#pragma once
// QueuedCommunicator: a CPU backend (Gloo, shared memory) whose collectives run one at a time, in
// issue order, on a CollectiveQueue. Callers' threads only describe and queue a collective; the
// executor (the comm thread, or a caller that waits, see Note [Inline execution]) applies the
// injected faults, runs it, and hands a failure to the backend's failOnCommThread(), which makes
// it the communicator's permanent error (Note [Failing once]).

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "collective.h"
#include "collective_queue.h"
#include "communicator_base.h"

namespace dtrain::comm {

class QueuedCommunicator : public CommunicatorBase {
 protected:
  using CommunicatorBase::CommunicatorBase;

  // Runs one collective on the executor. `info` is what runs (the wrong-shape fault shrinks what
  // the caller asked for); `timeout` is its deadline, from now.
  using Body = std::function<void(const CollectiveInfo& info, Millis timeout)>;

  // Starts the comm thread, named `threadName`, and the progress reports: the last step of a
  // backend's constructor. `writesSockets`: whether collectives write to sockets that can raise
  // SIGPIPE (Gloo's), so that callers running them inline must block it (sigpipe_guard.h).
  void startQueue(const std::string& threadName, bool writesSockets = true);
  // Gives `info` the next sequence number and queues `body` for it. Throws the first error, or
  // that the communicator was shut down.
  std::shared_ptr<Work> queueCollective(CollectiveInfo info, const CallOptions& options, Body body);
  // The first step of shutdown(): no new collectives, an injected hang ends, the collectives
  // already queued run (each bounded by its timeout) and the comm thread stops. False when
  // shutdown() had begun already.
  bool stopQueue();

  // A queued backend's abort() (Note [Aborting from outside]): markAborted(), then `release`
  // stops what the executor is blocked in, from this (any) thread, then an injected hang ends.
  // Nothing happens when abort() was called before.
  void abortQueue(const std::string& reason, const std::function<void()>& release);

  // Turns the failure `cause` of collective `info` into the communicator's error (the first one
  // kept, keepFirstError()) and throws it.
  [[noreturn]] virtual void failOnCommThread(const CollectiveInfo& info, Millis timeout,
                                             std::exception_ptr cause) = 0;

 private:
  void runOnCommThread(const CollectiveInfo& info, Millis timeout, const Body& body);
  [[noreturn]] void hangOnCommThread(const CollectiveInfo& info, const fault::Fault& fault);

  std::shared_ptr<CollectiveQueue> queue_;
  std::mutex issueMutex_;                 // makes sequence numbers follow queue order
  std::condition_variable stateChanged_;  // with stateMutex_: wakes an injected hang
};

}  // namespace dtrain::comm
