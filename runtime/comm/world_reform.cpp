// Re-forming a World among the survivors of a lost node (Note [Membership epochs] in
// runtime/base/membership.h; docs/design.md, "Node loss").
#include "world_reform.h"

#include <cstdlib>

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "dtrain/base/job_store.h"
#include "dtrain/base/logging.h"
#include "dtrain/comm/nccl_communicator.h"
#include "env_contract.h"
#include "host_buffer_pool.h"
#include "parse_int.h"

namespace dtrain::comm {

void watchMembership(World& w, const WorldOptions& options, const std::string& backend,
                     const std::string& nodeKey, int cudaDevices) {
  const char* mode = std::getenv(env::kOnNodeLoss);
  const bool underLaunch = w.env.jobStore && !options.store;
  if (underLaunch ? mode == nullptr || std::string(mode) != "continue"
                  : !options.reformOnNodeLoss) {
    return;
  }
  if (!underLaunch && !options.store) {
    DTRAIN_LOG(Warn, "reformOnNodeLoss needs the launcher's store or an explicit one; this world "
                     "does not re-form");
    return;
  }
  auto r = std::make_shared<WorldReform>();
  r->options = options;
  r->options.store = nullptr;
  const char* node = std::getenv(env::kNodeId);
  r->nodeId = !options.nodeId.empty() ? options.nodeId : node != nullptr ? node : "0";
  r->nodeKey = nodeKey;
  r->backend = backend;
  r->cudaDevices = cudaDevices;
  if (const char* wait = std::getenv(env::kNodeLossWait)) {
    int64_t seconds = 0;
    DTRAIN_CHECK_ARG(parseInt64(wait, &seconds) && seconds > 0,
                     "{}=\"{}\" is not a positive number of seconds. HINT: `launch` sets it",
                     env::kNodeLossWait, wait);
    r->wait = std::chrono::seconds(seconds);
  }
  if (const char* wait = std::getenv(env::kJoinWait)) {
    int64_t seconds = 0;
    DTRAIN_CHECK_ARG(parseInt64(wait, &seconds) && seconds >= 0,
                     "{}=\"{}\" is not a number of seconds (0 or more): how long a step in "
                     "flight may run on once a joining node is ready",
                     env::kJoinWait, wait);
    r->joinWait = std::chrono::seconds(seconds);
  }
  {
    std::lock_guard<std::mutex> g(r->target->mutex);
    r->target->current = w.communicator;
    r->target->epoch = w.epoch;  // a worker that joined a running round starts past epoch 0
  }
  // Its own connection: the watcher's waits must never hold up the training thread's requests.
  // An explicit store (in-process, tests) serves both.
  std::shared_ptr<store::Store> own = w.store;
  if (underLaunch) {
    store::JobStoreOptions jo;
    jo.connectTimeout = options.connectTimeout;
    own = store::connectToJobStore(jo);
  }
  r->watcher = std::make_unique<MembershipWatcher>(
      std::move(own), [target = r->target, joinWait = r->joinWait](const membership::Epoch& e) {
        std::shared_ptr<Communicator> c;
        {
          std::unique_lock<std::mutex> g(target->mutex);
          if (e.epoch <= target->epoch) return;
          if (e.joining > 0 && target->boundaries && joinWait.count() > 0) {
            // Note [Joins at step boundaries]: the step in flight runs on; the next boundary
            // re-forms. The master writes no newer epoch while this one re-forms.
            target->joinReady = e.epoch;
            if (target->formed.wait_for(g, joinWait, [&] { return target->epoch >= e.epoch; })) {
              return;
            }
            DTRAIN_LOG(Warn,
                       "membership epoch {} takes nodes in, and no step boundary came within {} "
                       "s ({}): the step in flight is cut short for the join",
                       e.epoch, std::chrono::duration_cast<std::chrono::seconds>(joinWait).count(),
                       env::kJoinWait);
          }
          c = target->current.lock();
        }
        // The program's subgroups of this world too: they hold its ranks, a lost one among them.
        if (c) c->abortWithGroups(fmt::format("epoch {}: {}", e.epoch, e.why));
      });
  w.reform = std::move(r);
}

std::string worldPrefix(const std::string& name, int epoch) {
  return epoch > 0 ? fmt::format("pg/{}/{}", name, membership::epochPrefix(epoch)) : "pg/" + name;
}

bool reformsOnNodeLoss(const World& world) { return world.reform != nullptr; }

// Note [Joins at step boundaries]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A join costs the members no step. Once every newcomer is ready (Note [Admission when ready]),
// a member's watcher no longer aborts its step in flight, as it does for a loss: the step runs
// to its end and is applied, and the member re-forms with the newcomers at its next step
// boundary -- the start of its next TrainingState::tryStep, before any work -- then settles and
// hands them the state (ZeRO: its own blocks of that very step re-sharded, no mirror rolled back
// to). That holds once the program has shown it has boundaries (its first tryStep: a program that
// re-forms on its own, from failed collectives, is aborted as before).
//
// The members need not agree on the boundary beforehand. A member that reaches it has completed
// every collective of the step before, so every other member has at least entered each of them
// and will reach the same boundary -- unless its watcher saw the epoch a moment later, after it
// had begun the next step. Such a rank blocks in that step's first collective with a member that
// never comes; the members that re-form abort their old communicators (reformWorld), which
// closes their connections (Gloo) and marks their node's segment (shared memory), so its
// collective fails at once, its step is discarded (no member applied it) and it re-forms too.
// (NCCL: an abort does not end the peers' kernels; such a rank waits out DTRAIN_JOIN_WAIT.)
// Every member then stands at the same step, as the settling finds. Should a rank reach no
// boundary for DTRAIN_JOIN_WAIT seconds (20 by default: a step longer than that, a program
// stopped between steps), its watcher aborts the step in flight as for a loss, well inside the
// master's deadline for the re-form (--heartbeat-timeout + 30 s). The members that end their
// last step while a join is ready never re-form: the master stops the newcomers once every
// member has reported (Note [Joining a running round] in launcher/cluster/master/node_loss.h).
bool stepBoundary(World& w) {
  if (!w.reform || w.closed || w.awaitingAdmission) return false;
  WorldReform::Target& t = *w.reform->target;
  std::lock_guard<std::mutex> g(t.mutex);
  t.boundaries = true;
  return t.joinReady > t.epoch;
}

bool joinReady(const World& w) {
  if (!w.reform || w.closed) return false;
  WorldReform::Target& t = *w.reform->target;
  std::lock_guard<std::mutex> g(t.mutex);
  return t.joinReady > t.epoch;
}

namespace {

// Note [Admission when ready]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A worker started in a running round (DTRAIN_JOIN_EPOCH=E: `launch --on-node-join live`) must
// not hold the members up while it starts: its process, libtorch, its model, its data and -- on
// a GPU -- its CUDA context take seconds to minutes, which the members would wait out idle in the
// new epoch's rendezvous. So connectWorld gives it a communicator that connects nothing
// (PendingCommunicator: its rank and world size as planned, allocate()'s memory where the
// backend's would be, every collective refused in one message), and its first
// TrainingState::tryStep admits it (admitWorld): it adds 1 to epoch E's ready counter, waits until
// every joining rank has, then builds its communicator of epoch E, which completes once the
// members have left theirs and joined it. The members' watchers report epoch E only when every
// joining rank is ready (Note [Membership epochs] in runtime/base/membership.h): until then they
// train on, and then they finish their step in flight and re-form at its end (Note [Joins at step
// boundaries]), so they wait out the re-form only.
// A join the master called off before that (a node lost meanwhile: its ready counter below 0)
// never takes effect; the rank then waits for the epoch that takes it in again -- after the
// survivors' re-form, its rank and world size moved -- and counts itself ready there
// (awaitAdmission). Its PendingCommunicator's rank and size are the first plan's until then.
class PendingCommunicator final : public Communicator {
 public:
  PendingCommunicator(int rank, int size, const BackendEntry& entry, int device)
      : rank_(rank), size_(size), backend_(entry.name), device_(entry.cuda ? device : -1) {
    if (device_ < 0) pool_ = HostBufferPool::create();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backendName() const override { return backend_; }
  std::shared_ptr<Work> allreduceAsync(void*, size_t, DataType, ReduceOp,
                                       const CallOptions&) override {
    refuse("allreduce");
  }
  std::shared_ptr<Work> broadcastAsync(void*, size_t, DataType, int, const CallOptions&) override {
    refuse("broadcast");
  }
  std::shared_ptr<Work> allgatherAsync(const void*, void*, size_t, DataType,
                                       const CallOptions&) override {
    refuse("allgather");
  }
  std::shared_ptr<Work> reduceScatterAsync(const void*, void*, size_t, DataType, ReduceOp,
                                           const CallOptions&) override {
    refuse("reduce-scatter");
  }
  std::shared_ptr<Work> barrierAsync(const CallOptions&) override { refuse("barrier"); }
  std::shared_ptr<Communicator> createGroup(const GroupSpec&) override { refuse("a subgroup"); }
  // What is built before the first step over this memory (a ShardedOptimizer's units) is built
  // again over the real communicator's at that step.
  std::shared_ptr<Buffer> allocate(size_t bytes) override {
    return pool_ ? pool_->allocate(bytes) : allocateCudaBuffer(device_, bytes);
  }
  void shutdown() override {}
  void abort(const std::string&) override {}

 private:
  [[noreturn]] void refuse(const char* what) const {
    DTRAIN_THROW(InvalidArgument,
                 "{} on rank {}/{} before its first step: this rank was taken into a running "
                 "round (launch --on-node-join live) and has no communicator until its first "
                 "TrainingState::tryStep admits it among the members. HINT: make no collective "
                 "before the first tryStep (DistributedDataParallel, ShardedOptimizer and "
                 "Checkpointer wait for it on their own; TrainingState::tryCollective returns "
                 "false)",
                 what, rank_, size_);
  }

  int rank_;
  int size_;
  const char* backend_;
  int device_;
  std::shared_ptr<HostBufferPool> pool_;
};

// Builds `w`'s communicator of membership epoch `epoch` as rank `rank` of `worldSize`, under the
// epoch's prefix, and counts it formed. Collective over the epoch's members.
void formEpoch(World& w, int epoch, int rank, int worldSize) {
  WorldReform& r = *w.reform;
  const BackendEntry* entry = nullptr;
  for (const auto& b : backendTable()) {
    if (r.backend == b.name) entry = &b;
  }
  DTRAIN_CHECK(entry != nullptr, "backend {} vanished from the table", r.backend);
  WorldEnv env = w.env;
  env.rank = rank;
  env.worldSize = worldSize;
  BackendSetup setup{r.options, env,           w.store,  worldPrefix(r.options.name, epoch),
                     w.device,  r.cudaDevices, r.nodeKey};
  std::shared_ptr<Communicator> c = entry->create(setup);
  w.communicator = c;
  w.backend = c->backendName();
  w.env = env;
  w.epoch = epoch;
  {
    std::lock_guard<std::mutex> g(r.target->mutex);
    r.target->current = c;
    r.target->epoch = epoch;
  }
  r.target->formed.notify_all();
  // An epoch newer than this one may have come while the communicator was built.
  if (auto newer = r.watcher->latest(); newer && newer->epoch > epoch) {
    c->abort(fmt::format("epoch {}: {}", newer->epoch, newer->why));
  }
  w.store->add(membership::formedKey(epoch), 1);
  log::setTag(fmt::format("[dtrain rank {}]", rank));
}

}  // namespace

std::shared_ptr<Communicator> pendingCommunicator(const BackendEntry& entry,
                                                  const BackendSetup& setup) {
  return std::make_shared<PendingCommunicator>(setup.env.rank, setup.env.worldSize, entry,
                                               setup.device);
}

namespace {

// Note [Admission when ready]: `w`'s place in the newest epoch that takes it in. Reads the
// round's epoch and ready keys until this rank's join can take effect -- every joining rank
// counted in the epoch the rank is in -- and returns that epoch; counts the rank ready once per
// epoch. A join the master cancelled (its counter below 0) is followed to the epoch that takes
// the rank in again, its rank and world size as that epoch numbers them. TimeoutError when
// nothing moves for the connect timeout: the launcher neither took the rank in nor stopped it.
membership::Epoch awaitAdmission(World& w) {
  WorldReform& r = *w.reform;
  store::Store& store = *w.store;
  const Millis bound = r.options.connectTimeout > Millis(0) ? r.options.connectTimeout
                                                            : kDefaultConnectTimeout;
  int counted = -1;  // the epoch whose ready counter has this rank
  for (;;) {
    const auto values = store.tryMultiGet({membership::epochKey(), membership::readyKey(w.epoch)});
    // What to wait for a change of next: the epoch key, or this epoch's ready counter.
    std::string watched = membership::epochKey();
    store::Bytes seen = values[0] ? *values[0] : store::Bytes{};
    if (!values[0] && counted < 0) {
      // No epoch written: no launcher decides (a program given a store of its own). Counted and
      // formed at once, as the epoch this rank was started in.
      store.add(membership::readyKey(w.epoch), 1);
      membership::Epoch e;
      e.epoch = w.epoch;
      e.worldSize = w.env.worldSize;
      return e;
    }
    if (values[0]) {
      const membership::Epoch e = membership::decodeEpoch(store::toString(*values[0]));
      const int rank = e.rankOf(r.nodeId, w.env.localRank);
      if (e.epoch > w.epoch && e.joining > 0 && rank >= e.worldSize - e.joining) {
        DTRAIN_LOG(Warn,
                   "membership epoch {} did not take effect: taken in again in epoch {} ({}) as "
                   "rank {}/{}",
                   w.epoch, e.epoch, e.why, rank, e.worldSize);
        w.epoch = e.epoch;
        w.env.rank = rank;
        w.env.worldSize = e.worldSize;
        continue;
      }
      int64_t count = 0;
      const bool read = values[1] && parseInt64(store::toString(*values[1]), &count);
      // Else an older epoch, a newer one that does not take this rank in (the survivors of a
      // loss re-form first), or this one cancelled: the master writes the next.
      if (e.epoch == w.epoch && !(read && count < 0)) {
        if (counted != w.epoch) {
          // The members leave their step once every joining rank counted.
          count = store.add(membership::readyKey(w.epoch), 1);
          counted = w.epoch;
          if (count >= e.joining) return e;
          continue;  // read the counter again: the master may have cancelled it meanwhile
        }
        if (read && count >= e.joining) return e;
        watched = membership::readyKey(w.epoch);
        seen = values[1] ? *values[1] : store::Bytes{};
      }
    }
    try {
      store.waitChanged(watched, seen, bound);
    } catch (const TimeoutError&) {
      DTRAIN_THROW(TimeoutError,
                   "rank {} (node {}, local rank {}) was taken into a running round in membership "
                   "epoch {} but nothing moved for {} s: the launcher neither took it in (epoch "
                   "key {}) nor stopped it",
                   w.env.rank, r.nodeId, w.env.localRank, w.epoch,
                   std::chrono::duration_cast<std::chrono::seconds>(bound).count(),
                   membership::epochKey());
    }
  }
}

}  // namespace

void admitWorld(World& w) {
  if (!w.awaitingAdmission || w.closed) return;
  DTRAIN_CHECK(w.reform != nullptr, "a rank taken into a running round needs the membership watch");
  const auto start = std::chrono::steady_clock::now();
  const membership::Epoch e = awaitAdmission(w);
  formEpoch(w, e.epoch, w.env.rank, w.env.worldSize);
  w.awaitingAdmission = false;
  DTRAIN_LOG(
      Warn, "admitted to membership epoch {}: rank {}/{}, {:.0f} ms after it was ready", w.epoch,
      w.env.rank, w.env.worldSize,
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
}

bool reformWorld(World& w) {
  if (!w.reform || w.closed) return false;
  WorldReform& r = *w.reform;
  if (!r.watcher->awaitAfter(w.epoch, r.wait)) return false;
  // The newest: two losses decided before this rank looked are one re-form.
  const membership::Epoch e = *r.watcher->latest();
  if (w.communicator) {
    w.communicator->abortWithGroups(fmt::format("epoch {}: {}", e.epoch, e.why));
    w.communicator->shutdown();
  }
  const int rank = e.rankOf(r.nodeId, w.env.localRank);
  if (rank < 0) {
    DTRAIN_THROW(MembershipChanged,
                 "rank {} (node {}, local rank {}) is not a member of membership epoch {} ({}): "
                 "the launcher went on without this node",
                 w.env.rank, r.nodeId, w.env.localRank, e.epoch, e.why);
  }
  const auto start = std::chrono::steady_clock::now();
  const int oldRank = w.env.rank;
  const int oldSize = w.env.worldSize;
  formEpoch(w, e.epoch, rank, e.worldSize);
  DTRAIN_LOG(
      Warn, "re-formed in membership epoch {} ({}): rank {}/{} was {}/{}, in {:.0f} ms", e.epoch,
      e.why, rank, e.worldSize, oldRank, oldSize,
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  return true;
}

}  // namespace dtrain::comm
