// Checkpointer::restore(): agree on a step, give a copy to nodes that lack it, read it back.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <set>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "checkpointer_impl.h"
#include "dtrain/error.h"
#include "dtrain/logging.h"

// Note [Restore agreement]
// Every node's local rank 0 scans its own directory newest first and fully verifies (every
// checksum) the first candidate that opens, falling back to older ones; it reports the newest
// step that verified (-1 when none) and how many it found. The ranks take the maximum: the
// newest step that is complete on at least one node. A node whose best is older or missing -- a
// spot machine that came back with an empty disk, a node whose newest file is damaged -- receives
// the file from the lowest node that has it (broadcast in chunks from that node's local rank 0)
// and commits it as its own `step-N` and `LATEST`, verified before the rename, so the next
// failure finds it there too. Then every rank reads its own node's copy straight into the
// registered tensors. When checkpoints exist but none verifies anywhere, restore() refuses rather
// than silently start from scratch.

namespace dtrain {

namespace {

constexpr int64_t kCopyChunk = int64_t{16} << 20;

}  // namespace

int64_t Checkpointer::Impl::newestVerified(std::string& firstError, int64_t& found) {
  auto listing = checkpoint::listDirectory(dir);
  checkpoint::removeTemporaries(dir);
  found = static_cast<int64_t>(listing.steps.size());
  for (int64_t step : listing.steps) {
    std::string path = dir + "/" + checkpoint::stepFileName(step);
    try {
      auto reader = checkpoint::CheckpointReader::open(path);
      DTRAIN_CHECK_T(CheckpointError, reader.header().step == step,
                     "checkpoint {}: its header says step {}, its name step {}", path,
                     reader.header().step, step);
      reader.verify();
      return step;
    } catch (const std::exception& e) {
      DTRAIN_LOG(Warn, "rank {}: skipping checkpoint {}: {}", rank, path, e.what());
      if (firstError.empty()) firstError = e.what();
    }
  }
  return -1;
}

void Checkpointer::Impl::copyToNodesLacking(int64_t step, const std::vector<int64_t>& best) {
  int sourceNode = -1;
  std::vector<int> lacking;
  for (const auto& [node, w] : writerOf) {
    if (best[w] == step) {
      if (sourceNode < 0) sourceNode = node;
    } else {
      lacking.push_back(node);
    }
  }
  if (lacking.empty()) return;
  const int source = writerOf.at(sourceNode);
  const std::string name = checkpoint::stepFileName(step);
  const bool receiving = writer && best[rank] != step;
  if (rank == source || receiving) {
    DTRAIN_LOG(Warn, "rank {}: node(s) {} lack checkpoint step {}; copying it from node {} (rank {})",
               rank, fmt::join(lacking, ", "), step, sourceNode, source);
  }

  // The source's file size; -1 when the source cannot read it (every rank then fails below).
  std::string error;
  int sourceFd = -1;
  int64_t size = -1;
  if (rank == source) {
    std::string path = dir + "/" + name;
    sourceFd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (sourceFd >= 0) size = static_cast<int64_t>(::lseek(sourceFd, 0, SEEK_END));
    if (size < 0) error = fmt::format("cannot read {}: {}", path, std::strerror(errno));
  }
  at::Tensor sizeTensor = at::full({1}, size, at::kLong).to(group->device());
  group->broadcast(sizeTensor, source);
  size = sizeTensor.cpu().item<int64_t>();

  std::string tmp = dir + "/" + name + ".tmp";
  int fd = -1;
  if (receiving && size >= 0) {
    try {
      checkpoint::removeTemporaries(dir);
      fd = ops->open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  at::Tensor chunk = at::empty({std::min(kCopyChunk, std::max<int64_t>(size, 1))}, at::kByte);
  // Every rank takes part in every broadcast, whatever fails locally: the collectives must line up.
  for (int64_t off = 0; size > 0 && off < size; off += kCopyChunk) {
    int64_t n = std::min(kCopyChunk, size - off);
    at::Tensor piece = chunk.narrow(0, 0, n);
    if (rank == source && error.empty()) {
      ssize_t got = ::pread(sourceFd, piece.data_ptr(), static_cast<size_t>(n), off);
      if (got != n) error = fmt::format("reading {} at offset {} failed", name, off);
    }
    at::Tensor onDevice = piece.to(group->device());
    group->broadcast(onDevice, source);
    if (fd >= 0 && error.empty()) {
      at::Tensor host = onDevice.cpu();
      try {
        ops->writeAt(fd, host.data_ptr(), static_cast<size_t>(n), static_cast<uint64_t>(off), tmp);
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
  }
  if (sourceFd >= 0) ::close(sourceFd);
  if (fd >= 0) {
    try {
      if (error.empty()) {
        ops->fsync(fd, tmp);
        checkpoint::FileOps::close(fd);
        fd = -1;
        auto reader = checkpoint::CheckpointReader::open(tmp);
        reader.verify();
        DTRAIN_CHECK_T(CheckpointError, reader.header().step == step,
                       "the copy of step {} says step {}", step, reader.header().step);
        checkpoint::commitStep(*ops, dir, step);
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    checkpoint::FileOps::close(fd);
    if (!error.empty()) ::unlink(tmp.c_str());
  }
  if (size < 0 && error.empty() && receiving) {
    error = fmt::format("node {} (rank {}) could not read {}", sourceNode, source, name);
  }
  agree(error, fmt::format("copying checkpoint step {} from node {} to node(s) {}", step, sourceNode,
                           fmt::join(lacking, ", ")));
}

std::optional<RestoredCheckpoint> Checkpointer::Impl::restore() {
  waitPending();
  // 1. Each node's newest verified step (Note [Restore agreement]).
  std::string scanError, firstBad;
  int64_t best = -1, found = 0;
  if (writer) {
    try {
      best = newestVerified(firstBad, found);
    } catch (const std::exception& e) {
      scanError = e.what();
    }
  }
  agree(scanError, "scanning the checkpoint directory");
  auto bests = allgather(best);
  auto counts = allgather(found);
  const int64_t step = *std::max_element(bests.begin(), bests.end());
  if (step < 0) {
    std::vector<std::string> holders;
    for (int r = 0; r < world; ++r) {
      if (counts[r] > 0) holders.push_back(fmt::format("node {} (rank {}): {}", nodeOf[r], r, counts[r]));
    }
    DTRAIN_CHECK_T(CheckpointError, holders.empty(),
                   "rank {}/{}: checkpoints exist but none verifies on any node (files on {}){}. "
                   "HINT: `checkpoint verify {}` names the damage; move the damaged files away to "
                   "start from scratch",
                   rank, world, fmt::join(holders, "; "),
                   firstBad.empty() ? "" : "; here: " + firstBad, dir);
    return std::nullopt;
  }
  // 2. Nodes without it get a copy.
  copyToNodesLacking(step, bests);
  // 3. Every rank reads its node's copy.
  RestoredCheckpoint result;
  result.step = step;
  result.path = dir + "/" + checkpoint::stepFileName(step);
  result.copiedFromPeer = bests[writerOf.at(nodeRank)] != step;
  std::string error;
  try {
    auto reader = checkpoint::CheckpointReader::open(result.path);
    const auto& h = reader.header();
    result.epoch = h.epoch;
    result.savedWorldSize = static_cast<int>(h.worldSize);
    const bool same = static_cast<int>(h.worldSize) == world;
    DTRAIN_CHECK_T(CheckpointError, same || options.allowWorldSizeChange,
                   "{} was saved by a job of world size {}, this job has world size {}. HINT: "
                   "set CheckpointOptions::allowWorldSizeChange to resume at another world size "
                   "(the sampler re-shards the rest of the epoch exactly)",
                   result.path, h.worldSize, world);
    checkpoint::checkRestorable(reader, registry);
    checkpoint::restoreReplicated(reader, registry, owner.metadata_, same);
    checkpoint::restoreRankState(reader, registry, static_cast<uint32_t>(rank), same);
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree(error, fmt::format("restoring checkpoint step {}", step));
  DTRAIN_LOG(Info, "rank {}: restored step {} (epoch {}) from {}{}", rank, step, result.epoch,
             result.path, result.copiedFromPeer ? " (copied from another node)" : "");
  return result;
}

}  // namespace dtrain
