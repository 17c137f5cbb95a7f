#pragma once
// The collective-level faults of DTRAIN_FAULT (skip-collective, wrong-shape, hang, and NCCL's
// slow), as every backend applies them: `step` counts this communicator's collectives, `attempt`
// is DTRAIN_RESTART_COUNT. What wrong-shape makes of a collective: wrongShape() (collective.h).
//
// Faults are a test seam, not an option: a communicator takes DTRAIN_FAULT's, unless the thread
// that constructs it holds a ScopedCollectiveFaults (tests, and a communicator's own subgroups,
// which take none: faults count the world's collectives).

#include <cstdint>
#include <vector>

#include "collective.h"
#include "fault.h"

namespace dtrain::comm {

class CollectiveFaults {
 public:
  CollectiveFaults() = default;
  // The faults of a communicator of `rank` constructed now on this thread: the innermost
  // ScopedCollectiveFaults' when one is alive, else DTRAIN_FAULT's.
  static CollectiveFaults forThisThread(int rank);

  // The first fault of `kind` for collective `seq` on this rank, or nullptr.
  const fault::Fault* at(fault::Kind kind, uint64_t seq) const;
  bool empty() const { return faults_.empty(); }

 private:
  CollectiveFaults(int rank, std::vector<fault::Fault> faults);

  int rank_ = 0;
  int attempt_ = 0;
  std::vector<fault::Fault> faults_;
};

// While it lives, every communicator this thread constructs injects `faults` (empty: none) instead
// of DTRAIN_FAULT's. Nests: the innermost one counts. Tests that run ranks as threads hold one on
// each rank's thread.
class ScopedCollectiveFaults {
 public:
  explicit ScopedCollectiveFaults(std::vector<fault::Fault> faults);
  ~ScopedCollectiveFaults();
  ScopedCollectiveFaults(const ScopedCollectiveFaults&) = delete;
  ScopedCollectiveFaults& operator=(const ScopedCollectiveFaults&) = delete;

 private:
  friend class CollectiveFaults;
  std::vector<fault::Fault> faults_;
  const ScopedCollectiveFaults* outer_;
};

}  // namespace dtrain::comm
