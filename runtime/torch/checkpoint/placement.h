#pragma once
// Placement: where a Checkpointer's ranks are -- the node each runs on, the rank that writes each
// node's directory -- and the small collectives and agreements that the Checkpointer's other
// parts (saver.h, restorer.h, shard_exchange.h) make over them; every rank calls them in the same
// order. Private to the torch layer.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/agreement.h"
#include "dtrain/torch/checkpoint.h"
#include "dtrain/torch/process_group.h"

namespace dtrain::checkpoint {

// Note [Checkpoint agreement] over the group's collectives, each with the deadline as its own
// timeout: for groups that have no store (made over a communicator). agreement.cpp.
std::unique_ptr<Agreement> collectiveAgreement(std::shared_ptr<ProcessGroup> group);

struct Placement {
  // This rank, its node and local rank: CheckpointOptions::nodeId and localRank where set, else
  // the environment and the group. Not collective.
  Placement(std::shared_ptr<ProcessGroup> group, const CheckpointOptions& options);

  int rank = 0;
  int world = 1;
  int nodeId = 0;  // DTRAIN_NODE_ID, else GROUP_RANK (or the option)
  int localRank = 0;
  std::vector<int> nodeOf;      // per rank: its node's id
  std::map<int, int> writerOf;  // node id -> the rank that writes its directory (local rank 0)
  bool writer = false;          // this rank writes its node's directory

  // Collective (the Checkpointer's constructor): which node each rank is on, which rank writes
  // each node's directory, and the agreement the ranks use.
  void place();
  // Collective over the group's new members, after it re-formed (Note [A Checkpointer follows
  // its group's epoch], checkpointer.cpp): this rank's rank and world size again, then place().
  void refresh();

  // --- collectives on small values (every rank calls them in the same order) ---
  // Every rank's `value`, in rank order (the group's collective: for values every rank has at
  // hand, never after long local work).
  std::vector<int64_t> allgather(int64_t value);
  // Note [Checkpoint agreement]: the job's store when there is one (init() connects it, or
  // CheckpointOptions::store), else the group's collectives with a per-call timeout.
  std::unique_ptr<Agreement> agreement;
  // How long a rank waits for the others to report: the checkpoint's timeout, which bounds every
  // writer's own wait, and a grace for the writer to report.
  Millis deadline() const;
  // Throws on every rank when any rank's `error` is non-empty: a CheckpointError naming the
  // ranks (and nodes) that failed, with this rank's own error when it is one of them.
  void agree(const std::string& error, const std::string& what);
  // The same from reports already exchanged: `mine` is this rank's error (empty when it did not
  // fail); the ranks listed are those whose code is `code`.
  void throwIfFailed(const std::vector<Report>& reports, int64_t code, const std::string& mine,
                     const std::string& what);
  // Each rank's bytes, in rank order (allgather of lengths, then of the padded bytes).
  std::vector<std::vector<uint8_t>> allgatherBytes(const std::vector<uint8_t>& mine);

  std::shared_ptr<ProcessGroup> group;
  CheckpointOptions options;  // its store and timeout
};

}  // namespace dtrain::checkpoint
