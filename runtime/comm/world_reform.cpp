// Re-forming a World among the survivors of a lost node (Note [Membership epochs] in
// runtime/base/membership.h; docs/design.md, "Node loss").
#include "world_reform.h"

#include <cstdlib>

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "dtrain/base/job_store.h"
#include "dtrain/base/logging.h"
#include "env_contract.h"
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
      std::move(own), [target = r->target](const membership::Epoch& e) {
        std::shared_ptr<Communicator> c;
        {
          std::lock_guard<std::mutex> g(target->mutex);
          if (e.epoch <= target->epoch) return;
          c = target->current.lock();
        }
        if (c) c->abort(fmt::format("epoch {}: {}", e.epoch, e.why));
      });
  w.reform = std::move(r);
}

std::string worldPrefix(const std::string& name, int epoch) {
  return epoch > 0 ? fmt::format("pg/{}/{}", name, membership::epochPrefix(epoch)) : "pg/" + name;
}

bool reformsOnNodeLoss(const World& world) { return world.reform != nullptr; }

bool reformWorld(World& w) {
  if (!w.reform || w.closed) return false;
  WorldReform& r = *w.reform;
  if (!r.watcher->awaitAfter(w.epoch, r.wait)) return false;
  // The newest: two losses decided before this rank looked are one re-form.
  const membership::Epoch e = *r.watcher->latest();
  if (w.communicator) {
    w.communicator->abort(fmt::format("epoch {}: {}", e.epoch, e.why));
    w.communicator->shutdown();
  }
  const int rank = e.rankOf(r.nodeId, w.env.localRank);
  if (rank < 0) {
    DTRAIN_THROW(MembershipChanged,
                 "rank {} (node {}, local rank {}) is not a member of membership epoch {} ({}): "
                 "the launcher went on without this node",
                 w.env.rank, r.nodeId, w.env.localRank, e.epoch, e.why);
  }
  const BackendEntry* entry = nullptr;
  for (const auto& b : backendTable()) {
    if (r.backend == b.name) entry = &b;
  }
  DTRAIN_CHECK(entry != nullptr, "backend {} vanished from the table", r.backend);
  WorldEnv env = w.env;
  env.rank = rank;
  env.worldSize = e.worldSize;
  const auto start = std::chrono::steady_clock::now();
  BackendSetup setup{r.options, env,           w.store,  worldPrefix(r.options.name, e.epoch),
                     w.device,  r.cudaDevices, r.nodeKey};
  std::shared_ptr<Communicator> c = entry->create(setup);
  const int oldRank = w.env.rank;
  const int oldSize = w.env.worldSize;
  w.communicator = c;
  w.env = env;
  w.epoch = e.epoch;
  {
    std::lock_guard<std::mutex> g(r.target->mutex);
    r.target->current = c;
    r.target->epoch = e.epoch;
  }
  // An epoch newer than this one may have come while the communicator was built.
  if (auto newer = r.watcher->latest(); newer && newer->epoch > e.epoch) {
    c->abort(fmt::format("epoch {}: {}", newer->epoch, newer->why));
  }
  w.store->add(membership::formedKey(e.epoch), 1);
  log::setTag(fmt::format("[dtrain rank {}]", rank));
  DTRAIN_LOG(
      Warn, "re-formed in membership epoch {} ({}): rank {}/{} was {}/{}, in {:.0f} ms", e.epoch,
      e.why, rank, e.worldSize, oldRank, oldSize,
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  return true;
}

}  // namespace dtrain::comm
