#pragma once
// What DistributedDataParallel did in its last synchronised backward: when each bucket's allreduce
// was launched relative to the gradients, and how long the end of backward waited for them. Cheap
// (a few timestamps per bucket); read by tests (is overlap real?) and by benchmarks (how much
// communication is exposed?).

#include <chrono>
#include <cstdint>
#include <vector>

namespace dtrain {

struct DdpIterationStats {
  using Clock = std::chrono::steady_clock;

  // Synchronised backward passes so far (noSync() ones not counted).
  uint64_t iteration = 0;
  Clock::time_point firstGradient;  // the first parameter's gradient was accumulated
  Clock::time_point lastGradient;   // the last one's
  Clock::time_point backwardEnd;    // the autograd engine ran DDP's end-of-backward callback
  Clock::time_point finished;       // gradients averaged and written back
  // Per bucket, in launch order: when its allreduce was issued.
  std::vector<Clock::time_point> bucketLaunched;
  // Time the end-of-backward callback blocked on allreduces: the exposed communication.
  std::chrono::nanoseconds waited{0};
};

}  // namespace dtrain
