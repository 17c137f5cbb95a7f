#include "communicator_base.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"

namespace dtrain::comm {

CommunicatorBase::CommunicatorBase(int rank, int size, std::string name,
                                   std::shared_ptr<store::Store> store, Millis timeout)
    : rank_(rank),
      size_(size),
      name_(std::move(name)),
      store_(std::move(store)),
      timeout_(timeout) {}

std::string CommunicatorBase::who() const { return fmt::format("rank {}/{}", rank_, size_); }

std::exception_ptr CommunicatorBase::error() const {
  std::lock_guard<std::mutex> lock(stateMutex_);
  return error_;
}

void CommunicatorBase::throwIfUnusable() const {
  std::lock_guard<std::mutex> lock(stateMutex_);
  if (error_) std::rethrow_exception(error_);
  DTRAIN_CHECK(!closing_, "{}", shutDownMessage());
}

std::exception_ptr CommunicatorBase::keepFirstError(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(stateMutex_);
  if (!error_) error_ = std::move(error);
  return error_;
}

bool CommunicatorBase::markClosing() {
  std::lock_guard<std::mutex> lock(stateMutex_);
  if (closing_) return false;
  closing_ = true;
  return true;
}

// Note [Aborting from outside]
// abort() is how a watcher thread that learned of a lost node pulls this rank out of whatever
// collective it is blocked in (dtrain/comm/communicator.h). Its error is MembershipChanged and it
// supersedes an earlier failure (quoting it): a collective may well have failed first with a
// NetworkError because the lost node's connections broke, but the lost node is what the caller
// acts on -- it re-forms the communicators among the survivors instead of ending the job. The
// error is set before the backend releases its blocked operation, so the executor that sees that
// operation fail finds it and rethrows it at once (QueuedCommunicator::runOnCommThread), without
// comparing notes with ranks that are gone. Each backend then releases what it blocks in:
// the shared-memory engine marks this rank failed in the segment and wakes every sleeper (its
// waits look at this rank's own mark too); Gloo fails every pending operation of every pair and
// closes the connections (GlooMesh::interrupt); NCCL fails the pending work at once and lets its
// watchdog call ncclCommAbort under the issue lock (Note [Aborting under the issue lock]).
std::exception_ptr CommunicatorBase::markAborted(const std::string& reason) {
  const std::string me = describe();  // virtual and may lock: outside stateMutex_
  std::lock_guard<std::mutex> lock(stateMutex_);
  if (membershipAborted_) return nullptr;
  std::string earlier;
  if (error_) {
    try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      earlier = fmt::format(" (it had failed before: {})", e.what());
    }
  }
  error_ = DTRAIN_ERROR_PTR(
      MembershipChanged,
      "{}: membership changed: {}; this communicator was aborted and every pending and later "
      "collective on it fails{}. HINT: a step run in TrainingState::tryStep is discarded and the "
      "group re-forms among the survivors{} (docs/training.md, \"Surviving a lost node\")",
      me, reason, earlier,
      isGroup() ? "; this is a subgroup (split/newGroup), which is not re-formed: make it again "
                  "from the re-formed group"
                : "");
  membershipAborted_ = true;
  return error_;
}

std::exception_ptr CommunicatorBase::abortError() const {
  std::lock_guard<std::mutex> lock(stateMutex_);
  return membershipAborted_ ? error_ : nullptr;
}

bool CommunicatorBase::agreeOnCollectiveCheck(bool requested, bool fromEnv, Millis connectTimeout) {
  const std::string key = name_ + "/check_collectives";
  if (rank_ == 0) {
    const char* env = std::getenv("DTRAIN_CHECK_COLLECTIVES");
    const bool check = requested || (fromEnv && env != nullptr &&
                                     (std::strcmp(env, "1") == 0 || std::strcmp(env, "true") == 0));
    store_->setString(key, check ? "1" : "0");
    return check;
  }
  store_->wait({key}, connectTimeout);
  return store_->getString(key) == "1";
}

void CommunicatorBase::watchProgress() {
  progress_ = progress::watchCollectives(
      [this] { return recorder_.progressState(name_, nextSeq_.load()); });
}

std::string CommunicatorBase::compareNotes(const RankReport& mine, Millis timeout, bool timedOut) {
  const Millis grace = timedOut ? reportGrace(timeout)
                                : std::min(reportGrace(timeout), Millis(500));
  // A new membership epoch aborts this communicator while it waits: the lost ranks never answer.
  const auto reports = exchangeReports(*store_, name_ + "/failure", size_, mine, grace, [this] {
    std::lock_guard<std::mutex> lock(stateMutex_);
    return membershipAborted_;
  });
  return summarizeReports(reports, mine, grace);
}

void CommunicatorBase::shutdownInDestructor(const std::string& subject) noexcept {
  try {
    shutdown();
  } catch (const std::exception& e) {
    DTRAIN_LOG(Warn, "{}: shutdown in destructor failed: {}", subject, e.what());
  }
}

}  // namespace dtrain::comm
