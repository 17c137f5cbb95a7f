#include "queued_communicator.h"

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "dtrain/base/timeout.h"
#include "failure_report.h"

namespace dtrain::comm {

void QueuedCommunicator::startQueue(const std::string& threadName, bool writesSockets) {
  queue_ = CollectiveQueue::start(threadName, writesSockets);
  watchProgress();
}

std::shared_ptr<Work> QueuedCommunicator::queueCollective(CollectiveInfo info,
                                                          const CallOptions& options, Body body) {
  throwIfUnusable();
  const Millis timeout = timeoutOrDefault(options.timeout, timeout_, "CallOptions::timeout");
  info.shape = options.shape;
  info.label = options.label.substr(0, CallOptions::kMaxLabelBytes);
  info.check = options.check;
  std::lock_guard<std::mutex> lock(issueMutex_);
  info.seq = nextSeq_.load();
  recorder_.recordQueued(info);
  countPayload(info);
  auto work = queue_->enqueue(
      [this, info, timeout, body = std::move(body)] { runOnCommThread(info, timeout, body); },
      [this, info] { return fmt::format("{}: {}", who(), info.describeWithSeq()); },
      defaultWaitBudget(timeout), /*wake=*/!options.synchronous);
  nextSeq_.store(info.seq + 1);
  return work;
}

void QueuedCommunicator::runOnCommThread(const CollectiveInfo& requested, Millis timeout,
                                         const Body& body) {
  DTRAIN_CHECK(queue_->onCommThread(), "{}: a collective ran outside the executor", who());
  {
    // A collective queued behind a failed one fails with the first error.
    std::lock_guard<std::mutex> lock(stateMutex_);
    if (error_) std::rethrow_exception(error_);
  }
  if (faults_.at(fault::Kind::SkipCollective, requested.seq)) {
    DTRAIN_LOG(Info, "{}: skipping {} (DTRAIN_FAULT skip-collective)", who(),
               requested.describeWithSeq());
    recorder_.setState(requested.seq, FlightRecorder::State::Skipped);
    return;
  }
  if (const fault::Fault* hang = faults_.at(fault::Kind::Hang, requested.seq)) {
    // The injected hang stops this rank before it takes part: the collective stays "queued" in
    // the flight recorder (issued, never started) while its peers show it "running", which is
    // how a stall report tells the rank that holds everyone up from the ones waiting for it.
    hangOnCommThread(requested, *hang);
  }
  const CollectiveInfo info = faults_.at(fault::Kind::WrongShape, requested.seq)
                                  ? wrongShape(requested)
                                  : requested;
  recorder_.setState(info.seq, FlightRecorder::State::Running);
  try {
    body(info, timeout);
  } catch (...) {
    // Released by abort(): its error, at once (Note [Aborting from outside]).
    if (std::exception_ptr aborted = abortError()) {
      recorder_.setState(info.seq, FlightRecorder::State::Failed);
      std::rethrow_exception(aborted);
    }
    failOnCommThread(info, timeout, std::current_exception());
  }
  recorder_.setState(info.seq, FlightRecorder::State::Done);
}

void QueuedCommunicator::hangOnCommThread(const CollectiveInfo& info, const fault::Fault& fault) {
  DTRAIN_LOG(Info, "{}: hanging in {} (DTRAIN_FAULT {}) until shutdown or abort", who(),
             info.describeWithSeq(), fault.describe());
  std::unique_lock<std::mutex> lock(stateMutex_);
  stateChanged_.wait(lock, [&] { return closing_ || membershipAborted_; });
  if (membershipAborted_) std::rethrow_exception(error_);
  DTRAIN_THROW(Error, "{}: {} hung (DTRAIN_FAULT {}) until the communicator was shut down", who(),
               info.describeWithSeq(), fault.describe());
}

void QueuedCommunicator::abortQueue(const std::string& reason,
                                    const std::function<void()>& release) {
  if (!markAborted(reason)) return;
  DTRAIN_LOG(Warn, "{}: aborted: membership changed: {}", who(), reason);
  release();
  stateChanged_.notify_all();  // set under stateMutex_: no hang misses this
}

bool QueuedCommunicator::stopQueue() {
  if (!markClosing()) return false;
  stateChanged_.notify_all();
  if (queue_) queue_->stop();
  return true;
}

}  // namespace dtrain::comm
