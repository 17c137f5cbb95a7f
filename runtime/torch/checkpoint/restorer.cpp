#include "restorer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "saver.h"
#include "shard_entries.h"
#include "shard_exchange.h"

// Note [Restore agreement]
// Every node's local rank 0 lists its own directory and keeps, newest first, the checkpoints whose
// header and manifest are intact (cheap: a few KB each). The ranks take the maximum of the nodes'
// newest: the newest step any node holds. A node without it -- a spot machine that came back with
// an empty disk -- receives the file from the lowest node that has it (that node verifies every
// checksum first, then broadcasts it in chunks from its local rank 0) and commits it as its own
// `step-N` and `LATEST`, verified again before the rename, so the next failure finds it there
// too. A node that cannot hand its copy out (damaged, or it cannot even open it) drops the step
// and the round repeats: the next node that holds it hands it out, or the next older step wins.
// Then every rank reads its own node's copy straight into the registered tensors, checking
// every entry's checksum as it reads: one pass over the data, which is what makes a restore fast.
// If any rank finds damage, the ranks agree on it, the nodes where it was found drop that step,
// and the round repeats with what is left (those nodes get a fresh copy); a step found damaged a
// second time -- after that fresh, verified copy, so the file is not the cause -- is dropped on
// every node. A later round overwrites everything an earlier one wrote, so nothing of a damaged
// checkpoint survives. The loop is bounded: every round restores, refuses, or removes at least one
// (node, step) pair from the candidates. When checkpoints exist but none is intact anywhere,
// restore() refuses rather than silently start from scratch; a checkpoint that does not fit what
// is registered (another model, another world size) is refused at once, before any tensor is
// written. Every agreement that follows long local work (verifying, fsyncing, reading) goes
// through Note [Checkpoint agreement], with the checkpoint's deadline.

