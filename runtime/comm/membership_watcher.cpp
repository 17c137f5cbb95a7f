#include "membership_watcher.h"

#include <thread>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "parse_int.h"

namespace dtrain::comm {

namespace {

// Until `epoch`'s ready counter reaches its joining ranks (true), a value of the epoch key other
// than `seen` is written (false: the caller reads it), or `stopped()` (false).
template <typename Stopped>
bool awaitReady(store::Store& store, const membership::Epoch& epoch, const store::Bytes& seen,
                const Stopped& stopped) {
  const std::string key = membership::readyKey(epoch.epoch);
  while (!stopped()) {
    try {
      const auto values = store.tryMultiGet({key, membership::epochKey()});
      if (values[1] && *values[1] != seen) return false;
      int64_t count = 0;
      const bool read = values[0] && parseInt64(store::toString(*values[0]), &count);
      if (read && count >= epoch.joining) return true;
      if (read && count < 0) {
        // Cancelled (Note [Membership epochs]): it never takes effect; the master writes a newer.
        store.waitChanged(membership::epochKey(), seen, MembershipWatcher::kWaitSlice);
        continue;
      }
      store.waitChanged(key, values[0] ? *values[0] : store::Bytes{},
                        MembershipWatcher::kWaitSlice);
    } catch (const TimeoutError&) {
    } catch (const std::exception& e) {
      DTRAIN_LOG(Warn, "membership watch: epoch {}'s ready counter: {}", epoch.epoch, e.what());
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }
  return false;
}

}  // namespace

MembershipWatcher::MembershipWatcher(std::shared_ptr<store::Store> store,
                                     std::function<void(const membership::Epoch&)> onEpoch)
    : shared_(std::make_shared<Shared>()) {
  // The thread owns what it uses (the store connection, the shared state): the watcher may go
  // while it waits, and it is detached so that a process ending never waits a slice for it.
  std::thread([shared = shared_, store = std::move(store), onEpoch = std::move(onEpoch)] {
    auto stopped = [&shared] {
      std::lock_guard<std::mutex> g(shared->mutex);
      return shared->stop;
    };
    store::Bytes seen;
    int failures = 0;
    while (!stopped()) {
      store::Bytes now;
      try {
        now = store->waitChanged(membership::epochKey(), seen, kWaitSlice);
        failures = 0;
      } catch (const TimeoutError&) {
        continue;
      } catch (const std::exception& e) {
        // The store is gone or refuses: the agent ends this worker when it loses the store too
        // (--heartbeat-timeout); until then keep looking, a second at a time.
        if (failures++ == 0 && !stopped()) {
          DTRAIN_LOG(Warn, "membership watch: {}", e.what());
        }
        std::this_thread::sleep_for(std::chrono::seconds(1));
        continue;
      }
      seen = now;
      membership::Epoch epoch;
      try {
        epoch = membership::decodeEpoch(store::toString(now));
      } catch (const std::exception& e) {
        DTRAIN_LOG(Error, "membership watch: {}", e.what());
        continue;
      }
      {
        std::lock_guard<std::mutex> g(shared->mutex);
        if (shared->stop) return;
        if (shared->latest && shared->latest->epoch >= epoch.epoch) continue;
      }
      // Note [Membership epochs]: a join takes effect once its newcomers are ready; a newer
      // epoch written meanwhile is read instead.
      if (epoch.joining > 0 && !awaitReady(*store, epoch, seen, stopped)) continue;
      {
        std::lock_guard<std::mutex> g(shared->mutex);
        if (shared->stop) return;
        shared->latest = epoch;
      }
      shared->changed.notify_all();
      DTRAIN_LOG(Warn, "membership epoch {}: {} ranks on {} nodes ({})", epoch.epoch,
                 epoch.worldSize, epoch.nodes.size(), epoch.why);
      if (onEpoch) onEpoch(epoch);
    }
  }).detach();
}

MembershipWatcher::~MembershipWatcher() {
  std::lock_guard<std::mutex> g(shared_->mutex);
  shared_->stop = true;
}

std::optional<membership::Epoch> MembershipWatcher::latest() const {
  std::lock_guard<std::mutex> g(shared_->mutex);
  return shared_->latest;
}

std::optional<membership::Epoch> MembershipWatcher::awaitAfter(
    int after, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> g(shared_->mutex);
  shared_->changed.wait_for(g, timeout,
                            [&] { return shared_->latest && shared_->latest->epoch > after; });
  if (shared_->latest && shared_->latest->epoch > after) return shared_->latest;
  return std::nullopt;
}

}  // namespace dtrain::comm
