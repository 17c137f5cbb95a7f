#pragma once
// What the master does when a node of the running round is lost under `launch --on-node-loss
// continue`: go on without it in the next membership epoch, or fall back to today's restart --
// a pure function of what the master knows (decideNodeLoss), and the epoch it writes
// (epochWithout). The Coordinator (coordinator_round.cpp) gathers the facts and writes the keys.
//
// Note [Node loss]
// ~~~~~~~~~~~~~~~~
// A node of the running round is lost when its agent's heartbeat goes silent, its agent (or its
// ssh session) ends, or its workers are killed by a signal launch did not send (its agent reports
// "node_lost"). Under --on-node-loss continue the master then writes the round's next epoch
// (Note [Membership epochs] in runtime/base/membership.h) instead of its stop key, and the
// survivors go on. It falls back to the restart path -- the stop key, a restart while
// --max-restarts lasts -- saying why in one line, when:
//   - fewer than the minimum of --nnodes MIN:MAX would remain;
//   - a worker exits with a non-zero code of its own (a program bug must not evict node after
//     node: that agent writes the stop key as today, and the master never sees a node loss) --
//     unless the round went on without that worker's node already (Note [Left out of a running
//     round] in launcher/cluster/agent/agent.cpp: its workers end because they are out);
//   - a node is lost while the last re-form is in progress (its formed counter has not reached
//     the epoch's world size; for a join, once every newcomer counted ready), or a re-form is not
//     complete within --heartbeat-timeout + 30 s;
//   - it would be more than --max-reforms re-forms within --reform-window seconds;
//   - the lost node hosts the store (node rank 0 of a manual job): the coordinator and the store
//     go with it, so nothing is left to decide -- every agent loses the store instead.

//
// Note [Joining a running round]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Under --on-node-join live (with --on-node-loss continue) a node that comes to join while the
// running round has fewer than MAX of --nnodes MIN:MAX members is taken into that round instead
// of stopping it: the master writes the next epoch -- the members in their order, then the
// newcomers, so no member's rank moves, its `joining` their ranks -- and rewrites launch/state's
// plan as that epoch sees the round (planOfEpoch: its members, the epoch's ranks and world size,
// the epoch's number). The newcomer's agent, waiting for the next round, finds itself in the
// running round's plan and starts its workers with DTRAIN_JOIN_EPOCH: their world is built in
// that epoch, without a communicator until their first TrainingState::tryStep, where each adds
// itself to the epoch's ready counter (Note [Admission when ready] in
// runtime/comm/world_reform.cpp). The members train on meanwhile: their workers take the epoch
// in only once the counter reaches its `joining` ranks (the master says "ready after N s"), then
// finish the step in flight and re-form with the newcomers at their next step boundary (Note
// [Joins at step boundaries] in runtime/comm/world_reform.cpp), and hand them their state (Note
// [Settling after a re-form]); a newcomer's first tryStep is that settling. The re-form's
// deadline starts when they are ready; before, the newcomers have the larger of --rdzv-timeout and
// --heartbeat-timeout + 30 s to reach their first step. A loss while a join is pending -- not
// every newcomer ready -- calls the join off
// (Coordinator::cancelJoin: one add to its ready counter, Note [Membership epochs], which also
// says whether the join took effect meanwhile): a lost newcomer costs the members nothing (no
// epoch is written; they never took the join in), and a lost member is a loss among the members
// -- the next epoch is theirs without it -- after whose re-form the newcomers are taken in again
// in an epoch of their own, their ranks after the survivors'; their workers follow on their own
// (Note [Admission when ready] in runtime/comm/world_reform.cpp). A loss once the join took
// effect is one during a re-form: the restart path. No newcomer is taken in while a re-form is
// in progress, nor once a member has reported (its workers ended: the job is finishing), and a
// join is not counted against --max-reforms (no node was lost). When every member has reported
// before the newcomers were ready (or taken in again), or before the step boundary that would
// have taken them in (the join ready during the members' last step or after it, which runs on),
// the round is stopped -- only the newcomers' workers were left -- and ends as the members did.
// When the master starts the agents (fan-out), it starts a left-out node's agent again every
// --heartbeat-timeout once the node's session has ended (planRejoin), until the node is taken back
// in or the job is finishing: a host that comes back (its cable in again, a spot VM restarted
// under the same name) rejoins without anyone running launch on it. An agent that outlived what
// left its node out (a partition healed in time) joins again by itself, in either mode (Note
// [Left out of a running round] in launcher/cluster/agent/agent.cpp).
// Under ZeRO the members re-shard their state for the larger world, the newcomer receiving its
// shards (docs/design.md "Sharded state across a lost node"); a program
// whose sharded optimizer is not mirrored says so in one error and the restart path takes over.

#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "launcher/cluster/protocol/rendezvous.h"
#include "launcher/config/launch_config.h"
#include "membership.h"

namespace dtrain::launcher {

// A re-form not complete within --heartbeat-timeout + this many seconds falls back to a restart.
constexpr double kReformSeconds = 30;

// How the node was lost: the cause's kind (the text goes into the epoch's `why`).
enum class LossKind {
  Silent,           // its agent's heartbeat went silent
  AgentGone,        // its agent or ssh session ended
  WorkersSignaled,  // its workers were killed by a signal launch did not send
  WorkerExited,     // a worker exited with a non-zero code of its own: never a node loss
};

struct NodeLossFacts {
  LossKind kind = LossKind::Silent;
  int nodesLeft = 0;  // nodes of the round that would remain without this one
  int minNodes = 1;   // of --nnodes MIN:MAX
  bool reformInProgress = false;
  int reformsInWindow = 0;  // re-forms already made within --reform-window
  int maxReforms = kDefaultMaxReforms;
  double reformWindow = kDefaultReformWindowSeconds;
  bool hostsStore = false;  // the lost node is node rank 0 of a manual job
};

struct NodeLossDecision {
  bool goOn = false;  // write the next epoch; else the restart path
  std::string why;    // when !goOn: why not, for the one line the master prints
};

// Note [Node loss]. Under OnNodeLoss::Restart it never goes on (why is empty: today's path).
NodeLossDecision decideNodeLoss(OnNodeLoss mode, const NodeLossFacts& facts);

// The epoch after `previous` without the nodes `lost`: the others in the plan's order, their
// ranks renumbered from 0; epoch number + 1; `why` as given.
membership::Epoch epochWithout(const membership::Epoch& previous, const std::set<std::string>& lost,
                               const std::string& why);
// Epoch 0 of a round: its plan.
membership::Epoch epochOfPlan(const RoundPlan& plan);
// The epoch after `previous` with the nodes `joining` ([node, local world size]) after its
// members (Note [Joining a running round]); epoch number + 1; `why` as given; its `joining` the
// newcomers' ranks.
membership::Epoch epochWith(const membership::Epoch& previous,
                            const std::vector<std::pair<std::string, int>>& joining,
                            const std::string& why);
// Round `plan` as epoch `e` sees it, for launch/state: e's members in its rank order, node ranks
// 0.., the epoch's rank offsets and world size, `epoch` = e's number; hosts as in `plan`.
RoundPlan planOfEpoch(const RoundPlan& plan, const membership::Epoch& e);

// The re-forms of `times` within `window` seconds before `now`.
int reformsWithin(const std::vector<std::chrono::steady_clock::time_point>& times,
                  std::chrono::steady_clock::time_point now, double window);

}  // namespace dtrain::launcher
