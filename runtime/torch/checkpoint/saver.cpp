#include "saver.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <utility>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/version.h>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "shard_entries.h"
#include "shard_exchange.h"

namespace dtrain::checkpoint {

namespace {

bool allHostContiguous(const std::vector<checkpoint::Item>& items) {
  for (const auto& item : items) {
    if (item.tensor.defined() && (!item.tensor.device().is_cpu() || !item.tensor.is_contiguous())) {
      return false;
    }
  }
  return true;
}

const void* hostData(const checkpoint::Item& item) {
  if (item.spec.kind == checkpoint::Kind::String || item.spec.kind == checkpoint::Kind::Bytes) {
    return item.bytes.empty() ? nullptr : item.bytes.data();
  }
  return item.tensor.numel() ? item.tensor.data_ptr() : nullptr;
}

}  // namespace

Saver::Saver(Placement& placement, ShardExchange& exchange, state::Registry& registered,
             const CheckpointOptions& options, std::string dir, std::shared_ptr<FileOps> ops)
    : placement_(placement),
      exchange_(exchange),
      registered_(registered),
      options_(options),
      dir_(std::move(dir)),
      ops_(std::move(ops)),
      scratch_(std::make_shared<std::vector<uint8_t>>()) {}

std::string Saver::collectLocal() {
  try {
    thread_.wait(options_.timeout);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

bool Saver::settleSaveThread() {
  if (thread_.settle(options_.timeout)) return true;
  DTRAIN_LOG(Warn, "rank {}: pruning old checkpoints in {} has not ended within {} ms",
             placement_.rank, dir_, options_.timeout.count());
  return false;
}

void Saver::waitPending() {
  if (pendingStep_ < 0) return;
  std::string error = pendingError_;
  if (started_ && error.empty()) error = collectLocal();
  started_ = false;
  int64_t step = pendingStep_;
  pendingStep_ = -1;
  pendingError_.clear();
  try {
    placement_.agree(error, fmt::format("the checkpoint of step {}", step));
  } catch (const MembershipChanged&) {
    // A node was lost before every rank reported: the save stays pending (this rank's part is
    // collected), and the ranks left agree on it in their new world (Note [A Checkpointer
    // follows its group's epoch], checkpointer.cpp).
    pendingStep_ = step;
    pendingError_ = error;
    throw;
  }
  if (sharded()) moveLatestEverywhere(step);
  committedStep_ = step;
}

// A save, on every rank, in four steps:
//   1. agree: the previous asynchronous save is confirmed on every node (or its error thrown);
//      a step that every node holds already is done;
//   2. gather: every rank's own state goes to its node's writer (one allgather);
//   3. write and commit: the writer writes `step-N` on the save thread
//      (checkpoint::writeAndCommit), then, once the waiter has been released, prunes;
//   4. agree again that every node committed (Note [Checkpoint agreement]): at once for save(),
//      at the next save, wait() or preempted() for saveAsync().
void Saver::save(int64_t step, int64_t epoch, bool async) {
  DTRAIN_CHECK_ARG(step >= 0 && epoch >= 0, "Checkpointer: step {} and epoch {} must be >= 0", step,
                   epoch);
  if (started_ && idleClassSaves_ && thread_.running()) {
    // See Note [Background saves yield].
    idleClassSaves_ = false;
    DTRAIN_LOG(Info,
               "rank {}: the asynchronous save of step {} was still running when the save "
               "of step {} began: this machine leaves its idle-class thread too little CPU, so "
               "later asynchronous saves run at nice +10",
               placement_.rank, pendingStep_, step);
  }
  waitPending();
  settleShardedParameters(registered_);
  if (step == committedStep_) {
    // saveAsync(S) then preempted(S), or save(S) right after restoring S: every node holds S
    // complete, and writing it again would only spend the grace period (and rename over it).
    DTRAIN_LOG(Info, "rank {}: step {} is committed on every node already; not writing it again",
               placement_.rank, step);
    return;
  }
  auto blobs = placement_.allgatherBytes(checkpoint::encodeRankState(registered_));
  if (sharded()) shards_ = exchange_.exchangeShards();  // See Note [Sharded checkpoint files].
  const std::string error = placement_.writer ? startWrite(step, epoch, async, blobs)
                                              : std::string();
  pendingStep_ = step;
  pendingError_ = error;
  if (!async) waitPending();
}

std::string Saver::startWrite(int64_t step, int64_t epoch, bool async,
                              const std::vector<std::vector<uint8_t>>& blobs) {
  if (!thread_.idle() && !thread_.running()) {
    // A save that timed out earlier has finished since: collect it before starting another.
    std::string late = collectLocal();
    DTRAIN_LOG(Warn, "rank {}: a save that timed out earlier has ended{}", placement_.rank,
               late.empty() ? " successfully" : ": " + late);
  }
  if (thread_.running()) {
    // An earlier save timed out and is still stuck in the kernel: its buffer is not free.
    return fmt::format("an earlier save into {} is still running (it timed out and never "
                       "finished); not starting another. HINT: check the disk or filesystem",
                       dir_);
  }
  if (!settleSaveThread()) {
    return fmt::format("deleting old checkpoints in {} after the last save has not ended within "
                       "{} ms; not starting another. HINT: check the disk or filesystem",
                       dir_, options_.timeout.count());
  }
  try {
    auto items = itemsToSave(blobs);
    std::vector<checkpoint::EntrySpec> specs;
    for (const auto& item : items) specs.push_back(item.spec);
    auto layout = std::make_shared<checkpoint::Layout>(checkpoint::planLayout(
        step, epoch, static_cast<uint32_t>(placement_.world), TORCH_VERSION, specs));
    const bool snapshot = async || !allHostContiguous(items);
    // Note [Hashing beside the write]: a second thread only when the caller waits for the save.
    const auto hashing = async ? checkpoint::Hashing::Inline : checkpoint::Hashing::Beside;
    startSaveThread(
        step, snapshot ? snapshotWrite(layout, items, hashing) : directWrite(layout, items), async);
    started_ = true;
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::vector<checkpoint::Item> Saver::itemsToSave(const std::vector<std::vector<uint8_t>>& blobs) {
  const checkpoint::Registry registry = checkpoint::registryOf(registered_);
  auto items = checkpoint::replicatedItems(registry, registered_.metadata);
  for (int r = 0; r < placement_.world; ++r) {
    auto own = checkpoint::rankItems(static_cast<uint32_t>(r), blobs[r]);
    items.insert(items.end(), std::make_move_iterator(own.begin()),
                 std::make_move_iterator(own.end()));
  }
  if (sharded()) {
    auto replicated = checkpoint::shardedReplicatedItems(registered_.sharded);
    items.insert(items.end(), std::make_move_iterator(replicated.begin()),
                 std::make_move_iterator(replicated.end()));
    const checkpoint::ModuleShards freed = checkpoint::moduleShards(registry);
    for (const auto& [owner, blob] : std::exchange(shards_, {})) {
      auto kept = checkpoint::shardItems(static_cast<uint32_t>(owner),
                                         static_cast<uint32_t>(placement_.world), blob, freed);
      items.insert(items.end(), std::make_move_iterator(kept.begin()),
                   std::make_move_iterator(kept.end()));
    }
  }
  return items;
}

Saver::FileWrite Saver::snapshotWrite(const std::shared_ptr<checkpoint::Layout>& layout,
                                      const std::vector<checkpoint::Item>& items,
                                      checkpoint::Hashing hashing) {
  // Snapshot into the reused region: the training thread's only cost of an async save.
  // The region starts where its bulk can be written with O_DIRECT (Note [Direct writes]).
  const uint64_t bytes = std::max<uint64_t>(layout->header.dataSize, 1) +
                         checkpoint::kDirectAlignment;
  if (!region_.defined() || static_cast<uint64_t>(region_.numel()) < bytes) {
    auto byteOptions = at::TensorOptions().dtype(at::kByte);
    region_ = at::empty({static_cast<int64_t>(bytes + bytes / 8)}, byteOptions);
    if (placement_.group->device().is_cuda()) region_ = region_.pin_memory();
    region_.zero_();  // pre-fault: first touch of fresh pages is what costs
  }
  uint8_t* base = checkpoint::directRegionStart(static_cast<uint8_t*>(region_.data_ptr()),
                                                layout->header.dataOffset);
  at::NoGradGuard noGrad;
  auto copy = [&](size_t i) {
    const auto& e = layout->entries[i];
    uint8_t* dst = base + (e.offset - layout->header.dataOffset);
    uint64_t next = i + 1 < items.size() ? layout->entries[i + 1].offset
                                         : layout->header.manifestOffset;
    const at::Tensor& t = items[i].tensor;
    if (t.defined() && !(t.device().is_cpu() && t.is_contiguous())) {
      at::from_blob(dst, t.sizes(), t.options().device(at::kCPU)).copy_(t);
    } else if (e.size) {
      std::memcpy(dst, hostData(items[i]), e.size);
    }
    std::memset(dst + e.size, 0, next - e.offset - e.size);
  };
  if (allHostContiguous(items)) {
    // Training waits for this copy: spread it over the program's thread budget.
    checkpoint::forEachSpread(
        items.size(), [&](size_t i) { return layout->entries[i].size; }, copy);
  } else {
    for (size_t i = 0; i < items.size(); ++i) copy(i);
  }
  at::Tensor keep = region_;
  auto fileOps = ops_;
  return [fileOps, layout, keep, base, hashing](const std::string& tmp,
                                                checkpoint::SaveProgress* progress) {
    checkpoint::writeCheckpointFileFromRegion(*fileOps, tmp, *layout, base, progress, hashing);
  };
}

Saver::FileWrite Saver::directWrite(const std::shared_ptr<checkpoint::Layout>& layout,
                                    std::vector<checkpoint::Item>& items) {
  auto held = std::make_shared<std::vector<checkpoint::Item>>(std::move(items));
  auto fileOps = ops_;
  auto buffer = scratch_;
  return
      [fileOps, layout, held, buffer](const std::string& tmp, checkpoint::SaveProgress* progress) {
        checkpoint::EntryData data;
        for (const auto& item : *held) data.push_back(hostData(item));
        checkpoint::writeCheckpointFile(*fileOps, tmp, *layout, data, *buffer, progress);
      };
}

void Saver::startSaveThread(int64_t step, FileWrite write, bool background) {
  auto fileOps = ops_;
  std::string directory = dir_;
  int keep = options_.keepLast;
  auto log = writes_;
  const bool latest = !sharded();  // a sharded save moves LATEST after the agreement
  const bool idle = background && idleClassSaves_;
  auto job = [fileOps, directory, step, write, log, background, idle,
              latest](checkpoint::SaveProgress& progress) {
    // See Note [Background saves yield].
    const bool ranIdle = idle && checkpoint::moveThisThreadToIdleClass();
    if (background && !ranIdle) checkpoint::lowerThisThreadsPriority();
    const auto begin = std::chrono::steady_clock::now();
    checkpoint::writeAndCommit(
        *fileOps, directory, step, [&](const std::string& tmp) { write(tmp, &progress); },
        &progress, latest);
    CheckpointWrite done;
    done.step = step;
    done.idleClass = ranIdle;
    done.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    std::error_code ec;
    const auto size = std::filesystem::file_size(directory + "/" + checkpoint::stepFileName(step),
                                                 ec);
    done.bytes = ec ? 0 : static_cast<uint64_t>(size);
    std::lock_guard<std::mutex> lock(log->mutex);
    log->finished.push_back(done);
  };
  // Pruning is nobody's wait: it runs after the commit has released save(), wait() or the next
  // save's agreement (Note [Checkpoint directory], step 4).
  auto prune = [directory, keep, step] { checkpoint::pruneCheckpoints(directory, keep, step); };
  thread_.start(fmt::format("the checkpoint of step {} into {}", step, dir_), job, prune);
}

void Saver::moveLatestEverywhere(int64_t step) {
  std::string error;
  if (placement_.writer) {
    try {
      checkpoint::pointLatest(*ops_, dir_, step);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  placement_.agree(error, fmt::format("moving LATEST to step {} once every node held its shards "
                                      "and their replicas",
                                      step));
}

std::vector<CheckpointWrite> Saver::finishedWrites() {
  std::lock_guard<std::mutex> lock(writes_->mutex);
  return std::exchange(writes_->finished, {});
}

}  // namespace dtrain::checkpoint
