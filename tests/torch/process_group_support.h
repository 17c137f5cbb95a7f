#pragma once
// ProcessGroups for the torch tests that run ranks as threads: one per rank of a ThreadWorld (the
// fake communicator), or over real Gloo communicators (makeGlooWorld), both from
// thread_communicator_support.h.

#include <functional>
#include <memory>
#include <vector>

#include "dtrain/comm/gloo_communicator.h"
#include "dtrain/torch/process_group.h"
#include "thread_communicator_support.h"

namespace dtrain::testing {

inline std::shared_ptr<ProcessGroup> threadGroup(ThreadWorld& world, int rank) {
  return std::make_shared<ProcessGroup>(world.communicator(rank), rank, c10::Device(c10::kCPU));
}

// A CPU ProcessGroup per rank over Gloo (glooTestOptions, then `tweak`), created concurrently.
inline std::vector<std::shared_ptr<ProcessGroup>> glooGroups(
    int n, const std::function<void(comm::GlooOptions&)>& tweak = {}) {
  std::vector<std::shared_ptr<ProcessGroup>> groups;
  int rank = 0;
  for (auto& communicator : makeGlooWorld(n, tweak)) {
    groups.push_back(std::make_shared<ProcessGroup>(std::move(communicator), rank++, c10::kCPU));
  }
  return groups;
}

}  // namespace dtrain::testing
