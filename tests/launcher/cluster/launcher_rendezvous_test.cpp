// The agent <-> master protocol: rank assignment, heartbeat bookkeeping, records that survive
// any bytes, and the Coordinator's decisions driven by fake agents (threads on a HashStore):
// version mismatch, rendezvous timeout, elastic MIN:MAX, a node that goes silent.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "dtrain/base/error.h"
#include "dtrain/base/store.h"
#include "dtrain/base/tcp_store.h"
#include "launcher/cluster/agent/heartbeat_thread.h"
#include "launcher/cluster/master/coordinator.h"
#include "launcher/cluster/protocol/rendezvous.h"

namespace dtrain::launcher::launcher_rendezvous_test {
namespace {

using namespace std::chrono_literals;

JoinInfo joinOf(const std::string& node, int requested, int workers, const std::string& addr) {
  JoinInfo j;
  j.node = node;
  j.requestedRank = requested;
  j.host = "host" + node;
  j.label = "h" + node;
  j.address = addr;
  j.localWorldSize = workers;
  j.launchVersion = "1.0";
  return j;
}

TEST(Rendezvous, RanksFollowTheRequestedOrderAndArePrefixSums) {
  RoundPlan p = assignRanks(
      3,
      {joinOf("2", 2, 1, "10.0.0.3"), joinOf("0", 0, 4, "10.0.0.1"), joinOf("1", 1, 2, "10.0.0.2")},
      8, 29500);
  ASSERT_EQ(p.nodes.size(), 3u);
  EXPECT_EQ(p.worldSize, 7);
  EXPECT_EQ(p.masterAddr, "10.0.0.1");
  EXPECT_EQ(p.nodes[1].node, "1");
  EXPECT_EQ(p.nodes[1].rankOffset, 4);
  EXPECT_EQ(p.nodes[2].rankOffset, 6);
  // Elastic: node 0 gone, ranks renumbered; at most maxNodes taken.
  p = assignRanks(4, {joinOf("2", 2, 1, "c"), joinOf("1", 1, 2, "b")}, 8, 1);
  EXPECT_EQ(p.nodes[0].node, "1");
  EXPECT_EQ(p.nodes[0].nodeRank, 0);
  EXPECT_EQ(p.masterAddr, "b");
  EXPECT_EQ(assignRanks(0, {joinOf("0", 0, 1, "a"), joinOf("1", 1, 1, "b")}, 1, 1).nodes.size(),
            1u);
  RoundPlan back = decodePlan(encodePlan(p));
  EXPECT_EQ(back.worldSize, 3);
  EXPECT_EQ(back.nodes[1].rankOffset, 2);
}

TEST(Rendezvous, HeartbeatsJudgedOnOneClock) {
  HeartbeatTracker t(3000ms);
  auto t0 = HeartbeatTracker::Clock::now();
  t.watch("a", t0);
  t.watch("b", t0);
  t.observe("a", std::string("1"), t0 + 1s);
  t.observe("a", std::string("2"), t0 + 2500ms);
  t.observe("b", std::string("1"), t0 + 100ms);
  t.observe("b", std::string("1"), t0 + 2900ms);  // unchanged: no sign of life
  auto silent = t.silent(t0 + 3200ms);
  ASSERT_EQ(silent.size(), 1u);
  EXPECT_EQ(silent[0].first, "b");
  EXPECT_TRUE(t.silent(t0 + 2s).empty());
  t.forget("b");
  EXPECT_EQ(t.silent(t0 + 6s).size(), 1u);  // a, silent since 2.5 s
}

TEST(Rendezvous, ResultRecordsSurviveAnyBytes) {
  AttemptResult r;
  r.attempt = 2;
  WorkerOutcome w;
  w.rank = 5;
  w.state = WorkerOutcome::State::Signaled;
  w.signal = 9;
  w.stderrTail = {"plain", "bad \xff\xfe bytes", std::string("nul\0in", 6)};
  w.oomNote = "likely OOM";
  w.host = "node1";
  r.workers.push_back(w);
  AttemptResult back = decodeResult(encodeResult(r));
  ASSERT_EQ(back.workers.size(), 1u);
  EXPECT_EQ(back.workers[0].signal, 9);
  EXPECT_EQ(back.workers[0].state, WorkerOutcome::State::Signaled);
  EXPECT_EQ(back.workers[0].stderrTail[0], "plain");
  EXPECT_EQ(back.workers[0].stderrTail[2], std::string("nul\0in", 6));
  EXPECT_EQ(back.workers[0].host, "node1");
  EXPECT_THROW(decodeResult("{not json"), Error);
  EXPECT_THROW(decodePlan("{}"), Error);
}

TEST(Rendezvous, VersionMismatchNamesBothSides) {
  JoinInfo master = joinOf("m", 0, 1, "a");
  master.host = "login1";
  JoinInfo other = joinOf("1", 1, 1, "b");
  other.launchVersion = "0.9";
  std::string m = versionMismatch(master, other);
  EXPECT_NE(m.find("host1 (node 1) runs launch 0.9"), std::string::npos) << m;
  EXPECT_NE(m.find("login1 runs launch 1.0"), std::string::npos) << m;
  EXPECT_EQ(versionMismatch(master, joinOf("2", 2, 1, "c")), "");
}

TEST(Rendezvous, JobPhasesAndClaimsRoundTrip) {
  JobPhase p;
  p.round = 3;
  p.kind = JobPhase::Run;
  EXPECT_EQ(encodePhase(p), "3 run");
  JobPhase back = decodePhase("3 run");
  EXPECT_EQ(back.round, 3);
  EXPECT_EQ(back.kind, JobPhase::Run);
  EXPECT_TRUE(back.reached(3, JobPhase::Gather));
  EXPECT_TRUE(back.reached(2, JobPhase::Decided));
  EXPECT_FALSE(back.reached(3, JobPhase::Decided));
  EXPECT_FALSE(back.reached(4, JobPhase::Gather));
  EXPECT_EQ(decodePhase("end").kind, JobPhase::Ended);
  EXPECT_TRUE(decodePhase("end").reached(99, JobPhase::Decided));
  EXPECT_EQ(decodePhase("").kind, JobPhase::Gather);  // absent: round 0 is gathered
  EXPECT_EQ(decodePhase("x y").round, 0);
  EXPECT_EQ(encodePhase(decodePhase("12 decided")), "12 decided");
  EXPECT_FALSE(decodePhase("3 run").plan.has_value());
  // Note [Plan in the state]: "R run" carries what an agent needs of the plan, nothing more.
  RoundPlan plan;
  plan.round = 3;
  plan.runId = "job7";
  plan.worldSize = 6;
  plan.masterAddr = "10.0.0.4";
  plan.masterPort = 29500;
  plan.nodes.push_back({"4", 0, 0, 2, "gpu4", "gpu4.lan", "10.0.0.4"});
  plan.nodes.push_back({"1", 1, 2, 4, "gpu1", "gpu1.lan", "10.0.0.1"});
  p.plan = plan;
  const std::string text = encodePhase(p);
  EXPECT_EQ(text.substr(0, text.find('\n')), "3 run");
  EXPECT_EQ(text.find("gpu1"), std::string::npos) << text;  // hosts stay in the full plan
  back = decodePhase(text);
  EXPECT_EQ(back.round, 3);
  EXPECT_EQ(back.kind, JobPhase::Run);
  ASSERT_TRUE(back.plan.has_value());
  EXPECT_EQ(back.plan->round, 3);
  EXPECT_EQ(back.plan->runId, "job7");
  EXPECT_EQ(back.plan->worldSize, 6);
  EXPECT_EQ(back.plan->masterAddr, "10.0.0.4");
  EXPECT_EQ(back.plan->masterPort, 29500);
  ASSERT_EQ(back.plan->nodes.size(), 2u);
  ASSERT_NE(back.plan->find("1"), nullptr);
  EXPECT_EQ(back.plan->find("1")->nodeRank, 1);
  EXPECT_EQ(back.plan->find("1")->rankOffset, 2);
  EXPECT_EQ(back.plan->find("1")->localWorldSize, 4);
  EXPECT_EQ(back.plan->find("4")->rankOffset, 0);
  EXPECT_EQ(back.plan->find("2"), nullptr);
  EXPECT_EQ(back.plan->epoch, 0);
  EXPECT_EQ(text.find("epoch"), std::string::npos) << text;
  // Note [Joining a running round]: the plan as a later membership epoch sees the round.
  p.plan->epoch = 2;
  EXPECT_EQ(decodePhase(encodePhase(p)).plan->epoch, 2);
  try {
    decodePhase("3 run\n{\"run_id\": \"j\", \"world_size\": 2, \"master_addr\": \"a\", "
                "\"master_port\": 1, \"nodes\": [[\"0\", 0, \"x\", 2]]}");
    ADD_FAILURE() << "a malformed node entry was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("malformed node entry"), std::string::npos) << e.what();
  }
  EXPECT_THROW(decodePhase("3 run\n{\"run_id\": 1"), Error);
  NodeClaim c;
  c.nonce = "ab12";
  c.pid = 812;
  c.host = "gpu2";
  NodeClaim d = decodeClaim(encodeClaim(c));
  EXPECT_EQ(d.nonce, "ab12");
  EXPECT_EQ(d.pid, 812);
  EXPECT_EQ(d.host, "gpu2");
  EXPECT_TRUE(decodeClaim(kReleasedClaim).nonce.empty());
}

TEST(Rendezvous, StoreRequestsAreClassedByTheirFirstKey) {
  EXPECT_EQ(storeRequestClass(keys::heartbeat("17")), kHeartbeatRequests);
  EXPECT_EQ(storeRequestClass("round3/monitor/rank/5"), kMonitoringRequests);
  EXPECT_EQ(storeRequestClass("round12/monitor/version"), kMonitoringRequests);
  EXPECT_EQ(storeRequestClass("monitor/node/2"), kMonitoringRequests);
  EXPECT_EQ(storeRequestClass(keys::join(0, "1")), kOtherRequests);
  EXPECT_EQ(storeRequestClass(keys::events()), kOtherRequests);
  EXPECT_EQ(storeRequestClass("round0/barrier/start/count"), kOtherRequests);
  EXPECT_EQ(storeRequestClass("round1"), kOtherRequests);
  EXPECT_EQ(storeRequestClass("round1/monitorx"), kOtherRequests);
}

// An idle agent costs the store two requests per heartbeat interval (Note [Heartbeat thread]):
// its beat and one wait on the round's stop key until the next beat -- not a second, few-ms wait
// for the remainder the first one's answer leaves (the server's deadline lies a round trip after
// the agent's).
TEST(HeartbeatThread, OneBeatAndOneStopWaitPerInterval) {
  store::TcpStoreServerOptions so;
  so.requestClasses = kStoreRequestClasses;
  so.classify = storeRequestClass;
  auto server = store::TcpStoreServer::start(so);
  store::TcpStoreOptions co;
  co.port = server->port();
  {
    HeartbeatThread beat(co, "3", std::chrono::milliseconds(100), std::chrono::milliseconds(5000),
                         /*watchStdin=*/false);
    beat.setRound(0);
    std::this_thread::sleep_for(std::chrono::milliseconds(1050));
  }
  const std::vector<uint64_t> counts = server->requestCounts();
  ASSERT_EQ(counts.size(), kStoreRequestClasses);
  const uint64_t beats = counts[kHeartbeatRequests];
  const uint64_t waits = counts[kOtherRequests];
  EXPECT_GE(beats, 5u) << "a beat every 100 ms for 1.05 s";
  EXPECT_LE(beats, 12u);
  EXPECT_LE(waits, beats + 1) << beats << " beats, " << waits << " stop waits";
}

// A Coordinator on a HashStore, and fake agents as threads: they join, beat, report.
struct Harness {
  std::shared_ptr<store::HashStore> store = std::make_shared<store::HashStore>();
  CoordinatorOptions options;
  Harness(int nodes, int minNodes) {
    for (int i = 0; i < nodes; ++i)
      options.nodes.push_back({std::to_string(i), "h" + std::to_string(i), i});
    options.minNodes = minNodes;
    options.maxNodes = nodes;
    options.rdzvTimeout = 0.4;
    options.heartbeatTimeout = 0.4;
    options.gracePeriod = 0.2;
    options.masterPort = 29500;
    options.runId = "r1";
    options.self = joinOf("m", 0, 0, "");
    options.self.host = "master";
  }
  void join(int round, const std::string& node, const std::string& version = "1.0",
            const std::string& nonce = "") {
    JoinInfo j = joinOf(node, std::stoi(node), 2, "10.0.0." + node);
    j.launchVersion = version;
    j.nonce = nonce.empty() ? "nonce" + node : nonce;
    store->setString(keys::join(round, node), encodeJoin(j));
    store->add(keys::events(), 1);
  }
  // Every worker of `node` in round `round` exited with `code` (stopped by launch: after a stop).
  void report(int round, const std::string& node, int code = 0, bool stopped = false) {
    RoundPlan p = decodePlan(store->getString(keys::plan(round)));
    AttemptResult r;
    r.attempt = round;
    for (int i = 0; i < p.find(node)->localWorldSize; ++i) {
      WorkerOutcome w;
      w.rank = p.find(node)->rankOffset + i;
      w.state = WorkerOutcome::State::Exited;
      w.exitCode = code;
      w.stoppedByLaunch = stopped;
      r.workers.push_back(w);
    }
    store->setString(keys::result(round, node), encodeResult(r));
    store->add(keys::events(), 1);
  }
  void succeed(int round, const std::string& node) { report(round, node); }
  // The plan as agents read it: from launch/state (Note [Plan in the state]), which must agree
  // with the full plan the master wrote beside it.
  RoundPlan awaitPlan(int round) {
    store->wait({keys::plan(round)}, 10000ms);
    const RoundPlan full = decodePlan(store->getString(keys::plan(round)));
    JobPhase now;
    for (int i = 0; i < 1000 && !now.reached(round, JobPhase::Run); ++i) {
      now = decodePhase(store->getString(keys::state()));
      if (!now.reached(round, JobPhase::Run)) std::this_thread::sleep_for(1ms);
    }
    if (now.round != round || now.kind != JobPhase::Run) return full;  // it moved on already
    EXPECT_TRUE(now.plan.has_value());
    if (!now.plan) return full;
    const RoundPlan& p = *now.plan;
    EXPECT_EQ(p.round, full.round);
    EXPECT_EQ(p.runId, full.runId);
    EXPECT_EQ(p.worldSize, full.worldSize);
    EXPECT_EQ(p.masterAddr, full.masterAddr);
    EXPECT_EQ(p.masterPort, full.masterPort);
    EXPECT_EQ(p.nodes.size(), full.nodes.size());
    for (size_t i = 0; i < std::min(p.nodes.size(), full.nodes.size()); ++i) {
      EXPECT_EQ(p.nodes[i].node, full.nodes[i].node);
      EXPECT_EQ(p.nodes[i].nodeRank, full.nodes[i].nodeRank);
      EXPECT_EQ(p.nodes[i].rankOffset, full.nodes[i].rankOffset);
      EXPECT_EQ(p.nodes[i].localWorldSize, full.nodes[i].localWorldSize);
    }
    return full;
  }
  std::string endMessage() { return decodeEnd(store->getString(keys::end())).second; }
};

// Heartbeats of the given nodes every 50 ms while it lives.
class Beats {
 public:
  Beats(store::Store& store, std::vector<std::string> nodes) {
    thread_ = std::thread([&store, nodes, this] {
      while (!quit_) {
        for (const auto& n : nodes) store.add(keys::heartbeat(n), 1);
        std::this_thread::sleep_for(50ms);
      }
    });
  }
  ~Beats() {
    quit_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> quit_{false};
  std::thread thread_;
};

double secondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

TEST(Coordinator, VersionMismatchEndsTheJob) {
  Harness h(2, 2);
  h.join(0, "0");
  h.join(0, "1", "0.9-other");
  Coordinator c(h.store, h.options);
  EXPECT_EQ(c.run(), 125);
  EXPECT_NE(h.endMessage().find("runs launch 0.9-other"), std::string::npos) << h.endMessage();
  EXPECT_EQ(h.store->getString(keys::state()), "end");
}

TEST(Coordinator, RendezvousTimeoutListsJoinedAndMissing) {
  Harness h(3, 3);
  Beats beats(*h.store, {"0", "2"});
  h.join(0, "0");
  h.join(0, "2");
  Coordinator c(h.store, h.options);
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(c.run(), 124);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  const std::string m = h.endMessage();
  EXPECT_NE(m.find("2 of 3 nodes joined; joined: node 0 (h0), node 2 (h2); missing: node 1 (h1)"),
            std::string::npos)
      << m;
}

TEST(Coordinator, GoneNodeFailsTheRendezvousAtOnce) {
  Harness h(2, 2);
  h.options.rdzvTimeout = 30;
  h.join(0, "0");
  Coordinator c(h.store, h.options);
  c.nodeGone("1", "its ssh session exited with code 255: Connection refused");
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(c.run(), 125);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_NE(h.endMessage().find("node 1 (h1): its ssh session exited with code 255"),
            std::string::npos)
      << h.endMessage();
}

TEST(Coordinator, ElasticGoesOnWithMinNodes) {
  Harness h(2, 1);
  Beats beats(*h.store, {"1"});
  h.join(0, "1");
  Coordinator c(h.store, h.options);
  std::thread agent([&] {
    RoundPlan p = h.awaitPlan(0);
    EXPECT_EQ(p.nodes.size(), 1u);
    EXPECT_EQ(p.worldSize, 2);
    EXPECT_EQ(p.masterAddr, "10.0.0.1");
    h.succeed(0, "1");
  });
  EXPECT_EQ(c.run(), 0);
  agent.join();
  EXPECT_EQ(h.store->getString(keys::decision(0)), "end 0");
  EXPECT_EQ(h.store->getString(keys::state()), "0 decided");
}

TEST(Coordinator, SilentNodeIsStoppedAndNamed) {
  Harness h(2, 2);
  h.join(0, "0");
  h.join(0, "1");
  Coordinator c(h.store, h.options);
  std::atomic<bool> quit{false};
  // Node 0 heartbeats and reports after the stop; node 1 never beats.
  std::thread agent([&] {
    h.store->wait({keys::plan(0)}, 5000ms);
    while (!quit && !h.store->check({keys::stop(0)})) {
      h.store->add(keys::heartbeat("0"), 1);
      std::this_thread::sleep_for(50ms);
    }
    h.succeed(0, "0");
  });
  EXPECT_EQ(c.run(), 124);
  quit = true;
  agent.join();
  EXPECT_NE(h.store->getString(keys::stop(0)).find("node 1 (h1) on 10.0.0.1 went silent"),
            std::string::npos)
      << h.store->getString(keys::stop(0));
  EXPECT_EQ(h.store->getString(keys::decision(0)), "end 124");
}

TEST(Coordinator, ClosesTheRoundAndKeepsTheStoreUntilEveryNodeReadTheDecision) {
  Harness h(2, 2);
  h.options.heartbeatTimeout = 20;  // the bound on the acknowledgements: not reached here
  h.join(0, "0");
  h.join(0, "1");
  Coordinator c(h.store, h.options);
  std::atomic<bool> acked{false};
  std::string stopWhenDecided;
  std::thread agents([&] {
    h.awaitPlan(0);
    h.succeed(0, "0");
    h.succeed(0, "1");
    h.store->wait({keys::decision(0)}, 5000ms);
    // The stop key is there before the decision: every agent's heartbeat thread stops waiting
    // on it.
    stopWhenDecided = h.store->check({keys::stop(0)}) ? h.store->getString(keys::stop(0)) : "";
    h.store->setString(keys::ack(0, "0"), "1");
    std::this_thread::sleep_for(300ms);  // node 1 is slow to read it
    acked = true;
    h.store->setString(keys::ack(0, "1"), "1");
  });
  EXPECT_EQ(c.run(), 0);
  EXPECT_TRUE(acked) << "run() returned before node 1 acknowledged the decision";
  agents.join();
  EXPECT_EQ(stopWhenDecided, "round 0 is over (end 0)");
}

TEST(Coordinator, AnUnacknowledgedDecisionIsNotWaitedForLong) {
  Harness h(1, 1);
  h.options.heartbeatTimeout = 0.5;
  Beats beats(*h.store, {"0"});
  h.join(0, "0");
  Coordinator c(h.store, h.options);
  std::thread agent([&] {
    h.awaitPlan(0);
    h.succeed(0, "0");  // and never acknowledges
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(c.run(), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  agent.join();
}

// Issue 19 item 10: a node that joined and went silent is not planned (it would stop the round at
// once): it is dropped within the heartbeat bound, and the elastic job goes on without it once
// the others are there, not at the rendezvous timeout.
TEST(Coordinator, AJoinedNodeThatGoesSilentIsDroppedWithinTheHeartbeatBound) {
  Harness h(3, 2);
  h.options.rdzvTimeout = 30;
  Beats beats(*h.store, {"0", "1"});
  h.join(0, "0");
  h.join(0, "2");  // and never beats
  Coordinator c(h.store, h.options);
  const auto start = std::chrono::steady_clock::now();
  double planned = -1;
  std::thread agents([&] {
    std::this_thread::sleep_for(1000ms);
    h.join(0, "1");
    RoundPlan p = h.awaitPlan(0);
    planned = secondsSince(start);
    EXPECT_EQ(p.nodes.size(), 2u);
    EXPECT_EQ(p.find("2"), nullptr);
    h.succeed(0, "0");
    h.succeed(0, "1");
  });
  EXPECT_EQ(c.run(), 0);
  agents.join();
  EXPECT_GE(planned, 0.9);
  EXPECT_LT(planned, 1.0 + 1.0) << "not when node 1 came";
}

// Issue 19 item 10: a node that joins while the round runs, below --nnodes MAX, stops the round
// (the agents take the workers' preemption path) and the next round has it, without using a
// restart of --max-restarts.
TEST(Coordinator, ANodeWaitingToJoinGrowsTheJobWithoutCountingARestart) {
  Harness h(3, 2);
  h.options.maxRestarts = 0;
  Beats beats(*h.store, {"0", "1", "2"});
  h.join(0, "0");
  h.join(0, "1");
  Coordinator c(h.store, h.options);
  std::string stop;
  size_t grown = 0;
  std::thread agents([&] {
    EXPECT_EQ(h.awaitPlan(0).nodes.size(), 2u);  // after the rendezvous timeout, elastic
    h.join(1, "2");                              // node 2 comes while round 0 runs
    h.store->wait({keys::stop(0)}, 5000ms);
    stop = h.store->getString(keys::stop(0));
    h.report(0, "0", 75, /*stopped=*/true);  // preempted: checkpointed, exit 75
    h.report(0, "1", 75, /*stopped=*/true);
    h.store->wait({keys::decision(0)}, 5000ms);
    h.join(1, "0");
    h.join(1, "1");
    RoundPlan p = h.awaitPlan(1);
    grown = p.nodes.size();
    for (const char* n : {"0", "1", "2"}) h.succeed(1, n);
  });
  EXPECT_EQ(c.run(), 0);
  agents.join();
  EXPECT_EQ(stop, "node 2 (h2) waits to join: the job grows from 2 to 3 nodes (elastic --nnodes "
                  "2:3)");
  EXPECT_EQ(h.store->getString(keys::decision(0)), "restart");
  EXPECT_EQ(grown, 3u);
  EXPECT_EQ(h.store->getString(keys::decision(1)), "end 0");
}

// A job of up to 3 nodes under --on-node-loss continue --on-node-join live; nodes 0 and 1 join
// round 0.
void startLiveJob(Harness& h) {
  h.options.onNodeLoss = OnNodeLoss::Continue;
  h.options.onNodeJoin = OnNodeJoin::Live;
  h.join(0, "0");
  h.join(0, "1");
}

// Note [Joining a running round]: under --on-node-join live a node that joins while the round
// runs below --nnodes MAX is taken into that round: no stop key, epoch 1 with it after the
// members (their ranks unchanged), launch/state's plan as epoch 1 sees the round, and the round
// ends 0 once all three report.
TEST(Coordinator, ANodeWaitingToJoinIsTakenIntoTheRunningRoundLive) {
  Harness h(3, 2);
  startLiveJob(h);
  Beats beats(*h.store, {"0", "1", "2"});
  Coordinator c(h.store, h.options);
  JobPhase seen;
  membership::Epoch epoch;
  std::thread agents([&] {
    EXPECT_EQ(h.awaitPlan(0).nodes.size(), 2u);
    h.join(1, "2");
    for (int i = 0; i < 5000 && !(seen.plan && seen.plan->epoch > 0); ++i) {
      seen = decodePhase(h.store->getString(keys::state()));
      std::this_thread::sleep_for(1ms);
    }
    epoch = membership::decodeEpoch(h.store->getString(epochStoreKey(0)));
    // The newcomer's 2 ranks reach their first step (the members take the epoch in), then all
    // 6 form it; the master reads the counters with the heartbeats (every 500 ms at most).
    h.store->add(readyStoreKey(0, 1), 2);
    std::this_thread::sleep_for(1500ms);
    h.store->add(formedStoreKey(0, 1), 6);
    std::this_thread::sleep_for(1000ms);
    for (const char* n : {"0", "1", "2"}) h.succeed(0, n);
  });
  EXPECT_EQ(c.run(), 0);
  agents.join();
  // Never stopped: the only stop key is the one the master writes with its decision.
  EXPECT_EQ(h.store->getString(keys::stop(0)), "round 0 is over (end 0)");
  EXPECT_EQ(h.store->getString(keys::decision(0)), "end 0");
  ASSERT_TRUE(seen.plan.has_value());
  EXPECT_EQ(seen.round, 0);
  EXPECT_EQ(seen.kind, JobPhase::Run);
  EXPECT_EQ(seen.plan->epoch, 1);
  EXPECT_EQ(seen.plan->worldSize, 6);
  ASSERT_EQ(seen.plan->nodes.size(), 3u);
  ASSERT_NE(seen.plan->find("2"), nullptr);
  EXPECT_EQ(seen.plan->find("2")->rankOffset, 4);
  EXPECT_EQ(seen.plan->find("2")->nodeRank, 2);
  EXPECT_EQ(seen.plan->find("0")->rankOffset, 0);
  EXPECT_EQ(seen.plan->find("1")->rankOffset, 2);
  EXPECT_EQ(epoch.epoch, 1);
  EXPECT_EQ(epoch.worldSize, 6);
  EXPECT_EQ(epoch.rankOf("2", 1), 5);
  EXPECT_EQ(epoch.rankOf("1", 0), 2);
  EXPECT_EQ(epoch.why, "node 2 (h2) joined");
  EXPECT_EQ(epoch.joining, 2);
  // Without the mode (the default), the same join stops the round instead: the test above.
}

// Round 0's membership epoch once the master has written epoch `number` (5 s at most).
membership::Epoch awaitEpoch(Harness& h, int number) {
  membership::Epoch e;
  for (int i = 0; i < 5000 && e.epoch < number; ++i) {
    if (h.store->check({epochStoreKey(0)})) {
      e = membership::decodeEpoch(h.store->getString(epochStoreKey(0)));
    }
    if (e.epoch < number) std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(e.epoch, number);
  return e;
}

// Note [Joining a running round]: a member lost while the newcomer starts (none of its ranks
// ready). The join is called off -- its ready counter far below 0, which the newcomer's ranks and
// the members' watchers read -- and the round goes on without the member in epoch 2, the
// survivors only; once they have re-formed, epoch 3 takes the newcomer in again after them and
// launch/state's plan follows. The round ends 0, never stopped.
TEST(Coordinator, AMemberLostWhileAJoinIsPendingCallsItOffAndTakesTheNewcomerInAgain) {
  Harness h(3, 1);
  startLiveJob(h);
  Beats beats(*h.store, {"0", "1", "2"});
  Coordinator c(h.store, h.options);
  membership::Epoch without, again;
  int64_t cancelled = 0;
  JobPhase seen;
  std::thread agents([&] {
    EXPECT_EQ(h.awaitPlan(0).nodes.size(), 2u);
    h.join(1, "2");
    awaitEpoch(h, 1);
    c.nodeGone("1", "its ssh session exited with code 255");
    without = awaitEpoch(h, 2);
    cancelled = h.store->add(readyStoreKey(0, 1), 0);
    h.store->add(formedStoreKey(0, 2), 2);  // node 0's 2 ranks re-formed
    again = awaitEpoch(h, 3);
    for (int i = 0; i < 5000 && !(seen.plan && seen.plan->epoch == 3); ++i) {
      seen = decodePhase(h.store->getString(keys::state()));
      std::this_thread::sleep_for(1ms);
    }
    h.store->add(readyStoreKey(0, 3), 2);
    std::this_thread::sleep_for(1000ms);  // the master reads the counters with the heartbeats
    h.store->add(formedStoreKey(0, 3), 4);
    std::this_thread::sleep_for(700ms);
    h.succeed(0, "0");
    h.succeed(0, "2");
  });
  EXPECT_EQ(c.run(), 0);
  agents.join();
  EXPECT_EQ(h.store->getString(keys::stop(0)), "round 0 is over (end 0)");
  EXPECT_LT(cancelled, 0);
  EXPECT_EQ(without.worldSize, 2);
  ASSERT_EQ(without.nodes.size(), 1u);
  EXPECT_EQ(without.nodes[0].node, "0");
  EXPECT_EQ(without.joining, 0);
  EXPECT_EQ(again.worldSize, 4);
  EXPECT_EQ(again.joining, 2);
  EXPECT_EQ(again.rankOf("0", 1), 1);
  EXPECT_EQ(again.rankOf("2", 0), 2);
  EXPECT_EQ(again.rankOf("1", 0), -1);
  ASSERT_TRUE(seen.plan.has_value());
  EXPECT_EQ(seen.plan->worldSize, 4);
  ASSERT_NE(seen.plan->find("2"), nullptr);
  EXPECT_EQ(seen.plan->find("2")->rankOffset, 2);
  EXPECT_EQ(seen.plan->find("1"), nullptr);
}

// The same loss once every newcomer rank counted itself ready: the join took effect (the members
// are re-forming with the newcomers), so the loss is one during a re-form and the round falls
// back to the restart path -- the master's cancelling add finds the counter complete.
TEST(Coordinator, AMemberLostOnceTheNewcomersAreReadyFallsBackToTheRestart) {
  Harness h(3, 1);
  startLiveJob(h);
  Beats beats(*h.store, {"0", "1", "2"});
  Coordinator c(h.store, h.options);
  std::string stop;
  std::thread agents([&] {
    h.awaitPlan(0);
    h.join(1, "2");
    awaitEpoch(h, 1);
    h.store->add(readyStoreKey(0, 1), 2);
    c.nodeGone("1", "its ssh session exited with code 255");
    for (int i = 0; i < 5000 && !h.store->check({keys::stop(0)}); ++i) {
      std::this_thread::sleep_for(1ms);
    }
    if (h.store->check({keys::stop(0)})) stop = h.store->getString(keys::stop(0));
    h.report(0, "0", 143, /*stopped=*/true);
    h.report(0, "2", 143, /*stopped=*/true);
  });
  EXPECT_NE(c.run(), 0);  // the restart path, with no restart left (--max-restarts 0)
  agents.join();
  EXPECT_EQ(stop, "node 1 (h1): its ssh session exited with code 255");
  EXPECT_EQ(membership::decodeEpoch(h.store->getString(epochStoreKey(0))).epoch, 1);
}

// A round an agent stopped for a worker's failure never ends 0, even when that worker was left
// behind with its node meanwhile: node 2 is lost (its ssh session ended), the round goes on in
// epoch 1, then node 2's agent writes the stop key for its worker's exit 1 -- what an agent that
// outlived the loss did before Note [Left out of a running round] (launcher/cluster/agent/
// agent.cpp) -- and the survivors, stopped, report 143. Node 2's workers are the root cause.
TEST(Coordinator, ARoundAnAgentStoppedNeverEndsZero) {
  Harness h(3, 2);
  h.options.onNodeLoss = OnNodeLoss::Continue;
  for (const char* n : {"0", "1", "2"}) h.join(0, n);
  Beats beats(*h.store, {"0", "1", "2"});
  Coordinator c(h.store, h.options);
  std::thread agents([&] {
    h.awaitPlan(0);
    c.nodeGone("2", "its ssh session exited with code 255");
    awaitEpoch(h, 1);
    h.store->compareSet(keys::stop(0), {},
                        store::toBytes("rank 5 (pid 812) on h2 exited with code 1"));
    h.store->add(keys::events(), 1);
    h.report(0, "0", 143, /*stopped=*/true);
    h.report(0, "1", 143, /*stopped=*/true);
  });
  EXPECT_EQ(c.run(), 125);  // node 2's workers, lost with it
  agents.join();
}

// Fan-out under --on-node-join live: node 2's ssh session ends mid-round, the round goes on
// without it, and the master asks for its agent to be started again (takeGoneNodes, after a
// wake) once its session has ended and --heartbeat-timeout (at least 1 s) has passed, again each
// time the new session ends too, its claim released for the new agent; nothing more once the
// members report.
TEST(Coordinator, AFanOutMasterStartsALeftOutNodesAgentAgain) {
  Harness h(3, 2);
  startLiveJob(h);
  h.join(0, "2");
  h.options.startsAgents = true;
  std::atomic<int> wakes{0};
  h.options.wake = [&] { ++wakes; };
  Beats beats(*h.store, {"0", "1", "2"});
  Coordinator c(h.store, h.options);
  std::vector<double> startedAfter;
  std::string claim;
  std::thread agents([&] {
    EXPECT_EQ(h.awaitPlan(0).nodes.size(), 3u);
    h.store->setString(keys::claim("2"), "the first agent's");
    auto gone = std::chrono::steady_clock::now();
    c.nodeGone("2", "its ssh session exited with code 255");
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::vector<std::string> again;
      for (int i = 0; i < 500 && again.empty(); ++i) {
        again = c.takeGoneNodes();
        if (again.empty()) std::this_thread::sleep_for(10ms);
      }
      EXPECT_EQ(again, std::vector<std::string>{"2"}) << "attempt " << attempt;
      startedAfter.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - gone).count());
      if (attempt == 0) claim = h.store->getString(keys::claim("2"));
      gone = std::chrono::steady_clock::now();
      c.nodeGone("2", "its ssh session exited with code 255: No route to host");
    }
    h.store->add(formedStoreKey(0, 1), 4);
    for (const char* n : {"0", "1"}) h.succeed(0, n);
  });
  EXPECT_EQ(c.run(), 0);
  agents.join();
  ASSERT_EQ(startedAfter.size(), 2u);
  for (double t : startedAfter)
    EXPECT_GE(t, 0.9) << "sooner than a second (--heartbeat-timeout 0.4)";
  EXPECT_GE(wakes.load(), 2);
  EXPECT_EQ(claim, kReleasedClaim);
  EXPECT_TRUE(c.takeGoneNodes().empty());
}

// The members report (the job is done) while node 2 is being taken in; `ready`: once its ranks
// reached their first step (the epoch took effect) -- the members' last step ran on (Note [Joins
// at step boundaries] in runtime/comm/world_reform.cpp), so they never re-formed with it. The
// master stops the round, whose only workers left are the newcomer's, and it ends 0. Returns
// the round's stop key.
std::string membersFinishWhileANodeIsTakenIn(bool ready) {
  Harness h(3, 2);
  startLiveJob(h);
  Beats beats(*h.store, {"0", "1", "2"});
  Coordinator c(h.store, h.options);
  std::string stop;
  std::thread agents([&] {
    EXPECT_EQ(h.awaitPlan(0).nodes.size(), 2u);
    h.join(1, "2");
    JobPhase seen;
    for (int i = 0; i < 5000 && !(seen.plan && seen.plan->epoch > 0); ++i) {
      seen = decodePhase(h.store->getString(keys::state()));
      std::this_thread::sleep_for(1ms);
    }
    if (ready) {
      h.store->add(readyStoreKey(0, 1), 2);
      std::this_thread::sleep_for(1500ms);  // the master reads the counter with the heartbeats
    }
    h.succeed(0, "0");
    h.succeed(0, "1");
    h.store->wait({keys::stop(0)}, 5000ms);
    stop = h.store->getString(keys::stop(0));
    h.report(0, "2", 143, /*stopped=*/true);
  });
  EXPECT_EQ(c.run(), 0);
  agents.join();
  EXPECT_EQ(h.store->getString(keys::decision(0)), "end 0");
  return stop;
}

// Note [Joining a running round]: the members report while the newcomer's ranks have not reached
// their first step -- the epoch never took effect, nobody left a step.
TEST(Coordinator, MembersThatFinishBeforeTheNewcomerIsReadyStopItsWorkers) {
  EXPECT_EQ(membersFinishWhileANodeIsTakenIn(/*ready=*/false),
            "the members finished before node 2 (h2) reached its first step");
}

// The newcomer ready during the members' last step: they finish it and end, never reaching the
// step boundary that would take it in. Not a re-form that failed: no restart.
TEST(Coordinator, MembersThatFinishOnceTheNewcomerIsReadyStopItsWorkers) {
  EXPECT_EQ(membersFinishWhileANodeIsTakenIn(/*ready=*/true),
            "the members finished before they re-formed with node 2 (h2)");
}

// Once a member has reported (its workers ended: the job is finishing) no node is taken in: the
// newcomer would wait for members that are gone. The round ends 0 without an epoch.
TEST(Coordinator, NoNodeIsTakenInLiveOnceAMemberReported) {
  Harness h(3, 2);
  startLiveJob(h);
  Beats beats(*h.store, {"0", "1", "2"});
  Coordinator c(h.store, h.options);
  std::thread agents([&] {
    h.awaitPlan(0);
    h.succeed(0, "0");
    std::this_thread::sleep_for(100ms);
    h.join(1, "2");
    std::this_thread::sleep_for(300ms);
    h.succeed(0, "1");
  });
  EXPECT_EQ(c.run(), 0);
  agents.join();
  EXPECT_FALSE(h.store->check({epochStoreKey(0)})) << h.store->getString(epochStoreKey(0));
  EXPECT_EQ(h.store->getString(keys::decision(0)), "end 0");
}

// Issue 19 item 9: a node's agent started again while the round runs (its old one is gone) joins
// the next round; the master sees another agent's join for a planned node and stops the round
// naming it, and the restart plans the node with its new agent.
TEST(Coordinator, AnAgentStartedAgainEndsItsNodesRoundAndJoinsTheNext) {
  Harness h(2, 2);
  h.options.maxRestarts = 1;
  Beats beats(*h.store, {"0", "1"});
  h.join(0, "0");
  h.join(0, "1");
  Coordinator c(h.store, h.options);
  std::string stop;
  std::thread agents([&] {
    h.awaitPlan(0);
    h.join(1, "1", "1.0", "second-agent");
    h.store->wait({keys::stop(0)}, 5000ms);
    stop = h.store->getString(keys::stop(0));
    h.report(0, "0", 143, /*stopped=*/true);
    h.store->wait({keys::decision(0)}, 5000ms);
    h.join(1, "0");
    RoundPlan p = h.awaitPlan(1);
    EXPECT_EQ(p.nodes.size(), 2u);
    h.succeed(1, "0");
    h.succeed(1, "1");
  });
  EXPECT_EQ(c.run(), 0);
  agents.join();
  EXPECT_NE(stop.find("node 1 (h1): its agent was started again"), std::string::npos) << stop;
  EXPECT_EQ(h.store->getString(keys::decision(0)), "restart");
}

// Issue 23: the elastic restart after a loss does not wait for the lost node (the rendezvous
// timeout is 30 s here): the nodes still there rejoin and the round goes on at N - 1.
TEST(Coordinator, TheElasticRestartAfterALossDoesNotWaitForTheLostNode) {
  Harness h(3, 2);
  h.options.rdzvTimeout = 30;
  h.options.maxRestarts = 1;
  h.join(0, "0");
  h.join(0, "1");
  h.join(0, "2");
  Coordinator c(h.store, h.options);
  double restartedAfter = -1;
  std::thread agents([&] {
    std::atomic<bool> beating2{true};
    {
      Beats beats(*h.store, {"0", "1"});
      std::thread two([&] {
        while (beating2) {
          h.store->add(keys::heartbeat("2"), 1);
          std::this_thread::sleep_for(50ms);
        }
      });
      h.awaitPlan(0);
      beating2 = false;  // node 2 is lost
      two.join();
      h.store->wait({keys::stop(0)}, 5000ms);
      const auto stopped = std::chrono::steady_clock::now();
      h.report(0, "0", 143, true);
      h.report(0, "1", 143, true);
      h.store->wait({keys::decision(0)}, 5000ms);
      h.join(1, "0");
      h.join(1, "1");
      RoundPlan p = h.awaitPlan(1);
      restartedAfter = secondsSince(stopped);
      EXPECT_EQ(p.nodes.size(), 2u);
      h.succeed(1, "0");
      h.succeed(1, "1");
    }
  });
  EXPECT_EQ(c.run(), 0);
  agents.join();
  EXPECT_GE(restartedAfter, 0);
  EXPECT_LT(restartedAfter, 2.0);
}

}  // namespace
}  // namespace dtrain::launcher::launcher_rendezvous_test
