#include "shard_exchange.h"

#include <algorithm>
#include <cstring>
#include <set>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "checkpoint/file_io.h"
#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "dtrain/torch/zero.h"
#include "shard_entries.h"

namespace dtrain::checkpoint {

namespace {

bool contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// Every rank's part of a step's shard listing: step, saved world size, owner count, owners.
std::vector<uint8_t> encodeListing(const std::vector<std::vector<int64_t>>& rows) {
  std::vector<int64_t> flat;
  for (const auto& row : rows) flat.insert(flat.end(), row.begin(), row.end());
  std::vector<uint8_t> out(flat.size() * 8);
  if (!flat.empty()) std::memcpy(out.data(), flat.data(), out.size());
  return out;
}

}  // namespace

void settleShardedParameters(const state::Registry& registered) {
  for (const auto& s : registered.sharded) s.optimizer->waitForParameters();
}

ShardExchange::ShardExchange(Placement& placement, state::Registry& registered, std::string dir)
    : placement_(placement), registered_(registered), dir_(std::move(dir)) {}

void ShardExchange::reset() {
  // The old world's subgroups may wait for a lost member: aborted first (the epoch's
  // abortWithGroups did when they came from the world; a second abort changes nothing), so that
  // shutting them down never waits.
  for (auto& g : keeperGroups_) {
    if (!g) continue;
    try {
      g->communicator().abort("the group re-formed; the checkpoint's subgroups are made again");
      g->shutdown();
    } catch (const std::exception& e) {
      DTRAIN_LOG(Debug, "rank {}: closing a checkpoint subgroup of the old world: {}",
                 placement_.rank, e.what());
    }
  }
  keepers_.clear();
  keeperGroups_.clear();
  keeperGroupsBuilt_ = false;
  subgroups_ = true;
}

void ShardExchange::buildKeeperGroups() {
  if (keeperGroupsBuilt_) return;
  keeperGroupsBuilt_ = true;
  keepers_ = checkpoint::shardKeepers(placement_.nodeOf, placement_.writerOf);
  keeperGroups_.assign(placement_.world, nullptr);
  bool created = false;
  for (int r = 0; r < placement_.world && subgroups_; ++r) {
    std::vector<int> members = keepers_[r];
    if (!contains(members, r)) members.push_back(r);
    if (members.size() < 2) continue;  // a writer that keeps only its own shards
    try {
      keeperGroups_[r] = placement_.group->newGroup(members);
      created = true;
    } catch (const InvalidArgument& e) {
      // The same backend on every rank: all of them get here at the first group.
      if (created) throw;
      DTRAIN_LOG(Info,
                 "rank {}: the {} backend has no subgroups; shards go to their keepers "
                 "through broadcasts over the whole group",
                 placement_.rank, placement_.group->backend());
      subgroups_ = false;
    }
  }
}

std::vector<std::pair<int, at::Tensor>> ShardExchange::exchangeShards() {
  buildKeeperGroups();
  const at::Tensor mine = checkpoint::encodeShards(registered_.sharded);
  std::vector<std::pair<int, at::Tensor>> kept;
  // Ranks in order: two groups that share members are entered in the same order by all of them.
  for (int r = 0; r < placement_.world; ++r) {
    const bool keeper = placement_.writer && contains(keepers_[r], placement_.rank);
    std::shared_ptr<ProcessGroup> g = subgroups_ ? keeperGroups_[r] : placement_.group;
    if (!g) {
      if (r == placement_.rank && keeper) kept.emplace_back(r, mine);
      continue;
    }
    // The root's place in the group: subgroups rank their members by their rank here.
    int root = r;
    if (subgroups_) {
      std::vector<int> members = keepers_[r];
      if (!contains(members, r)) members.push_back(r);
      std::sort(members.begin(), members.end());
      root = static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin());
    }
    const int64_t size = r == placement_.rank ? mine.numel() : 0;
    at::Tensor length = at::full({1}, size, at::kLong).to(g->device());
    g->broadcast(length, root);
    const int64_t n = length.cpu().item<int64_t>();
    at::Tensor blob = r == placement_.rank ? mine : at::empty({n}, at::kByte);
    at::Tensor onDevice = blob.to(g->device());
    if (n > 0) g->broadcast(onDevice, root);
    if (keeper) kept.emplace_back(r, r == placement_.rank ? blob : onDevice.cpu());
  }
  return kept;
}

