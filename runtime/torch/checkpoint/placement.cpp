#include "placement.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <utility>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "dtrain/base/store.h"
#include "env_contract.h"
#include "parse_int.h"

namespace dtrain::checkpoint {

namespace {

int envInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  int64_t n = 0;
  return v && *v && parseInt64(v, &n) && n >= 0 ? static_cast<int>(n) : fallback;
}

// Note [Agreements a lost node cannot hold up]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Under `launch --on-node-loss continue` a rank may wait in a save's agreement (Note [Checkpoint
// agreement]) for the ranks of a node that is gone. The store knows nothing of membership: the
// wait would last the checkpoint's whole deadline (minutes), while the survivors wait for this
// rank to re-form with them. So a group that re-forms agrees through this store: its waits are
// cut into slices of kFenceSlice, and between two it looks at the group's communicator, which
// the launcher's new epoch aborts at once (Communicator::abort). Once that happened the wait
// ends with MembershipChanged, as a collective would: TrainingState::tryStep() re-forms, and the
// Checkpointer follows the group's epoch at its next call.
constexpr checkpoint::Millis kFenceSlice{200};

class MembershipFencedStore : public store::Store {
  using Bytes = store::Bytes;
  using Millis = store::Millis;

 public:
  MembershipFencedStore(std::shared_ptr<store::Store> inner, std::shared_ptr<ProcessGroup> group)
      : inner_(std::move(inner)), group_(std::move(group)) {}

  void set(const std::string& key, const Bytes& value) override { inner_->set(key, value); }
  void flush() override { inner_->flush(); }
  Bytes get(const std::string& key) override { return inner_->get(key); }
  int64_t add(const std::string& key, int64_t delta) override { return inner_->add(key, delta); }
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    return inner_->compareSet(key, expected, desired);
  }
  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    using Clock = std::chrono::steady_clock;
    const Millis total = waitTimeout(timeout);
    const auto until = Clock::now() + total;
    for (;;) {
      fence(keys);
      const auto left = std::chrono::duration_cast<Millis>(until - Clock::now());
      try {
        inner_->wait(keys, std::clamp(left, Millis(1), kFenceSlice));
        return;
      } catch (const TimeoutError&) {
        if (Clock::now() < until) continue;
      }
      DTRAIN_THROW(TimeoutError, "timed out after {} ms waiting for {} on store {}", total.count(),
                   fmt::join(keys, ", "), describe());
    }
  }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(keys); }
  bool deleteKey(const std::string& key) override { return inner_->deleteKey(key); }
  int64_t numKeys() override { return inner_->numKeys(); }
  Millis timeout() const override { return inner_->timeout(); }
  void setTimeout(Millis timeout) override { inner_->setTimeout(timeout); }
  std::string describe() const override { return inner_->describe(); }
  std::vector<std::optional<Bytes>> tryMultiGet(const std::vector<std::string>& keys) override {
    return inner_->tryMultiGet(keys);
  }
  Bytes waitChanged(const std::string& key, const Bytes& seen, Millis timeout) override {
    return inner_->waitChanged(key, seen, timeout);
  }

 private:
  void fence(const std::vector<std::string>& keys) {
    std::exception_ptr failed = group_->communicator().error();
    if (!failed) return;
    std::string why;
    try {
      std::rethrow_exception(failed);
    } catch (const std::exception& e) {
      why = e.what();
    }
    DTRAIN_THROW(MembershipChanged,
                 "rank {}/{} (epoch {}): left the checkpoint agreement (waiting for {}) because "
                 "the group's communicator failed: {}",
                 group_->rank(), group_->size(), group_->epoch(), fmt::join(keys, ", "), why);
  }

  std::shared_ptr<store::Store> inner_;
  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace

Placement::Placement(std::shared_ptr<ProcessGroup> g, const CheckpointOptions& opts)
    : group(std::move(g)), options(opts) {
  rank = group->rank();
  world = group->size();
  // The node's stable id (env::kNodeId), which an elastic re-rendezvous does not change, so the
  // node keeps its directory; GROUP_RANK where the launcher exports none (torchrun).
  nodeId = options.nodeId >= 0 ? options.nodeId : envInt(env::kNodeId, envInt(env::kGroupRank, 0));
  localRank = options.localRank >= 0 ? options.localRank : group->localRank();
}

std::vector<int64_t> Placement::allgather(int64_t value) {
  if (world == 1) return {value};
  std::vector<int64_t> out;
  for (const auto& v : group->allgatherHost(at::full({1}, value, at::kLong))) {
    out.push_back(v.item<int64_t>());
  }
  return out;
}

