#pragma once
// FlightRecorder: a small ring buffer of this rank's most recent collectives and what became of
// them (queued, running, done, failed, skipped). Cheap enough to be always on; read when a
// collective fails, so the error can say where this rank was and the failure report can compare
// ranks ("rank 1 is behind at seq 41").

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "collective.h"
#include "dtrain/base/progress.h"

namespace dtrain::comm {

class FlightRecorder {
 public:
  enum class State : uint8_t { Queued, Running, Done, Failed, Skipped };
  static constexpr size_t kDefaultCapacity = 32;

  explicit FlightRecorder(size_t capacity = kDefaultCapacity);

  void recordQueued(const CollectiveInfo& info);
  void setState(uint64_t seq, State state);

  struct Entry {
    CollectiveInfo info;
    State state = State::Queued;
    std::chrono::steady_clock::time_point queuedAt;
    std::chrono::steady_clock::time_point changedAt;
  };
  // Oldest first; at most `capacity` entries.
  std::vector<Entry> snapshot() const;
  // "seq 40 allreduce(float32 x 1024, sum) done 1.2 ms; seq 41 ... running 3001.0 ms" — the last
  // `last` entries.
  std::string dump(size_t last = 8) const;

  static const char* stateName(State state);

  // What the progress publisher reports for a communicator `name` that has issued `issued`
  // collectives: the last `last` entries, durations measured up to now for open ones.
  progress::CollectiveState progressState(const std::string& name, uint64_t issued,
                                          size_t last = 8) const;

 private:
  mutable std::mutex mutex_;
  std::vector<Entry> ring_;  // guarded by mutex_
  size_t next_ = 0;          // guarded by mutex_: where the next entry goes
  size_t size_ = 0;          // guarded by mutex_
};

}  // namespace dtrain::comm
