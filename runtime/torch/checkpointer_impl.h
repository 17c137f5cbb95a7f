#pragma once
// Checkpointer::Impl: the state behind dtrain::Checkpointer, shared by checkpoint.cpp (placement,
// saves, preemption) and checkpoint_restore.cpp. Private to the torch layer.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "checkpoint/file_io.h"
#include "checkpoint_state.h"
#include "dtrain/torch/checkpoint.h"
#include "dtrain/torch/process_group.h"

namespace dtrain {

// Finished writes, appended by the save thread and taken by the training thread.
struct WriteLog {
  std::mutex mutex;
  std::vector<CheckpointWrite> finished;  // guarded by mutex
};

struct Checkpointer::Impl {
  Impl(Checkpointer& owner, std::shared_ptr<ProcessGroup> group, const CheckpointOptions& options);

  // --- placement (constructor) ---
  int rank = 0;
  int world = 1;
  int nodeRank = 0;
  int localRank = 0;
  std::vector<int> nodeOf;           // per rank
  std::map<int, int> writerOf;       // node -> the rank that writes its directory (local rank 0)
  bool writer = false;               // this rank writes its node's directory

  // --- collectives on small values (every rank calls them in the same order) ---
  // Every rank's `value`, in rank order.
  std::vector<int64_t> allgather(int64_t value);
  // Throws on every rank when any rank's `error` is non-empty: a CheckpointError naming the
  // ranks (and nodes) that failed, with this rank's own error when it is one of them.
  void agree(const std::string& error, const std::string& what);
  // Each rank's bytes, in rank order (allgather of lengths, then of the padded bytes).
  std::vector<std::vector<uint8_t>> allgatherBytes(const std::vector<uint8_t>& mine);

  // --- saves ---
  void save(int64_t step, int64_t epoch, bool async);
  void waitPending();  // collective
  // Local only: waits for the save thread and returns its error ("" when none).
  std::string collectLocal();

  // --- restore (checkpoint_restore.cpp) ---
  std::optional<RestoredCheckpoint> restore();
  // This node's checkpoints whose header and manifest are intact, newest first (writers only).
  std::vector<int64_t> candidates(std::string& firstBad, int64_t& found);
  // False when the node that would hand the step out found it damaged (it joins `bad` there).
  bool copyToNodesLacking(int64_t step, const std::vector<int64_t>& best, std::set<int64_t>& bad);

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
  at::Tensor region;            // the asynchronous snapshot: reused, pre-faulted host memory
  std::shared_ptr<std::vector<uint8_t>> scratch;  // gathering buffer of synchronous saves
  bool signalInstalled = false;
  std::shared_ptr<WriteLog> writes = std::make_shared<WriteLog>();  // shared with the save thread
};

}  // namespace dtrain
