#pragma once
// Saver: a Checkpointer's saves -- gathering every rank's own state, writing and committing on
// the save thread (from the tensors, or from a snapshot in a reused host region), the agreement
// that every node committed, and for sharded saves LATEST moved once they all did. It owns the
// newest step known complete on every node (committedStep()), which a restore sets. Private to
// the torch layer.

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "checkpoint/file_io.h"
#include "dtrain/torch/checkpoint.h"
#include "placement.h"
#include "state.h"

namespace dtrain::checkpoint {

class ShardExchange;

// Finished writes, appended by the save thread and taken by the training thread.
struct WriteLog {
  std::mutex mutex;
  std::vector<CheckpointWrite> finished;  // guarded by mutex
};

class Saver {
 public:
  // `dir`: this node's directory; `ops` counts I/O calls over the process's saves.
  Saver(Placement& placement, ShardExchange& exchange, state::Registry& registered,
        const CheckpointOptions& options, std::string dir, std::shared_ptr<FileOps> ops);

  // Collective: Checkpointer::save() and saveAsync().
  void save(int64_t step, int64_t epoch, bool async);
  // Collective; a no-op when no save is pending (Checkpointer::wait()).
  void waitPending();
  // Local only: waits for the save thread and returns its error ("" when none).
  std::string collectLocal();
  // Local only: waits (bounded) for what the save thread does after a commit (pruning), so that
  // this node's directory holds what the last commit left. False when it did not end in time.
  bool settleSaveThread();
  // This rank started the pending save's thread.
  bool started() const { return started_; }
  // The checkpoints whose write finished since the last call, oldest first.
  std::vector<CheckpointWrite> finishedWrites();

  // The newest step every node is known to hold complete: the last save every rank agreed on, or
  // the step restore() loaded. Saving it again writes nothing (the same on every rank).
  int64_t committedStep() const { return committedStep_; }
  // Every node holds `step` complete (restore() loaded it).
  void markCommitted(int64_t step) { committedStep_ = step; }

 private:
  bool sharded() const { return !registered_.sharded.empty(); }
  // The writer's part of a save: starts writing, committing and pruning `step` on the save
  // thread; returns why it could not ("" when it started). `blobs`: every rank's own state.
  std::string startWrite(int64_t step, int64_t epoch, bool async,
                         const std::vector<std::vector<uint8_t>>& blobs);
  // What the file holds: the replicated items, then every rank's own, then the shards this node
  // keeps (`shards_`: owner rank -> its blob).
  std::vector<Item> itemsToSave(const std::vector<std::vector<uint8_t>>& blobs);
  // Writes the checkpoint file at a temporary path, on the save thread, saying how far it got.
  using FileWrite = std::function<void(const std::string& tmpPath, SaveProgress*)>;
  // Copies `items` into the reused snapshot region now (training may change them as soon as this
  // returns) and writes the file from there.
  FileWrite snapshotWrite(const std::shared_ptr<Layout>& layout, const std::vector<Item>& items,
                          Hashing hashing);
  // Writes the file straight from `items` (host and contiguous), which it takes over.
  FileWrite directWrite(const std::shared_ptr<Layout>& layout, std::vector<Item>& items);
  // On the save thread: runs `write` and commits (checkpoint::writeAndCommit), records the finished
  // write for finishedWrites(), then -- once the waiter has been released -- prunes. A
  // `background` save's thread yields the CPU to training (Note [Background saves yield]).
  void startSaveThread(int64_t step, FileWrite write, bool background);
  // Sharded saves: LATEST moves after every node's commit was agreed, then the ranks agree again.
  void moveLatestEverywhere(int64_t step);

  Placement& placement_;
  ShardExchange& exchange_;
  state::Registry& registered_;
  const CheckpointOptions& options_;
  const std::string dir_;
  std::shared_ptr<FileOps> ops_;
  SaveThread thread_;
  bool started_ = false;      // this rank started the pending save's thread
  int64_t pendingStep_ = -1;  // an asynchronous save not yet waited for
  std::string pendingError_;  // why it could not even start, on this rank
  // Asynchronous saves run in the idle scheduling class until training once had to wait for one
  // (Note [Background saves yield] in file_io.h); then at nice +10. It changes only when a save
  // finds the pending one running, so it is also the pending save's class.
  bool idleClassSaves_ = true;
  int64_t committedStep_ = -1;
  std::vector<std::pair<int, at::Tensor>> shards_;  // of the save being started (writers)
  at::Tensor region_;  // the asynchronous snapshot: reused, pre-faulted host memory
  std::shared_ptr<std::vector<uint8_t>> scratch_;  // gathering buffer of synchronous saves
  std::shared_ptr<WriteLog> writes_ = std::make_shared<WriteLog>();  // shared with the save thread
};

}  // namespace dtrain::checkpoint
