#pragma once
// Restorer: a Checkpointer's restore (Note [Restore agreement], restorer.cpp) -- every node's
// intact candidates, the newest step any node holds, a copy to the nodes lacking it, the read
// into what is registered, and the agreement on how it went; damage makes the ranks try again
// with what is left. Private to the torch layer.

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/file_io.h"
#include "dtrain/torch/checkpoint.h"
#include "placement.h"
#include "state.h"

namespace dtrain::checkpoint {

class Saver;
class ShardExchange;

class Restorer {
 public:
  // `dir`: this node's directory; `ops` counts I/O calls over the process's saves and copies.
  Restorer(Placement& placement, Saver& saver, ShardExchange& exchange, state::Registry& registered,
           const CheckpointOptions& options, std::string dir, std::shared_ptr<FileOps> ops);

  // Collective: Checkpointer::restore().
  std::optional<RestoredCheckpoint> restore();

 private:
  bool sharded() const { return !registered_.sharded.empty(); }
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
  // how it went (read, damaged, refused: restorer.cpp), with the error.
  int64_t readInto(RestoredCheckpoint& result, std::string& error);

  Placement& placement_;
  Saver& saver_;
  ShardExchange& exchange_;
  state::Registry& registered_;
  const CheckpointOptions& options_;
  const std::string dir_;
  std::shared_ptr<FileOps> ops_;
};

}  // namespace dtrain::checkpoint
