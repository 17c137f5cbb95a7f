#pragma once
// What the nodes of a multi-node job tell the master about themselves through the store, in the
// key layout of Note [Monitoring keys] (dtrain/base/progress.h), on the round's view of the store:
// each node's latest sample records, and the native stacks of stuck ranks, which only the node
// that runs them can take. Single-node jobs do not use this: their launch samples itself.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/base/store.h"
#include "launcher/monitor/records.h"

namespace dtrain::launcher::monitor {

// The values of `keys` there now (tryMultiGet), a few hundred keys per request: what the master
// reads of every rank or node at once, instead of a check and a get each.
std::vector<std::optional<store::Bytes>> readExisting(store::Store& round,
                                                      const std::vector<std::string>& keys);

// An agent: node `nodeRank`'s latest records (replacing the earlier ones), then a version bump.
void publishNodeRecords(store::Store& round, int nodeRank, const std::vector<Record>& records);

// The master: the latest records of every node in [0, numNodes) but `ownNode` that has published
// any. A malformed value is skipped (and named in `problems` when given).
std::map<int, std::vector<Record>> readNodeRecords(store::Store& round, int numNodes, int ownNode,
                                                   std::vector<std::string>* problems = nullptr);

struct StackRequest {
  int64_t id = 0;
  std::vector<int> ranks;  // the stuck ranks; each node answers for those it runs
};

// The master asks for the stacks of `ranks`; returns the request's id (1, 2, ...).
int64_t requestStacks(store::Store& round, const std::vector<int>& ranks);
// An agent: the newest request if it is newer than `answered`.
std::optional<StackRequest> pendingStackRequest(store::Store& round, int64_t answered);
// An agent answers request `id` with the stacks of its ranks (rank -> text).
void answerStacks(store::Store& round, int nodeRank, int64_t id,
                  const std::map<int, std::string>& stacks);
// The master: the answers to request `id` from nodes in [0, numNodes) but `ownNode`, waiting up
// to `wait` for all of them; a node that did not answer in time is simply missing.
std::map<int, std::string> collectStacks(store::Store& round, int64_t id, int numNodes, int ownNode,
                                         std::chrono::milliseconds wait);

}  // namespace dtrain::launcher::monitor