ShardExchange::ShardHolders ShardExchange::listShardHolders(std::vector<int64_t>& mine) {
  std::vector<std::vector<int64_t>> rows;
  for (int64_t step : mine) {
    try {
      auto reader = checkpoint::CheckpointReader::open(dir_ + "/" + checkpoint::stepFileName(step));
      std::vector<int64_t> row = {step, reader.header().worldSize, 0};
      for (uint32_t o : checkpoint::shardOwners(reader)) row.push_back(o);
      row[2] = static_cast<int64_t>(row.size()) - 3;
      rows.push_back(row);
    } catch (const std::exception& e) {
      DTRAIN_LOG(Warn, "rank {}: skipping checkpoint step {}: {}", placement_.rank, step, e.what());
    }
  }
  ShardHolders h;
  std::map<int64_t, std::set<int>> listedBy;  // step -> the nodes whose file of it was listed
  const auto all = placement_.allgatherBytes(encodeListing(rows));
  for (int r = 0; r < placement_.world; ++r) {
    std::vector<int64_t> flat(all[r].size() / 8);
    if (!flat.empty()) std::memcpy(flat.data(), all[r].data(), flat.size() * 8);
    for (size_t i = 0; i + 3 <= flat.size(); i += 3 + static_cast<size_t>(flat[i + 2])) {
      h.savedWorld[flat[i]] = static_cast<uint32_t>(flat[i + 1]);
      listedBy[flat[i]].insert(placement_.nodeOf[r]);
      auto& owners = h.holders[flat[i]];
      for (int64_t k = 0; k < flat[i + 2]; ++k) {
        owners[static_cast<uint32_t>(flat[i + 3 + k])].push_back(r);
      }
    }
  }
  // A step is complete when every rank that saved it has its shards on some node: every rank of
  // its world size, kShardSaversEntry listing also those that saved no record.
  std::vector<int> searched;
  for (const auto& [node, w] : placement_.writerOf) searched.push_back(node);
  for (const auto& [step, saved] : h.savedWorld) {
    std::vector<uint32_t> lacking;
    for (uint32_t o = 0; o < saved; ++o) {
      if (!h.holders[step].count(o)) lacking.push_back(o);
    }
    if (lacking.empty()) continue;
    h.incomplete[step] = fmt::format(
        "checkpoint step {} is incomplete: no node holds the shards of rank(s) {} of the {} ranks "
        "that saved it (searched node(s) {}; the step's file is on node(s) {})",
        step, fmt::join(lacking, ", "), saved, fmt::join(searched, ", "),
        fmt::join(listedBy[step], ", "));
  }
  std::vector<int64_t> complete;
  for (int64_t step : mine) {
    auto it = h.incomplete.find(step);
    if (it == h.incomplete.end()) {
      complete.push_back(step);
    } else {
      DTRAIN_LOG(Warn, "rank {}: {}; not restoring it", placement_.rank, it->second);
    }
  }
  mine = complete;
  return h;
}

