// How the Gloo communicator fails: see Note [Failing once].
#include <algorithm>

#include <gloo/common/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "failure_report.h"
#include "gloo_communicator_impl.h"

namespace dtrain::comm {

// Note [Failing once]
// The first collective that fails makes the communicator unusable, on purpose: after a timeout
// or a lost peer, Gloo may still hold receives posted into the caller's buffers, and the ranks no
// longer agree on what has been exchanged. So the executor (1) resets every connection, which
// makes every peer's pending operation on this rank fail within milliseconds instead of at its
// own timeout (a dead rank thus takes the whole group down quickly); (2) posts where it was to
// the store and reads where the others were (failure_report.h), so the error can say "rank 1 is
// behind at seq 41" or "rank 2 did not report (frozen or dead)"; (3) keeps that error: every
// later call rethrows it.

namespace {

bool contains(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

std::string GlooCommunicator::explainOnCommThread(std::exception_ptr cause, Millis timeout,
                                                  bool& timedOut) {
  timedOut = false;
  try {
    std::rethrow_exception(cause);
  } catch (const GlooWaitTimeout& e) {
    timedOut = true;
    std::vector<std::string> peers;
    for (int r : e.ranks)
      peers.push_back(mesh_ ? mesh_->describePeer(r) : fmt::format("rank {}", r));
    return fmt::format("timed out after {} ms {} {}", timeout.count(), e.action,
                       fmt::join(peers, ", "));
  } catch (const std::exception& e) {
    const std::string text = e.what();
    const std::string peer = mesh_ ? mesh_->peerIn(text) : std::string();
    const std::string from = peer.empty() ? "a peer" : peer;
    if (contains(text, "Timed out")) {
      timedOut = true;
      return fmt::format("timed out waiting for the other ranks (Gloo: {})", text);
    }
    if (contains(text, "closed by peer") || contains(text, "Socket closed")) {
      return fmt::format("connection closed by {}: that process exited, crashed, or its "
                         "communicator failed or shut down",
                         from);
    }
    if (contains(text, "reset by peer") || contains(text, "Broken pipe")) {
      return fmt::format("connection reset by {}: that process died or aborted its communicator",
                         from);
    }
    return peer.empty() ? text : fmt::format("{} ({})", text, peer);
  }
}

void GlooCommunicator::failOnCommThread(const CollectiveInfo& info, Millis timeout,
                                        std::exception_ptr cause) {
  // A failed collective check is the caller's mistake, seen identically by every rank: keep its
  // message and type.
  try {
    std::rethrow_exception(cause);
  } catch (const InvalidArgument&) {
    if (mesh_) mesh_->abort();
    recorder_.setState(info.seq, FlightRecorder::State::Failed);
    std::rethrow_exception(keepFirstError(cause));
  } catch (...) {
  }

  bool timedOut = false;
  const std::string what = explainOnCommThread(cause, timeout, timedOut);
  if (mesh_) mesh_->abort();  // Note [Failing once] (1)
  recorder_.setState(info.seq, FlightRecorder::State::Failed);

  RankReport mine;
  mine.rank = rank_;
  mine.seq = info.seq;
  mine.collective = info.describe();
  mine.error = what;
  const std::string summary = compareNotes(mine, timeout, timedOut);

  std::string message = fmt::format("{}: {} failed: {}", who(), info.describeWithSeq(), what);
  if (!summary.empty()) message += ". Other ranks: " + summary;
  message += ". Recent collectives here: " + recorder_.dump(4);
  if (timedOut) {
    message += fmt::format(". HINT: the collective timeout is {} ms; a rank that skipped a "
                           "collective, passed another size, or is stuck outside the "
                           "communicator leaves the others waiting",
                           timeout.count());
  }
  DTRAIN_LOG(Error, "{}", message);

  std::exception_ptr error;
  try {
    if (timedOut) {
      DTRAIN_THROW(TimeoutError, "{}", message);
    }
    DTRAIN_THROW(NetworkError, "{}", message);
  } catch (...) {
    error = std::current_exception();
  }
  std::rethrow_exception(keepFirstError(error));
}

}  // namespace dtrain::comm
