#pragma once
// How the ranks of a Checkpointer agree on a save's or a restore's outcome, torch-free: each rank
// says whether its part went well (a code, 0 for "fine"), and every rank learns which ranks
// reported something else. The store implementation is what a job under `launch` uses; the torch
// layer adds one over the process group's collectives for groups that have no store.
//
// Note [Checkpoint agreement]
// A node's writer (its local rank 0) may legitimately spend up to CheckpointOptions::timeout
// writing, fsyncing or verifying a file, while the node's other ranks -- and every rank of the
// other nodes -- have nothing to do but wait for the outcome. Waiting inside a collective would
// put that wait under the collective's own timeout (5 min by default, against the checkpoint's
// 10): a long write would time the collective out and fail the communicator for good, and on
// NCCL every rank would sit for minutes inside a GPU kernel. So every agreement that follows
// long local work goes through the job's store, with the checkpoint's deadline: rank r writes
// `<prefix>/<n>/in/<r>` and increments `<n>/arrived`; a rank with something to report first takes
// a slot of `<n>/failed` and writes "rank code" there; the last to arrive sets `<n>/done`, which
// every rank waits for. A rank that never arrives is named at the deadline (the `in` keys say
// who). Each round's keys are deleted by the last rank to arrive at the next round (everyone has
// read them by then), each rank's own `in` key by itself, so the store holds two rounds at most.
// Round numbers advance identically on every rank because every rank makes the same calls.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/base/store.h"

namespace dtrain::checkpoint {

using Millis = std::chrono::milliseconds;

// A rank that reported something other than 0.
struct Report {
  int rank = 0;
  int64_t code = 0;
  bool operator==(const Report& o) const { return rank == o.rank && code == o.code; }
};

class Agreement {
 public:
  virtual ~Agreement() = default;
  // Collective: every rank passes its code (0: fine). Returns the reports of every rank whose
  // code is not 0, in rank order, the same on every rank. Waits at most `deadline` for the
  // others; then throws TimeoutError naming `what` and the ranks that did not arrive.
  virtual std::vector<Report> exchange(int64_t code, Millis deadline, const std::string& what) = 0;
  // Collective: `root`'s value on every rank (the others' `value` is ignored), within `deadline`.
  virtual int64_t share(int root, int64_t value, Millis deadline, const std::string& what) = 0;
};

// Note [Checkpoint agreement], through `store` under `prefix` (unique per Checkpointer).
class StoreAgreement : public Agreement {
 public:
  StoreAgreement(std::shared_ptr<store::Store> store, std::string prefix, int rank, int world);
  std::vector<Report> exchange(int64_t code, Millis deadline, const std::string& what) override;
  int64_t share(int root, int64_t value, Millis deadline, const std::string& what) override;

 private:
  std::string key(int64_t round, const std::string& name) const;
  // The ranks whose `in` key of `round` is missing (asked one by one: only after a timeout).
  std::vector<int> missing(int64_t round);
  [[noreturn]] void timedOut(int64_t round, Millis deadline, const std::string& what,
                             const std::string& waitError);

  std::shared_ptr<store::Store> store_;
  std::string prefix_;
  int rank_;
  int world_;
  int64_t round_ = 0;
  std::vector<std::string> stale_;  // keys of earlier rounds, deleted by the next round's last
  std::string myStaleIn_;           // this rank's `in` key of its previous exchange
};

}  // namespace dtrain::checkpoint