// Note [Local shard reads]
// A restore sends a saved rank's shards over the group only to ranks that cannot read them on
// their own node. Every node holds the step's file by then (copyToNodesLacking()), and each rank
// first reads from it the records of each saved rank the file lists -- only those that overlap
// the rank's own ranges in today's layout, straight into what it assembles (ShardAssembly::read():
// the others are not read; each one read has its checksum checked). A saved rank whose records
// it cannot read so -- its node's file lacks them (from three nodes on a file holds two nodes'
// shards) or they are damaged there -- it marks as lacking. One allgather of every rank's marks
// is the agreement: the same bytes on every rank, so every rank derives the same list of saved
// ranks to send, in saved-rank order, and skips the others. For each of these, as before, each
// holder in turn says through agreement->share() whether its copy is intact (its size, or -1:
// the next holder is asked; none left: the step is dropped everywhere) and the first that is
// broadcasts it whole; only the ranks that marked it add it to what they assemble, so none adds
// a saved rank's records twice. The collective calls -- the allgather, per saved rank sent the
// shares and one broadcast, the closing agree() -- depend only on what every rank has received,
// never on what a rank read locally, so every rank makes them in the same order. When every
// node's file holds every saved rank's shards (one or two nodes), no shard is sent at all.
bool ShardExchange::loadShards(int64_t step, const ShardHolders& h, std::string& why) {
  checkpoint::ShardAssembly assembly(registered_.sharded);
  const checkpoint::ModuleShards modules = checkpoint::moduleEntries(
      checkpoint::registryOf(registered_));
  const std::string path = dir_ + "/" + checkpoint::stepFileName(step);
  const uint32_t saved = h.savedWorld.at(step);
  std::vector<uint8_t> lacking(saved, 1);  // per saved rank: 1 when this rank needs it sent
  try {
    const auto reader = checkpoint::CheckpointReader::open(path);
    for (uint32_t o : checkpoint::shardOwners(reader)) {
      if (o >= saved) continue;
      try {
        assembly.read(reader, o, modules);  // the records it wants, straight into place
        lacking[o] = 0;
      } catch (const std::exception& e) {
        DTRAIN_LOG(Warn,
                   "rank {}: the shards of rank {} in {} are damaged: {}; asking the nodes "
                   "that hold them",
                   placement_.rank, o, path, e.what());
      }
    }
  } catch (const std::exception& e) {
    DTRAIN_LOG(Warn, "rank {}: cannot read the shards in {}: {}; asking the nodes that hold them",
               placement_.rank, path, e.what());
  }
  // Every rank's marks: `saved` bytes each, the same length everywhere (one allgather).
  at::Tensor marks = at::empty({static_cast<int64_t>(saved)}, at::kByte);
  std::memcpy(marks.data_ptr(), lacking.data(), lacking.size());
  std::vector<at::Tensor> all = {marks};
  if (placement_.world > 1) all = placement_.group->allgather(marks.to(placement_.group->device()));
  for (at::Tensor& m : all) m = m.cpu();
  for (uint32_t o = 0; o < saved; ++o) {
    bool sent = false;
    for (const at::Tensor& m : all) sent = sent || m.data_ptr<uint8_t>()[o] != 0;
    if (!sent) continue;
    const std::vector<int>& holders = h.holders.at(step).at(o);
    bool got = false;
    std::vector<std::string> damaged;
    for (int source : holders) {
      at::Tensor blob;
      int64_t size = -1;
      if (placement_.rank == source) {
        try {
          blob = checkpoint::readShardBlob(checkpoint::CheckpointReader::open(path), o,
                                           registered_.sharded, modules);
          size = blob.numel();
        } catch (const std::exception& e) {
          DTRAIN_LOG(Warn, "rank {}: the shards of rank {} in {} are damaged: {}", placement_.rank,
                     o, path, e.what());
        }
      }
      size = placement_.agreement->share(
          source, size, placement_.deadline(),
          fmt::format("whether it can hand out the shards of rank {} of "
                      "checkpoint step {}",
                      o, step));
      if (size < 0) {
        damaged.push_back(fmt::format("node {}", placement_.nodeOf[source]));
        continue;
      }
      at::Tensor t = placement_.rank == source ? blob : at::empty({size}, at::kByte);
      at::Tensor onDevice = t.to(placement_.group->device());
      if (size > 0) placement_.group->broadcast(onDevice, source);
      if (lacking[o]) {
        at::Tensor host = onDevice.cpu();
        assembly.add(host.data_ptr<uint8_t>(), static_cast<size_t>(size));
      }
      got = true;
      break;
    }
    if (!got) {
      why = fmt::format("checkpoint step {}: the shards of rank {} are damaged on every node that "
                        "holds them ({})",
                        step, o, fmt::join(damaged, ", "));
      return false;
    }
  }
  placement_.agree(assembly.missing(),
                   fmt::format("assembling the sharded state of checkpoint step {}", step));
  assembly.load();
  return true;
}

}  // namespace dtrain::checkpoint
