#include "collective_faults.h"

#include <cstdlib>

namespace dtrain::comm {

namespace {

// The innermost ScopedCollectiveFaults alive on this thread, or nullptr.
thread_local const ScopedCollectiveFaults* tCurrent = nullptr;

}  // namespace

ScopedCollectiveFaults::ScopedCollectiveFaults(std::vector<fault::Fault> faults)
    : faults_(std::move(faults)), outer_(tCurrent) {
  tCurrent = this;
}

ScopedCollectiveFaults::~ScopedCollectiveFaults() { tCurrent = outer_; }

CollectiveFaults CollectiveFaults::forThisThread(int rank) {
  return CollectiveFaults(rank, tCurrent != nullptr ? tCurrent->faults_ : fault::activeFaults());
}

CollectiveFaults::CollectiveFaults(int rank, std::vector<fault::Fault> faults)
    : rank_(rank), faults_(std::move(faults)) {
  if (const char* restart = std::getenv("DTRAIN_RESTART_COUNT")) attempt_ = std::atoi(restart);
}

const fault::Fault* CollectiveFaults::at(fault::Kind kind, uint64_t seq) const {
  for (const auto& f : faults_) {
    if (f.kind == kind && f.matches(rank_, static_cast<int64_t>(seq), attempt_)) return &f;
  }
  return nullptr;
}

}  // namespace dtrain::comm
