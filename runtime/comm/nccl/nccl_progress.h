#pragma once
// Waiting for a non-blocking NCCL call to complete (Note [Non-blocking communicators]), through a
// small API so that the rule -- poll, stop when told, give up at a deadline -- is tested without
// a GPU (tests/comm/nccl/nccl_build_test.cpp).
//
// Note [Non-blocking communicators]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every communicator is created with `blocking = 0` in its ncclConfig_t. Then no NCCL call blocks
// the calling thread: ncclCommInitRankConfig, an enqueue that has to connect to a peer first, and
// ncclCommFinalize return ncclInProgress, and the call completes in NCCL's own threads; the caller
// polls ncclCommGetAsyncError until the state leaves ncclInProgress (ncclSuccess: done, the
// collective is on the stream; anything else: it failed). That gives the three bounds a
// blocking communicator cannot have:
//   - init has a deadline (NcclOptions::connectTimeout): a rank that never joins, or a peer NCCL
//     cannot reach, ends in a TimeoutError and ncclCommAbort instead of a rank waiting in NCCL
//     for good;
//   - an enqueue waits at most the collective's timeout, and stops at once when the communicator
//     failed or was aborted meanwhile (the watchdog's failure, a membership epoch's abort()), so
//     the issue lock, under which ncclCommAbort runs (Note [Aborting under the issue lock]), is
//     never held by a caller stuck inside NCCL;
//   - shutdown's ncclCommFinalize waits at most the collective timeout before it aborts instead.
// NCCL_COMM_BLOCKING overrides the configuration in NCCL, so validateNcclEnvironment accepts only
// 0 for it. NCCL allows ncclCommAbort on a communicator whose call is still in progress; only
// ncclCommDestroy and ncclCommAbort themselves always block.

#include <algorithm>
#include <chrono>
#include <thread>

#include "nccl_compat.h"

namespace dtrain::comm {

struct NcclProgress {
  ncclResult_t result = ncclSuccess;  // the call's outcome: ncclInProgress when it did not end
  bool timedOut = false;              // the deadline passed with the call in progress
  bool stopped = false;               // stop() said so with the call in progress
};

// The real API: NCCL's state of the communicator, the steady clock, a sleep.
struct NcclProgressApi {
  using Clock = std::chrono::steady_clock;
  static ncclResult_t state(ncclComm_t comm, ncclResult_t* result) {
    return ncclCommGetAsyncError(comm, result);
  }
  static Clock::time_point now() { return Clock::now(); }
  static void sleep(std::chrono::microseconds d) { std::this_thread::sleep_for(d); }
};

// Polls `comm` while `result` (what the call returned) is ncclInProgress, first every 10 us and
// backing off to 1 ms, until it ends, `stop()` is true, or `deadline` passes.
template <typename Api = NcclProgressApi, typename Stop>
NcclProgress awaitNccl(ncclComm_t comm, ncclResult_t result,
                       typename Api::Clock::time_point deadline, Stop stop) {
  std::chrono::microseconds pause(10);
  while (result == ncclInProgress) {
    if (stop()) return NcclProgress{result, false, true};
    if (Api::now() >= deadline) return NcclProgress{result, true, false};
    Api::sleep(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
    ncclResult_t state = ncclSuccess;
    const ncclResult_t asked = Api::state(comm, &state);
    result = asked != ncclSuccess ? asked : state;
  }
  return NcclProgress{result, false, false};
}

}  // namespace dtrain::comm
