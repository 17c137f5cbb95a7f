#include "launcher/cluster/master/node_loss.h"

#include <fmt/format.h>

namespace dtrain::launcher {

NodeLossDecision decideNodeLoss(OnNodeLoss mode, const NodeLossFacts& f) {
  if (mode != OnNodeLoss::Continue) return {};
  auto fallBack = [](std::string why) { return NodeLossDecision{false, std::move(why)}; };
  // The order is what a reader needs to hear first: the loss itself cannot be taken, then the
  // job's state, then the budget.
  if (f.kind == LossKind::WorkerExited) {
    return fallBack("a worker exited with a non-zero code of its own (a program error, not a lost "
                    "node)");
  }
  if (f.hostsStore) {
    return fallBack("the lost node hosts the store and the coordinator (node rank 0 of a manual "
                    "job)");
  }
  if (f.nodesLeft < f.minNodes) {
    return fallBack(fmt::format("{} node{} would remain, fewer than the minimum {} (--nnodes)",
                                f.nodesLeft, f.nodesLeft == 1 ? "" : "s", f.minNodes));
  }
  if (f.reformInProgress) {
    return fallBack("a node was lost while the survivors were still re-forming after the last "
                    "loss");
  }
  if (f.reformsInWindow >= f.maxReforms) {
    return fallBack(fmt::format("{} re-form{} within {:g} s already (--max-reforms {}, "
                                "--reform-window {:g})",
                                f.reformsInWindow, f.reformsInWindow == 1 ? "" : "s",
                                f.reformWindow, f.maxReforms, f.reformWindow));
  }
  return NodeLossDecision{true, ""};
}

membership::Epoch epochWithout(const membership::Epoch& previous, const std::set<std::string>& lost,
                               const std::string& why) {
  membership::Epoch next;
  next.epoch = previous.epoch + 1;
  next.why = why;
  for (const auto& n : previous.nodes) {
    if (lost.count(n.node) != 0) continue;
    next.nodes.push_back(membership::EpochNode{n.node, next.worldSize, n.localWorldSize});
    next.worldSize += n.localWorldSize;
  }
  return next;
}

membership::Epoch epochWith(const membership::Epoch& previous,
                            const std::vector<std::pair<std::string, int>>& joining,
                            const std::string& why) {
  membership::Epoch next = previous;
  next.epoch = previous.epoch + 1;
  next.why = why;
  next.joining = 0;
  for (const auto& [node, size] : joining) {
    next.nodes.push_back(membership::EpochNode{node, next.worldSize, size});
    next.worldSize += size;
    next.joining += size;
  }
  return next;
}

RoundPlan planOfEpoch(const RoundPlan& plan, const membership::Epoch& e) {
  RoundPlan out = plan;
  out.nodes.clear();
  out.worldSize = e.worldSize;
  out.epoch = e.epoch;
  for (const auto& m : e.nodes) {
    PlannedNode n;
    if (const PlannedNode* p = plan.find(m.node)) n = *p;
    n.node = m.node;
    n.nodeRank = static_cast<int>(out.nodes.size());
    n.rankOffset = m.rankOffset;
    n.localWorldSize = m.localWorldSize;
    out.nodes.push_back(std::move(n));
  }
  return out;
}

membership::Epoch epochOfPlan(const RoundPlan& plan) {
  membership::Epoch e;
  e.epoch = 0;
  e.worldSize = plan.worldSize;
  for (const auto& n : plan.nodes) {
    e.nodes.push_back(membership::EpochNode{n.node, n.rankOffset, n.localWorldSize});
  }
  e.why = fmt::format("round {}'s plan", plan.round);
  return e;
}

int reformsWithin(const std::vector<std::chrono::steady_clock::time_point>& times,
                  std::chrono::steady_clock::time_point now, double window) {
  int n = 0;
  for (const auto& t : times) {
    if (std::chrono::duration<double>(now - t).count() < window) ++n;
  }
  return n;
}

}  // namespace dtrain::launcher
