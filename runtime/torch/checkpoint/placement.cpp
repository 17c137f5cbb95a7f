#include "placement.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
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
  at::Tensor t = at::full({1}, value, at::kLong).to(group->device());
  std::vector<int64_t> out;
  for (const auto& v : group->allgather(t)) out.push_back(v.cpu().item<int64_t>());
  return out;
}

std::vector<std::vector<uint8_t>> Placement::allgatherBytes(const std::vector<uint8_t>& mine) {
  if (world == 1) return {mine};
  auto lengths = allgather(static_cast<int64_t>(mine.size()));
  int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  at::Tensor buf = at::zeros({std::max<int64_t>(longest, 1)}, at::kByte);
  if (!mine.empty()) std::memcpy(buf.data_ptr(), mine.data(), mine.size());
  auto all = group->allgather(buf.to(group->device()));
  std::vector<std::vector<uint8_t>> out;
  for (int r = 0; r < world; ++r) {
    at::Tensor host = all[r].cpu();
    const auto* p = host.data_ptr<uint8_t>();
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
