#pragma once
// CommunicatorBase: what every backend (Gloo, shared memory, NCCL) keeps the same way: who it is,
// its store and default timeout, its collectives' sequence numbers and flight recorder, the
// injected faults, the first error (Note [Failing once]) and the shutdown flag, and its place in
// the progress reports. A backend derives from it (CPU backends through QueuedCommunicator) and
// adds how its collectives run and fail.

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

#include "collective.h"
#include "collective_faults.h"
#include "dtrain/base/progress.h"
#include "dtrain/base/store.h"
#include "dtrain/comm/communicator.h"
#include "failure_report.h"
#include "flight_recorder.h"

namespace dtrain::comm {

class CommunicatorBase : public Communicator {
 public:
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::exception_ptr error() const override;
  uint64_t sequenceNumber() const override { return nextSeq_.load(); }
  uint64_t payloadBytes() const override { return payloadBytes_.load(); }

  std::string who() const;  // "rank 1/4"

 protected:
  // `timeout`: the collective timeout, already resolved from its option (timeoutOrDefault).
  CommunicatorBase(int rank, int size, std::string name, std::shared_ptr<store::Store> store,
                   Millis timeout);

  // What a call after shutdown() is told: "rank 1/4: the Gloo communicator was shut down; ...".
  virtual std::string shutDownMessage() const = 0;

  // Adds what `info` sends to payloadBytes(); called where a collective is issued.
  void countPayload(const CollectiveInfo& info) {
    payloadBytes_.fetch_add(comm::payloadBytes(info, size_), std::memory_order_relaxed);
  }
  // Rethrows the first error; throws Error with shutDownMessage() once shutdown() has begun.
  void throwIfUnusable() const;
  // Keeps `error` as the communicator's error unless another came first; returns the one kept.
  std::exception_ptr keepFirstError(std::exception_ptr error);
  // Marks the communicator closing; false when shutdown() had begun already.
  bool markClosing();
  // The first step of every backend's abort(): makes MembershipChanged the communicator's error,
  // superseding an earlier one (Note [Aborting from outside]). Returns it, or null when abort()
  // had been called already.
  std::exception_ptr markAborted(const std::string& reason);
  // abort()'s error once it was called, else null.
  std::exception_ptr abortError() const;
  // Rank 0 decides whether collectives are checked across ranks and posts it, so all ranks agree
  // (a rank checking alone would wait for fingerprints nobody sends). `fromEnv`: rank 0 also
  // checks when DTRAIN_CHECK_COLLECTIVES is 1 or true.
  bool agreeOnCollectiveCheck(bool requested, bool fromEnv, Millis connectTimeout);
  // Reports this communicator's recent collectives to the progress publisher from now on.
  void watchProgress();
  // Posts where this rank is (`mine`) under "<name>/failure", reads where the others are, and
  // returns what they say (summarizeReports; empty when nothing). Waits reportGrace(timeout), at
  // most 500 ms unless `timedOut`: a lost connection or an asynchronous error usually means a dead
  // peer that will never report.
  std::string compareNotes(const RankReport& mine, Millis timeout, bool timedOut);
  // For a backend's destructor: shutdown(), logging what it throws as "<subject>: shutdown in
  // destructor failed: ...".
  void shutdownInDestructor(const std::string& subject) noexcept;

  const int rank_;
  const int size_;
  const std::string name_;  // its store keys
  const std::shared_ptr<store::Store> store_;
  const Millis timeout_;
  CollectiveFaults faults_;  // set by the constructor, read-only after
  FlightRecorder recorder_;
  std::atomic<uint64_t> nextSeq_{0};       // the next collective's; written under the issue lock
  std::atomic<uint64_t> payloadBytes_{0};  // Note [Payload bytes]

  mutable std::mutex stateMutex_;
  // Guarded by stateMutex_: the first error (abort()'s once it was called), whether shutdown()
  // has begun, whether abort() was called.
  std::exception_ptr error_;
  bool closing_ = false;
  bool membershipAborted_ = false;

 private:
  // Last member, so it is gone before anything the publisher thread reads (dtrain/base/progress.h):
  // the source reads only members of this class, which a backend's members die before.
  progress::Registration progress_;
};

}  // namespace dtrain::comm
