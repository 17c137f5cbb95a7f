#pragma once
// ProcessGroups for the torch tests that run ranks as threads: one per rank of a ThreadWorld (the
// fake communicator), or over real Gloo communicators (makeGlooWorld), both from
// thread_communicator_support.h.

#include <exception>
#include <functional>
#include <memory>
#include <thread>
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

// Runs fn(rank, group) on a thread per rank over glooGroups(n) with collective timeout
// `timeout`, and rethrows the first rank's exception once every thread has ended.
inline void runOnGlooGroups(
    int n, comm::Millis timeout,
    const std::function<void(int, const std::shared_ptr<ProcessGroup>&)>& fn) {
  const auto groups = glooGroups(n, [&](comm::GlooOptions& o) { o.timeout = timeout; });
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        fn(rank, groups[static_cast<size_t>(rank)]);
      } catch (...) {
        errors[static_cast<size_t>(rank)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace dtrain::testing