namespace dtrain::checkpoint {

namespace {

constexpr int64_t kCopyChunk = int64_t{16} << 20;

// Why a rank's read of the agreed checkpoint failed.
enum ReadStatus : int64_t { kRead = 0, kDamaged = 1, kRefused = 2 };

}  // namespace

Restorer::Restorer(Placement& placement, Saver& saver, ShardExchange& exchange,
                   state::Registry& registered, const CheckpointOptions& options, std::string dir,
                   std::shared_ptr<FileOps> ops)
    : placement_(placement),
      saver_(saver),
      exchange_(exchange),
      registered_(registered),
      options_(options),
      dir_(std::move(dir)),
      ops_(std::move(ops)) {}

std::vector<int64_t> Restorer::candidates(std::string& firstBad, int64_t& found) {
  auto listing = checkpoint::listDirectory(dir_);
  checkpoint::removeTemporaries(dir_);
  found = static_cast<int64_t>(listing.steps.size());
  std::vector<int64_t> out;
  for (int64_t step : listing.steps) {
    std::string path = dir_ + "/" + checkpoint::stepFileName(step);
    try {
      auto reader = checkpoint::CheckpointReader::open(path);
      DTRAIN_CHECK_T(CheckpointError, reader.header().step == step,
                     "checkpoint {}: its header says step {}, its name step {}", path,
                     reader.header().step, step);
      out.push_back(step);
    } catch (const std::exception& e) {
      DTRAIN_LOG(Warn, "rank {}: skipping checkpoint {}: {}", placement_.rank, path, e.what());
      if (firstBad.empty()) firstBad = e.what();
    }
  }
  return out;
}

namespace {

// Which node hands `step` out (the lowest that has it) and which nodes lack it.
struct CopyPlan {
  int sourceNode = -1;
  std::vector<int> lacking;
};

CopyPlan planCopy(const std::map<int, int>& writers, const std::vector<int64_t>& best,
                  int64_t step) {
  CopyPlan plan;
  for (const auto& [node, w] : writers) {
    if (best[w] == step) {
      if (plan.sourceNode < 0) plan.sourceNode = node;
    } else {
      plan.lacking.push_back(node);
    }
  }
  return plan;
}

}  // namespace

bool Restorer::copyToNodesLacking(int64_t step, const std::vector<int64_t>& best,
                                  std::set<int64_t>& bad) {
  const CopyPlan plan = planCopy(placement_.writerOf, best, step);
  if (plan.lacking.empty()) return true;
  const int source = placement_.writerOf.at(plan.sourceNode);
  const std::string name = checkpoint::stepFileName(step);
  const bool receiving = placement_.writer && best[placement_.rank] != step;
  if (placement_.rank == source || receiving) {
    DTRAIN_LOG(Warn,
               "rank {}: node(s) {} lack checkpoint step {}; copying it from node {} (rank {})",
               placement_.rank, fmt::join(plan.lacking, ", "), step, plan.sourceNode, source);
  }
  std::string error;
  int sourceFd = -1;
  int64_t size = placement_.rank == source ? openCopySource(dir_ + "/" + name, sourceFd, error)
                                           : -1;
  // The source verifies the whole file first: long on a large checkpoint.
  size = placement_.agreement->share(
      source, size, placement_.deadline(),
      fmt::format("whether it can hand out checkpoint step {}", step));
  if (size < 0) {
    // Damaged or unreadable there: that node drops the step; the round repeats.
    if (placement_.rank == source) bad.insert(step);
    if (placement_.rank == source || receiving) {
      DTRAIN_LOG(Warn,
                 "rank {}: node {} cannot hand out checkpoint step {}{}; trying another "
                 "node's copy or an older step",
                 placement_.rank, plan.sourceNode, step, error.empty() ? "" : ": " + error);
    }
    return false;
  }

  std::string tmp = dir_ + "/" + name + ".tmp";
  int fd = -1;
  if (receiving) {
    try {
      checkpoint::removeTemporaries(dir_);
      fd = ops_->open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  broadcastFile(source, sourceFd, size, fd, tmp, name, error);
  if (sourceFd >= 0) ::close(sourceFd);
  // Whether the source read every byte it sent: otherwise the receivers drop what they got.
  const bool sent = placement_.agreement->share(
                        source, placement_.rank == source && !error.empty() ? 0 : 1,
                        placement_.deadline(),
                        fmt::format("whether it sent checkpoint step {}", step)) != 0;
  if (!sent) {
    if (placement_.rank == source) bad.insert(step);
    if (fd >= 0) checkpoint::FileOps::close(fd);
    if (receiving) ::unlink(tmp.c_str());
    return false;
  }
  if (fd >= 0) commitCopy(fd, tmp, step, error);
  placement_.agree(error, fmt::format("copying checkpoint step {} from node {} to node(s) {}", step,
                                      plan.sourceNode, fmt::join(plan.lacking, ", ")));
  return true;
}

int64_t Restorer::openCopySource(const std::string& path, int& fd, std::string& error) {
  try {
    checkpoint::CheckpointReader::open(path).verify();
  } catch (const std::exception& e) {
    DTRAIN_LOG(Warn, "rank {}: checkpoint {} is damaged: {}", placement_.rank, path, e.what());
    return -2;
  }
  try {
    fd = ops_->open(path, O_RDONLY);
  } catch (const std::exception& e) {
    error = e.what();
    return -1;
  }
  const int64_t size = static_cast<int64_t>(::lseek(fd, 0, SEEK_END));
  if (size < 0) {
    error = fmt::format("cannot read {}: {}", path, std::strerror(errno));
    ::close(fd);
    fd = -1;
  }
  return size;
}

void Restorer::broadcastFile(int source, int sourceFd, int64_t size, int fd, const std::string& tmp,
                             const std::string& name, std::string& error) {
  at::Tensor chunk = at::empty({std::min(kCopyChunk, std::max<int64_t>(size, 1))}, at::kByte);
  // Every rank takes part in every broadcast, whatever fails locally: the collectives must line up.
  for (int64_t off = 0; size > 0 && off < size; off += kCopyChunk) {
    int64_t n = std::min(kCopyChunk, size - off);
    at::Tensor piece = chunk.narrow(0, 0, n);
    if (placement_.rank == source && error.empty()) {
      ssize_t got = ::pread(sourceFd, piece.data_ptr(), static_cast<size_t>(n), off);
      if (got != n) error = fmt::format("reading {} at offset {} failed", name, off);
    }
    at::Tensor onDevice = piece.to(placement_.group->device());
    placement_.group->broadcast(onDevice, source);
    if (fd >= 0 && error.empty()) {
      at::Tensor host = onDevice.cpu();
      try {
        ops_->writeAt(fd, host.data_ptr(), static_cast<size_t>(n), static_cast<uint64_t>(off), tmp);
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
  }
}

void Restorer::commitCopy(int fd, const std::string& tmp, int64_t step, std::string& error) {
  try {
    if (error.empty()) {
      ops_->fsync(fd, tmp);
      checkpoint::FileOps::close(fd);
      fd = -1;
      auto reader = checkpoint::CheckpointReader::open(tmp);
      reader.verify();
      DTRAIN_CHECK_T(CheckpointError, reader.header().step == step,
                     "the copy of step {} says step {}", step, reader.header().step);
      checkpoint::commitStep(*ops_, dir_, step);
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  checkpoint::FileOps::close(fd);
  if (!error.empty()) ::unlink(tmp.c_str());
}

std::optional<RestoredCheckpoint> Restorer::restore() {
  saver_.waitPending();
  saver_.settleSaveThread();
  // A running all-gather would overwrite the parameters restored.
  settleShardedParameters(registered_);
  // Note [Restore agreement].
  std::string scanError, firstBad;
  int64_t found = 0;
  std::vector<int64_t> mine;
  if (placement_.writer) {
    try {
      mine = candidates(firstBad, found);
    } catch (const std::exception& e) {
      scanError = e.what();
    }
  }
  placement_.agree(scanError, "scanning the checkpoint directory");
  const auto counts = placement_.allgather(found);
  // Note [Sharded checkpoint files]: only steps whose shards are all somewhere take part.
  ShardExchange::ShardHolders shardHolders;
  if (sharded()) shardHolders = exchange_.listShardHolders(mine);
  std::set<int64_t> bad;            // steps this node no longer offers
  std::set<int64_t> damagedBefore;  // steps found damaged in an earlier round (on any node)
  std::string lastDamage = firstBad;
  while (true) {
    int64_t best = -1;
    for (int64_t c : mine) {
      if (!bad.count(c)) {
        best = c;
        break;
      }
    }
    const auto bests = placement_.allgather(best);
    const int64_t step = *std::max_element(bests.begin(), bests.end());
    if (step < 0) {
      const auto& incomplete = shardHolders.incomplete;
      refuseIfAnyExists(counts, lastDamage, incomplete.empty() ? "" : incomplete.rbegin()->second);
      return std::nullopt;
    }
    if (!copyToNodesLacking(step, bests, bad)) continue;  // the source could not hand it out
    if (auto result = tryStep(step, bests, bad, damagedBefore, lastDamage)) {
      std::string why;
      if (sharded() && !exchange_.loadShards(step, shardHolders, why)) {
        // No intact copy of some rank's shards: every node drops the step.
        if (placement_.writer) bad.insert(step);
        lastDamage = why;
        if (placement_.rank == 0) {
          DTRAIN_LOG(Warn, "rank 0: {}; restoring the next older complete step", why);
        }
        continue;
      }
      saver_.markCommitted(step);
      result->skipped = lastDamage;
      return result;
    }
  }
}

std::optional<RestoredCheckpoint> Restorer::tryStep(int64_t step, const std::vector<int64_t>& bests,
                                                    std::set<int64_t>& bad,
                                                    std::set<int64_t>& damagedBefore,
                                                    std::string& lastDamage) {
  RestoredCheckpoint result;
  result.step = step;
  result.path = dir_ + "/" + checkpoint::stepFileName(step);
  result.copiedFromPeer = bests[placement_.writerOf.at(placement_.nodeId)] != step;
  std::string error;
  const int64_t status = readInto(result, error);
  const std::string what = fmt::format("restoring checkpoint step {}", step);
  const auto reports = placement_.agreement->exchange(status, placement_.deadline(), what);
  placement_.throwIfFailed(reports, kRefused, status == kRefused ? error : "", what);
  if (reports.empty()) {
    DTRAIN_LOG(Info, "rank {}: restored step {} (epoch {}) from {}{}", placement_.rank, step,
               result.epoch, result.path,
               result.copiedFromPeer ? " (copied from another node)" : "");
    return result;
  }
  // Damage found: the nodes where it was found drop this step, and the round repeats; found a
  // second time, every node drops it (Note [Restore agreement]).
  const bool again = !damagedBefore.insert(step).second;
  for (const auto& r : reports) {
    if (placement_.writer && (again || placement_.nodeOf[r.rank] == placement_.nodeId)) {
      bad.insert(step);
    }
  }
  if (!error.empty()) lastDamage = error;
  if (placement_.rank == 0 || !error.empty()) {
    DTRAIN_LOG(Warn, "rank {}: checkpoint step {} is damaged{}; {}", placement_.rank, step,
               error.empty() ? " on another node" : ": " + error,
               again ? "found twice, every node drops it" : "trying again without that copy");
  }
  return std::nullopt;
}

void Restorer::refuseIfAnyExists(const std::vector<int64_t>& counts, const std::string& lastDamage,
                                 const std::string& incomplete) {
  std::vector<std::string> holders;
  for (int r = 0; r < placement_.world; ++r) {
    if (counts[r] > 0) {
      holders.push_back(fmt::format("node {} (rank {}): {}", placement_.nodeOf[r], r, counts[r]));
    }
  }
  if (holders.empty()) return;
  if (lastDamage.empty() && !incomplete.empty()) {
    // Nothing was found damaged: shards are missing, which `checkpoint verify` cannot name.
    DTRAIN_THROW(CheckpointError,
                 "rank {}/{}: checkpoints exist (files on {}) but no step is complete: {}. HINT: "
                 "a save that did not finish on every node, or the nodes holding those shards "
                 "are not in this job: run it on them (each node's directory holds its own "
                 "ranks' shards and the next node's), or move the step files away to start from "
                 "scratch",
                 placement_.rank, placement_.world, fmt::join(holders, "; "), incomplete);
  }
  DTRAIN_THROW(CheckpointError,
               "rank {}/{}: checkpoints exist but none is intact on any node (files on {}){}{}. "
               "HINT: `checkpoint verify {}` names the damage; move the damaged files away to "
               "start from scratch",
               placement_.rank, placement_.world, fmt::join(holders, "; "),
               lastDamage.empty() ? "" : "; here: " + lastDamage,
               incomplete.empty() ? "" : "; " + incomplete, dir_);
}

int64_t Restorer::readInto(RestoredCheckpoint& result, std::string& error) {
  int64_t status = kRead;
  try {
    auto reader = checkpoint::CheckpointReader::open(result.path);
    const auto& h = reader.header();
    result.epoch = h.epoch;
    result.savedWorldSize = static_cast<int>(h.worldSize);
    const bool same = static_cast<int>(h.worldSize) == placement_.world;
    status = kRefused;  // what does not fit is refused as a whole, before anything is written
    DTRAIN_CHECK_T(CheckpointError, same || options_.allowWorldSizeChange,
                   "{} was saved by a job of world size {}, this job has world size {}. HINT: "
                   "set CheckpointOptions::allowWorldSizeChange to resume at another world size "
                   "(the sampler re-shards the rest of the epoch exactly)",
                   result.path, h.worldSize, placement_.world);
    checkpoint::Registry registry = checkpoint::registryOf(registered_);
    checkpoint::checkRestorable(reader, registry);
    checkpoint::checkShardedRestorable(reader, registered_.sharded);
    status = kDamaged;  // from here on, an error is damage found while reading
    checkpoint::restoreReplicated(reader, registry, registered_.metadata, same,
                                  placement_.group->device());
    checkpoint::restoreRankState(reader, registered_, static_cast<uint32_t>(placement_.rank), same);
    checkpoint::restoreShardedReplicated(reader, registered_.sharded);
    status = kRead;
  } catch (const CheckpointError& e) {
    error = e.what();
    if (status == kRead) status = kDamaged;  // opening failed: the file went bad
  } catch (const std::exception& e) {
    error = e.what();
    status = kRefused;
  }
  return status;
}

}  // namespace dtrain::checkpoint
