#pragma once
// A worker's watch on the launcher's membership epochs (Note [Membership epochs] in
// runtime/base/membership.h): one thread blocked in waitChanged on the round's epoch key, on a
// store connection of its own, so the master's decision reaches the worker within one store
// round trip and the training thread is pulled out of a collective at once (onEpoch aborts the
// communicators), not when the collective times out. Internal to dtrain_comm's world.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "dtrain/base/store.h"
#include "membership.h"

namespace dtrain::comm {

class MembershipWatcher {
 public:
  // `store`: the round's view, a connection nobody else waits on. `onEpoch` runs on the
  // watcher's thread for every epoch newer than the last (it must not block for long).
  MembershipWatcher(std::shared_ptr<store::Store> store,
                    std::function<void(const membership::Epoch&)> onEpoch);
  // Stops watching. The thread ends at its next wake-up (at most kWaitSlice) on its own: a
  // process that ends does not wait for it.
  ~MembershipWatcher();
  MembershipWatcher(const MembershipWatcher&) = delete;
  MembershipWatcher& operator=(const MembershipWatcher&) = delete;

  // The newest epoch known, nullopt before the first the master wrote (epoch 0 is the plan).
  std::optional<membership::Epoch> latest() const;
  // Blocks until an epoch newer than `after` is known, at most `timeout`: nullopt when none came.
  std::optional<membership::Epoch> awaitAfter(int after, std::chrono::milliseconds timeout) const;

  // How long one wait on the store lasts: a request per watcher per slice while nothing happens.
  static constexpr std::chrono::milliseconds kWaitSlice{2000};

 private:
  struct Shared {
    mutable std::mutex mutex;
    mutable std::condition_variable changed;
    std::optional<membership::Epoch> latest;  // guarded by mutex
    bool stop = false;                        // guarded by mutex
  };
  std::shared_ptr<Shared> shared_;
};

}  // namespace dtrain::comm