std::vector<std::vector<uint8_t>> Placement::allgatherBytes(const std::vector<uint8_t>& mine) {
  if (world == 1) return {mine};
  auto lengths = allgather(static_cast<int64_t>(mine.size()));
  int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  at::Tensor buf = at::zeros({std::max<int64_t>(longest, 1)}, at::kByte);
  if (!mine.empty()) std::memcpy(buf.data_ptr(), mine.data(), mine.size());
  auto all = group->allgatherHost(buf);
  std::vector<std::vector<uint8_t>> out;
  for (int r = 0; r < world; ++r) {
    const auto* p = all[r].data_ptr<uint8_t>();
    out.emplace_back(p, p + lengths[r]);
  }
  return out;
}

checkpoint::Millis Placement::deadline() const {
  const checkpoint::Millis grace = std::clamp<checkpoint::Millis>(
      options.timeout / 2, std::chrono::seconds(1), std::chrono::seconds(60));
  return options.timeout + grace;
}

void Placement::agree(const std::string& error, const std::string& what) {
  throwIfFailed(agreement->exchange(error.empty() ? 0 : 1, deadline(), what), 1, error, what);
}

void Placement::throwIfFailed(const std::vector<checkpoint::Report>& reports, int64_t code,
                              const std::string& mine, const std::string& what) {
  std::vector<std::string> others;
  bool any = false;
  for (const auto& r : reports) {
    if (r.code != code) continue;
    any = true;
    if (r.rank != rank) {
      others.push_back(
          fmt::format("rank {} (node {})", r.rank, nodeOf.empty() ? 0 : nodeOf[r.rank]));
    }
  }
  if (!any) return;
  auto list = [](const std::vector<std::string>& names) {
    if (names.size() < 2) return names.empty() ? std::string() : names[0];
    return fmt::format("{} and {}",
                       fmt::join(std::vector<std::string>(names.begin(), names.end() - 1), ", "),
                       names.back());
  };
  if (!mine.empty()) {
    DTRAIN_THROW(CheckpointError, "rank {}/{}: {} failed: {}{}", rank, world, what, mine,
                 others.empty() ? "" : fmt::format(" (it failed on {} too)", list(others)));
  }
  DTRAIN_THROW(CheckpointError, "rank {}/{}: {} failed on {}; see the error there", rank, world,
               what, list(others));
}

void Placement::refresh() {
  rank = group->rank();
  world = group->size();
  localRank = options.localRank >= 0 ? options.localRank : group->localRank();
  nodeOf.clear();
  writerOf.clear();
  writer = false;
  agreement.reset();
  place();
}

void Placement::place() {
  auto nodes = allgather(nodeId);
  auto locals = allgather(localRank);
  nodeOf.assign(nodes.begin(), nodes.end());
  for (int r = 0; r < world; ++r) {
    if (locals[r] != 0) continue;
    auto [it, fresh] = writerOf.emplace(static_cast<int>(nodes[r]), r);
    DTRAIN_CHECK_ARG(fresh,
                     "Checkpointer: ranks {} and {} both say they are local rank 0 of node {}",
                     it->second, r, nodes[r]);
  }
  for (int r = 0; r < world; ++r) {
    DTRAIN_CHECK_ARG(writerOf.count(static_cast<int>(nodes[r])),
                     "Checkpointer: node {} (rank {}) has no local rank 0 to write its "
                     "checkpoints. HINT: {} (or GROUP_RANK) and LOCAL_RANK must describe the job "
                     "as launch sets them",
                     nodes[r], r, env::kNodeId);
  }
  writer = localRank == 0;
  // One key prefix per Checkpointer of the job: rank 0 draws it from the store, the others learn
  // it here; no store on rank 0 (a group made over a bare communicator): the collectives.
  auto store = options.store ? options.store : group->store();
  // See Note [Agreements a lost node cannot hold up].
  if (store && group->reformsOnNodeLoss()) {
    store = std::make_shared<MembershipFencedStore>(std::move(store), group);
  }
  const int64_t drawn = store && rank == 0 ? store->add("checkpoint/instances", 1) : 0;
  const int64_t instance = allgather(drawn)[0];
  if (instance > 0) {
    DTRAIN_CHECK_ARG(store != nullptr,
                     "Checkpointer: rank 0 agrees through a store and rank {} has none. HINT: "
                     "pass the same CheckpointOptions::store on every rank",
                     rank);
    agreement = std::make_unique<checkpoint::StoreAgreement>(
        store, fmt::format("checkpoint/{}", instance), rank, world);
  } else {
    agreement = collectiveAgreement(group);
  }
}

}  // namespace dtrain::checkpoint
