#pragma once
// After a collective fails, the ranks compare notes through the store: each one that can posts
// where it is (its current collective and sequence number, and its own error), waits a short
// grace for the others, and the error it throws then says who is behind, who is ahead, who
// disagrees about the collective and who never answered (frozen or dead). This is how a skipped
// collective (desync) or a mismatched shape shows up as "rank 1 is behind at seq 41" instead of a
// bare timeout. Torch-free; used by every backend.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/base/store.h"
#include "dtrain/comm/communicator.h"

namespace dtrain::comm {

struct RankReport {
  int rank = -1;
  bool reported = false;   // false: nothing arrived within the grace
  uint64_t seq = 0;        // the collective it was in when it failed
  std::string collective;  // CollectiveInfo::describe() of that collective
  std::string error;       // its own error, one line
};

// Posts `mine` under "<prefix>/<rank>" and collects the other ranks' reports, waiting at most
// `grace` in total, and no longer once `stop` (when given) says so: a communicator aborted for a
// lost node does not wait for notes the lost ranks will never post. Store errors (the store host
// died) leave the missing ranks unreported.
std::vector<RankReport> exchangeReports(store::Store& store, const std::string& prefix, int size,
                                        const RankReport& mine, Millis grace,
                                        const std::function<bool()>& stop = nullptr);

// Pure: one paragraph comparing `mine` with every other report, e.g.
// "rank 1 is behind at seq 41 (allreduce(float32 x 1024, sum)); rank 2 did not report within
// 1000 ms (frozen, dead or not inside a collective)".
std::string summarizeReports(const std::vector<RankReport>& reports, const RankReport& mine,
                             Millis grace);

// The grace for a collective timeout: long enough for peers that fail a moment later to answer,
// short enough to stay within timeout + 2 s overall.
Millis reportGrace(Millis collectiveTimeout);

// The default deadline of Work::wait() (a zero timeout, Note [Zero timeouts]) for a collective
// with this timeout, counted from when it starts: the timeout, the report's grace, and a second
// for the failing rank to write its report. A collective fails by itself within this, so a wait
// that reaches it means the backend is stuck past its own deadline.
Millis defaultWaitBudget(Millis collectiveTimeout);

}  // namespace dtrain::comm
