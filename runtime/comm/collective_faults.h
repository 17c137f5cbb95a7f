#pragma once
// The collective-level faults of DTRAIN_FAULT (skip-collective, wrong-shape, hang), as every CPU
// backend applies them: `step` counts this communicator's collectives, `attempt` is
// DTRAIN_RESTART_COUNT. What wrong-shape makes of a collective: wrongShape() (collective.h).

#include <cstdint>
#include <vector>

#include "collective.h"
#include "dtrain/base/fault.h"

namespace dtrain::comm {

class CollectiveFaults {
 public:
  CollectiveFaults() = default;
  // `faults` empty and `fromEnv`: DTRAIN_FAULT's.
  CollectiveFaults(int rank, std::vector<fault::Fault> faults, bool fromEnv);

  // The first fault of `kind` for collective `seq` on this rank, or nullptr.
  const fault::Fault* at(fault::Kind kind, uint64_t seq) const;
  bool empty() const { return faults_.empty(); }

 private:
  int rank_ = 0;
  int attempt_ = 0;
  std::vector<fault::Fault> faults_;
};

}  // namespace dtrain::comm
