#pragma once
// Membership epochs: the launcher's decision that a job goes on without a lost node, and how every
// surviving worker reads it. Torch-free and internal to this tree: the master writes it
// (launcher/cluster/master), the runtime reads it (runtime/comm/membership_watcher.*); both
// spell the keys and the value from here.
//
// Note [Membership epochs]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Under `launch --on-node-loss continue` a round starts at epoch 0: the round's plan. When a node
// is lost and enough remain, the master writes epoch E+1 -- the nodes left, in the plan's order,
// with their ranks renumbered from 0 -- to the round's key "launch/epoch" (one writer: the
// master). Every worker of a survivor watches that key with a blocking wait on a store
// connection of its own, so the decision reaches it within one store round trip; it aborts its
// communicators, and builds new ones among the members under the store prefix "epoch<E>/", so a
// late message of an older epoch can never be taken for one of the new. Each rank adds 1 to
// "launch/epoch<E>/formed" once its communicators of epoch E are built: the master counts the
// re-form done when the counter reaches the epoch's world size, and a loss before that ends the
// round the old way (a restart).
//
// An epoch that takes nodes into the running round (`--on-node-join live`) names how many of its
// ranks are new ("joining"). It takes effect only once all of them are ready: each newcomer's
// worker adds 1 to "launch/epoch<E>/ready" when its program reaches its first step (until then it
// holds no communicator: Note [Admission when ready] in runtime/comm/world_reform.cpp), and a
// member's watcher reports the epoch only when the counter reaches that number; the member then
// re-forms at its next step boundary (Note [Joins at step boundaries] there). The members train
// on meanwhile: they wait out the re-form, not the newcomers' start-up.
//
// The master cancels a join not yet in effect (a member or a newcomer lost meanwhile) by adding
// -kJoinCancelled to its ready counter: the returned value tells it at once whether every joining
// rank had counted already (then the join took effect, and a loss is one during a re-form), and
// a counter below 0 tells a member's watcher and every newcomer that the epoch never takes
// effect. The master then writes a newer epoch -- the survivors, joining none -- and once they
// have re-formed, one that takes the newcomers in again; a newcomer waits for an epoch that names
// it among its joining ranks and counts itself ready there (its rank may have moved).

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::membership {

// Keys, relative to the round's prefix "round<R>/" (a worker's store view is the round's).
std::string epochKey();            // "launch/epoch": the master's latest epoch (encodeEpoch)
std::string formedKey(int epoch);  // "launch/epoch<E>/formed": counter of ranks re-formed
std::string readyKey(int epoch);   // "launch/epoch<E>/ready": counter of joining ranks ready
// Added (negated) to a ready counter by the master to cancel the join: far below any count.
constexpr int64_t kJoinCancelled = int64_t{1} << 40;
// The store prefix of epoch E's communicators: "epoch<E>" (epoch 0 has none: today's keys).
std::string epochPrefix(int epoch);

// One member node of an epoch: ranks [rankOffset, rankOffset + localWorldSize).
struct EpochNode {
  std::string node;  // DTRAIN_NODE_ID
  int rankOffset = 0;
  int localWorldSize = 1;
};

struct Epoch {
  int epoch = 0;
  int worldSize = 0;
  std::vector<EpochNode> nodes;  // in rank order
  // Why this epoch began, for logs and errors: "node 2 (h3) went silent".
  std::string why;
  // Ranks of this epoch new to the round (taken in live): it takes effect once that many have
  // added themselves to readyKey(epoch). 0: at once (a loss).
  int joining = 0;
  // The rank of local rank `localRank` of node `node` in this epoch; -1 when not a member.
  int rankOf(const std::string& node, int localRank) const;
};

// "E\n" + JSON {"epoch", "world_size", "nodes": [[node, rank_offset, local_world_size], ...],
// "why"[, "joining"]}: the epoch number first, so a reader that only needs it stops at the
// newline.
std::string encodeEpoch(const Epoch& epoch);
// Throws InvalidArgument naming what is malformed: a bad number, missing fields, ranks that do
// not cover [0, world_size) in order.
Epoch decodeEpoch(const std::string& text);

}  // namespace dtrain::membership
