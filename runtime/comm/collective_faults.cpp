#include "collective_faults.h"

#include <cstdlib>

namespace dtrain::comm {

CollectiveFaults::CollectiveFaults(int rank, std::vector<fault::Fault> faults, bool fromEnv)
    : rank_(rank), faults_(std::move(faults)) {
  if (fromEnv && faults_.empty()) faults_ = fault::activeFaults();
  if (const char* restart = std::getenv("DTRAIN_RESTART_COUNT")) attempt_ = std::atoi(restart);
}

const fault::Fault* CollectiveFaults::at(fault::Kind kind, uint64_t seq) const {
  for (const auto& f : faults_) {
    if (f.kind == kind && f.matches(rank_, static_cast<int64_t>(seq), attempt_)) return &f;
  }
  return nullptr;
}

}  // namespace dtrain::comm
