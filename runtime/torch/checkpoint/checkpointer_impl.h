#pragma once
// Checkpointer::Impl: the state behind dtrain::Checkpointer, shared by checkpointer.cpp
// (placement, saves, preemption) and restore.cpp. Private to the torch layer.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <set>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "checkpoint/agreement.h"
#include "checkpoint/file_io.h"
#include "state.h"
#include "dtrain/torch/checkpoint.h"
#include "dtrain/torch/process_group.h"

namespace dtrain {

// Finished writes, appended by the save thread and taken by the training thread.
struct WriteLog {
  std::mutex mutex;
  std::vector<CheckpointWrite> finished;  // guarded by mutex
};

// Note [Checkpoint agreement] over the group's collectives, each with the deadline as its own
// timeout: for groups that have no store (made over a communicator). agreement.cpp.
std::unique_ptr<checkpoint::Agreement> collectiveAgreement(std::shared_ptr<ProcessGroup> group);

struct Checkpointer::Impl {
  Impl(Checkpointer& owner, std::shared_ptr<ProcessGroup> group, const CheckpointOptions& options);

  // --- placement (constructor) ---
  int rank = 0;
  int world = 1;
  int nodeId = 0;                    // DTRAIN_NODE_ID, else GROUP_RANK (or the option)
  int localRank = 0;
  std::vector<int> nodeOf;           // per rank: its node's id
  std::map<int, int> writerOf;       // node id -> the rank that writes its directory (local rank 0)
  bool writer = false;               // this rank writes its node's directory

  // Collective (the constructor): which node each rank is on, which rank writes each node's
  // directory, and the agreement the ranks use.
  void place();

  // --- collectives on small values (every rank calls them in the same order) ---
  // Every rank's `value`, in rank order (the group's collective: for values every rank has at
  // hand, never after long local work).
  std::vector<int64_t> allgather(int64_t value);
  // Note [Checkpoint agreement]: the job's store when there is one (init() connects it, or
  // CheckpointOptions::store), else the group's collectives with a per-call timeout.
  std::unique_ptr<checkpoint::Agreement> agreement;
  // How long a rank waits for the others to report: the checkpoint's timeout, which bounds every
  // writer's own wait, and a grace for the writer to report.
  checkpoint::Millis deadline() const;
  // Throws on every rank when any rank's `error` is non-empty: a CheckpointError naming the
  // ranks (and nodes) that failed, with this rank's own error when it is one of them.
  void agree(const std::string& error, const std::string& what);
  // The same from reports already exchanged: `mine` is this rank's error (empty when it did not
  // fail); the ranks listed are those whose code is `code`.
  void throwIfFailed(const std::vector<checkpoint::Report>& reports, int64_t code,
                     const std::string& mine, const std::string& what);
  // Each rank's bytes, in rank order (allgather of lengths, then of the padded bytes).
  std::vector<std::vector<uint8_t>> allgatherBytes(const std::vector<uint8_t>& mine);

  // --- saves ---
  void save(int64_t step, int64_t epoch, bool async);
  void waitPending();  // collective
  // Waits for the all-gathers the sharded optimizers' last step left running (Note [Deferred
  // all-gathers]): the parameters are then the last step's on every rank.
  void settleShardedParameters();
  // Local only: waits for the save thread and returns its error ("" when none).
  std::string collectLocal();
  // Local only: waits (bounded) for what the save thread does after a commit (pruning), so that
  // this node's directory holds what the last commit left. False when it did not end in time.
  bool settleSaveThread();
  // The writer's part of a save: starts writing, committing and pruning `step` on the save
  // thread; returns why it could not ("" when it started). `blobs`: every rank's own state.
  std::string startWrite(int64_t step, int64_t epoch, bool async,
                         const std::vector<std::vector<uint8_t>>& blobs);
  // What the file holds: the replicated items, then every rank's own, then the shards this node
  // keeps (`shards`: owner rank -> its blob).
  std::vector<checkpoint::Item> itemsToSave(const std::vector<std::vector<uint8_t>>& blobs);
  std::vector<std::pair<int, at::Tensor>> shards;  // of the save being started (writers)

