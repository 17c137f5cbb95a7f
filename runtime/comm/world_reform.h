#pragma once
// What a World needs to re-form after a lost node (dtrain/comm/world.h, reformWorld): how it was
// built, and the watch on the round's membership epochs. Internal to dtrain_comm.

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "dtrain/comm/world.h"
#include "membership_watcher.h"

namespace dtrain::comm {

class WorldReform {
 public:
  // The communicator a new epoch aborts: the world's current one.
  struct Target {
    std::mutex mutex;
    std::condition_variable formed;       // notified when `epoch` moves
    std::weak_ptr<Communicator> current;  // guarded by mutex
    int epoch = 0;                        // guarded by mutex: current's epoch
    // Note [Joins at step boundaries]: the program marks its step boundaries (stepBoundary);
    // the newest epoch that takes nodes in and is ready, 0 before any.
    bool boundaries = false;  // guarded by mutex
    int joinReady = 0;        // guarded by mutex
  };

  WorldOptions options;  // as connectWorld() was given them (the store left out)
  std::string nodeId;    // DTRAIN_NODE_ID: this worker's node in the epochs
  std::string nodeKey;   // the shared-memory node key (BackendSetup::node)
  std::string backend;   // the backend table's entry that built the world
  int cudaDevices = 0;
  std::chrono::milliseconds wait{35000};      // DTRAIN_NODE_LOSS_WAIT
  std::chrono::milliseconds joinWait{20000};  // DTRAIN_JOIN_WAIT
  std::shared_ptr<Target> target = std::make_shared<Target>();
  std::unique_ptr<MembershipWatcher> watcher;
};

// The store prefix of world `name`'s communicator in membership epoch `epoch`: "pg/<name>" at
// epoch 0 (the plan), "pg/<name>/epoch<E>" after (Note [Membership epochs]).
std::string worldPrefix(const std::string& name, int epoch);

// Sets world.reform up when the environment asks for it (DTRAIN_ON_NODE_LOSS=continue under
// launch): a store connection of its own for the watcher, which aborts the current communicator
// when a newer epoch comes. `backend`: the table's entry name, `nodeKey`: BackendSetup::node.
void watchMembership(World& world, const WorldOptions& options, const std::string& backend,
                     const std::string& nodeKey, int cudaDevices);

// The communicator of a rank taken into a running round until admitWorld() (Note [Admission when
// ready] in world_reform.cpp): `setup`'s rank and world size, memory from allocate() as `entry`'s
// backend gives it, every collective refused.
std::shared_ptr<Communicator> pendingCommunicator(const BackendEntry& entry,
                                                  const BackendSetup& setup);

}  // namespace dtrain::comm
