// The Coordinator's rendezvous: gathering one round's joins (Note [Coordinator loop]).
#include <optional>

#include "dtrain/base/error.h"
#include "fault.h"
#include "launcher/cluster/master/coordinator.h"
#include "launcher/exit_codes.h"
#include "launcher/seconds.h"
#include "launcher/supervisor/output.h"

namespace dtrain::launcher {

// One round's rendezvous while it is gathered (gatherJoins).
struct Coordinator::Gathering {
  int round = 0;
  Clock::time_point deadline;
  std::map<std::string, JoinInfo> joined;
  std::vector<std::string> heard;  // nodes whose join was read: they wait for the master's word
  std::optional<int> endCode;      // the job ended during the rendezvous, with this code
};

std::vector<JoinInfo> Coordinator::gatherJoins(int round, int* endCode) {
  Gathering g;
  g.round = round;
  g.deadline = after(Clock::now(), options_.rdzvTimeout);
  bool moved = true;  // the first look reads whatever joined already
  while (!rendezvousStep(g, moved)) {
    moved = awaitEvents(std::min(nextHeartbeatRead_, g.deadline));
  }
  if (g.endCode) {
    *endCode = *g.endCode;
    return {};
  }
  std::vector<JoinInfo> out;
  for (auto& [node, j] : g.joined) out.push_back(j);
  return out;
}

bool Coordinator::rendezvousStep(Gathering& g, bool eventsMoved) {
  if (int sig = signal_.load()) {
    g.endCode = end(128 + sig,
                    fmt::format("launch received {} while waiting for the nodes "
                                "(round {})",
                                fault::signalName(sig), g.round),
                    g.heard);
    return true;
  }
  for (const auto& gone : goneSince()) {
    auto j = g.joined.find(gone.node);
    markLost(gone.node, gone.why, j != g.joined.end() ? j->second.nonce : "", /*gone=*/true);
    if (j != g.joined.end()) g.joined.erase(j);
  }
  if (eventsMoved && takeJoins(g)) return true;
  // A node that joined and went silent (its agent killed, its host gone) is not planned: it is
  // dropped within the heartbeat bound, and may join again with a new agent.
  for (const auto& [node, quiet] : readHeartbeats(Clock::now())) {
    auto j = g.joined.find(node);
    if (j == g.joined.end()) continue;
    const std::string why = fmt::format("it joined round {} and went silent ({:.1f} s without a "
                                        "heartbeat, --heartbeat-timeout {:g})",
                                        g.round, quiet, options_.heartbeatTimeout);
    say(fmt::format("launch: rendezvous round {}: dropped node {} ({}): {}", g.round, node,
                    expected(node)->label, why));
    markLost(node, why, j->second.nonce, /*gone=*/false);
    g.joined.erase(j);
  }
  return rendezvousDecided(g);
}

bool Coordinator::takeJoins(Gathering& g) {
  std::vector<std::string> candidates;
  for (const auto& e : options_.nodes) {
    if (g.joined.count(e.node) == 0 && !nodes_[e.node].gone) candidates.push_back(e.node);
  }
  const auto now = Clock::now();
  for (auto& [node, j] : readJoins(g.round, candidates)) {
    g.heard.push_back(node);
    if (std::string m = versionMismatch(options_.self, j); !m.empty()) {
      g.endCode = end(kExitInfrastructure, m, g.heard);
      return true;
    }
    if (!j.error.empty()) {
      g.endCode = end(
          j.errorCode != 0 ? j.errorCode : kExitInfrastructure,
          fmt::format("node {} ({}) cannot run: {}", node, expected(node)->label, j.error),
          g.heard);
      return true;
    }
    nodes_[node].lost = false;
    tracker_.watch(node, now);
    g.joined[node] = std::move(j);
  }
  return false;
}

bool Coordinator::rendezvousDecided(Gathering& g) {
  // Waitable: every node not joined whose agent is not gone for sure (a silent one may be
  // started again by hand). Expected soon: those not known lost at all.
  size_t waitable = 0;
  size_t expectedSoon = 0;
  for (const auto& e : options_.nodes) {
    if (g.joined.count(e.node)) continue;
    const NodeState& s = nodes_[e.node];
    if (!s.gone) ++waitable;
    if (!s.lost) ++expectedSoon;
  }
  const size_t joined = g.joined.size();
  const size_t minNodes = static_cast<size_t>(options_.minNodes);
  if (joined + waitable < minNodes) {
    g.endCode = end(kExitInfrastructure,
                    fmt::format("rendezvous round {}: only {} of the {} nodes needed can join; "
                                "joined: {}; the others: {}",
                                g.round, joined + waitable, options_.minNodes, listing(g, true),
                                listing(g, false)),
                    g.heard);
    return true;
  }
  const bool timedOut = Clock::now() >= g.deadline;
  // Elastic: with MIN there, nodes known lost are not waited for (the rest may be, until the
  // timeout).
  if (joined == static_cast<size_t>(options_.maxNodes) ||
      (joined >= minNodes && (timedOut || expectedSoon == 0))) {
    if (joined < options_.nodes.size()) {
      say(fmt::format("launch: rendezvous round {}: {} of {} nodes joined{}; going on with "
                      "them (elastic --nnodes {}:{}); missing: {}",
                      g.round, joined, options_.nodes.size(),
                      timedOut ? fmt::format(" within {:g} s", options_.rdzvTimeout) : "",
                      options_.minNodes, options_.maxNodes, listing(g, false)));
    }
    return true;
  }
  if (timedOut) {
    g.endCode = end(kExitDeadline,
                    fmt::format("rendezvous timed out after {:g} s (--rdzv-timeout) in round {}: "
                                "{} of {} nodes joined; joined: {}; missing: {}. HINT: is launch "
                                "running on the missing nodes, and can they reach the store at {}?",
                                options_.rdzvTimeout, g.round, joined, options_.minNodes,
                                listing(g, true), listing(g, false), options_.storeWhere),
                    g.heard);
    return true;
  }
  return false;
}

std::string Coordinator::listing(const Gathering& g, bool joinedOnes) const {
  std::string out;
  for (const auto& e : options_.nodes) {
    if ((g.joined.count(e.node) != 0) != joinedOnes) continue;
    if (!out.empty()) out += ", ";
    out += fmt::format("node {} ({})", e.node, e.label);
    if (joinedOnes) continue;
    const NodeState& s = nodes_.at(e.node);
    out += s.lost ? ": " + s.why : ": not joined yet";
  }
  return out.empty() ? std::string("none") : out;
}

}  // namespace dtrain::launcher