  // --- sharded optimizers (sharded_checkpointer.cpp, Note [Sharded checkpoint files]) ---
  bool sharded() const { return !registry.sharded.empty(); }
  // Collective: every rank's records go to the writers that keep them (shardKeepers()), over a
  // subgroup per rank built at the first save. Returns what this rank keeps (writers only).
  std::vector<std::pair<int, at::Tensor>> exchangeShards();
  void buildKeeperGroups();
  std::vector<std::vector<int>> keepers;                   // per rank: the writers keeping it
  std::vector<std::shared_ptr<ProcessGroup>> keeperGroups;  // per rank: null when not a member
  bool keeperGroupsBuilt = false;
  bool subgroups = true;  // false: the backend has none; broadcast over the whole group
  // Restore: which writers hold whose shards, per step, from every node's manifests; drops the
  // steps whose shards are not all somewhere from `mine` (writers).
  struct ShardHolders {
    std::map<int64_t, std::map<uint32_t, std::vector<int>>> holders;  // step -> owner -> writers
    std::map<int64_t, uint32_t> savedWorld;                           // step -> its world size
    // Step -> why it is incomplete: the ranks whose shards no node holds, the nodes searched.
    // The same on every rank.
    std::map<int64_t, std::string> incomplete;
  };
  ShardHolders listShardHolders(std::vector<int64_t>& mine);
  // After the replicated state of `step` was read: gathers and loads the sharded state. False
  // (`why` says what) when some rank's shards are intact nowhere: the step is dropped everywhere.
  bool loadShards(int64_t step, const ShardHolders& holders, std::string& why);
  // Writes the checkpoint file at a temporary path, on the save thread, saying how far it got.
  using FileWrite = std::function<void(const std::string& tmpPath, checkpoint::SaveProgress*)>;
  // Copies `items` into the reused snapshot region now (training may change them as soon as this
  // returns) and writes the file from there.
  FileWrite snapshotWrite(const std::shared_ptr<checkpoint::Layout>& layout,
                          const std::vector<checkpoint::Item>& items, checkpoint::Hashing hashing);
  // Writes the file straight from `items` (host and contiguous), which it takes over.
  FileWrite directWrite(const std::shared_ptr<checkpoint::Layout>& layout,
                        std::vector<checkpoint::Item>& items);
  // On the save thread: runs `write` and commits (checkpoint::writeAndCommit), records the finished
  // write for finishedWrites(), then -- once the waiter has been released -- prunes. A
  // `background` save's thread yields the CPU to training (Note [Background saves yield]).
  void startSaveThread(int64_t step, FileWrite write, bool background);
  // Sharded saves: LATEST moves after every node's commit was agreed, then the ranks agree again.
  void moveLatestEverywhere(int64_t step);

  // --- restore (restore.cpp) ---
  std::optional<RestoredCheckpoint> restore();
  // This node's checkpoints whose header and manifest are intact, newest first (writers only).
  std::vector<int64_t> candidates(std::string& firstBad, int64_t& found);
  // False when the node that would hand the step out cannot (its copy is damaged or unreadable):
  // that node drops the step (`bad` there) and the caller repeats the round.
  bool copyToNodesLacking(int64_t step, const std::vector<int64_t>& best, std::set<int64_t>& bad);
  // The source's side of a copy: verifies the file it is about to hand out and opens it (`fd`).
  // Returns its size, or -1 when it cannot read it (`error` says why), -2 when it is damaged.
  int64_t openCopySource(const std::string& path, int& fd, std::string& error);
  // Broadcasts the `size` bytes of `source`'s `sourceFd`; a receiving writer (`fd` >= 0) writes
  // them to `tmp`. Local failures go to `error`; every rank takes part in every broadcast.
  void broadcastFile(int source, int sourceFd, int64_t size, int fd, const std::string& tmp,
                     const std::string& name, std::string& error);
  // One round of the restore: reads `step`, which every node now holds, and agrees on how it
  // went. Returns the result, or nullopt after damage was found (`bad`, `damagedBefore` updated).
  std::optional<RestoredCheckpoint> tryStep(int64_t step, const std::vector<int64_t>& bests,
                                            std::set<int64_t>& bad,
                                            std::set<int64_t>& damagedBefore,
                                            std::string& lastDamage);
  // The receiver's side: syncs and closes `fd`, verifies the copy at `tmp` and commits it as this
  // node's `step` (checkpoint::commitStep); removes it when anything failed.
  void commitCopy(int fd, const std::string& tmp, int64_t step, std::string& error);
  // When no step is intact anywhere: throws if any node holds checkpoint files at all (`counts`,
  // per rank), rather than start from scratch. `incomplete`: why the newest sharded step whose
  // shards are not all somewhere was passed over ("" when none was); the refusal names it, and
  // says damage only when some was found (`lastDamage`).
  void refuseIfAnyExists(const std::vector<int64_t>& counts, const std::string& lastDamage,
                         const std::string& incomplete);
  // Reads result.path into what is registered; fills the result's epoch and world size. Returns
  // how it went (read, damaged, refused: restore.cpp), with the error.
  int64_t readInto(RestoredCheckpoint& result, std::string& error);

  Checkpointer& owner;
  std::shared_ptr<ProcessGroup> group;
  CheckpointOptions options;
  std::string dir;  // this node's directory
  checkpoint::Registry registry;
  std::shared_ptr<checkpoint::FileOps> ops;  // counts I/O calls over the process's saves
  checkpoint::SaveThread thread;
  bool started = false;         // this rank started the pending save's thread
  int64_t pendingStep = -1;     // an asynchronous save not yet waited for
  std::string pendingError;     // why it could not even start, on this rank
  // Asynchronous saves run in the idle scheduling class until training once had to wait for one
  // (Note [Background saves yield] in file_io.h); then at nice +10. It changes only when a save
  // finds the pending one running, so it is also the pending save's class.
  bool idleClassSaves = true;
  // The newest step every node is known to hold complete: the last save every rank agreed on, or
  // the step restore() loaded. Saving it again writes nothing (the same on every rank).
  int64_t committedStep = -1;
  at::Tensor region;            // the asynchronous snapshot: reused, pre-faulted host memory
  std::shared_ptr<std::vector<uint8_t>> scratch;  // gathering buffer of synchronous saves
  bool signalInstalled = false;
  std::shared_ptr<WriteLog> writes = std::make_shared<WriteLog>();  // shared with the save thread
};

}  // namespace dtrain
