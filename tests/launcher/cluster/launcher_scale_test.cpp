// 64 simulated nodes on this machine (launcher_sim.h: manual agents on loopback, one progress-
// publishing test worker each) form, run, lose one agent to SIGKILL and restart elastic at 63:
// the scale benchmark's scenario (launch_scale_bench, benchmarks/README.md) at a size the suite
// can afford, with bounds looser than the benchmark's aims -- the machine is small and shared.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "launcher_sim.h"
#include "launcher_support.h"
#include "test_support.h"

namespace dtrain::testing::launcher_scale_test {
namespace {

using sim::LaunchSim;

constexpr int kNodes = 64;
constexpr double kHeartbeatTimeout = 4;

TEST(LaunchScale, SixtyFourNodesFormRunLoseOneAndRestartElasticAtSixtyThree) {
  sim::LaunchSimOptions o;
  o.launch = launchPath();
  o.worker = workerPath();
  o.nodes = kNodes;
  o.minNodes = kNodes - 1;
  o.heartbeatInterval = 1;
  o.heartbeatTimeout = kHeartbeatTimeout;
  o.gracePeriod = 10;
  o.rdzvTimeout = 120;
  o.maxRestarts = 1;
  o.workerSteps = 600;  // until the loss stops them
  o.restartSteps = 3;
  o.token = "scale-test-token-0123456789abcdef";
  LaunchSim s(o);
  sim::Fleet& fleet = s.fleet();
  s.start();

  // Forms: every agent holds round 0's plan, every worker runs.
  ASSERT_TRUE(fleet.pumpUntil([&] { return LaunchSim::count(s.workerStarted(0)) == kNodes; }, 90))
      << LaunchSim::count(s.planned(0)) << " plans, " << LaunchSim::count(s.workerStarted(0))
      << " workers; node 0:\n"
      << fleet.text(0);
  const double formed = LaunchSim::latest(s.planned(0)) - s.startedAt();
  const double lastJoinToPlans = LaunchSim::latest(s.planned(0)) - LaunchSim::latest(s.joined(0));
  EXPECT_LT(formed, 20) << "all started -> all plans";
  EXPECT_LT(lastJoinToPlans, 3) << "last join -> all plans";
  // An agent stamps its join before sending it: no plan is read before the last join's stamp.
  const std::vector<double> plans = s.planned(0);
  EXPECT_GE(*std::min_element(plans.begin(), plans.end()), LaunchSim::latest(s.joined(0)));
  fleet.pump(3000);  // runs: every worker publishes its progress

  // Loses node 63: named within the heartbeat timeout + 1 s (+ the machine's margin).
  const int lost = kNodes - 1;
  fleet.signal(lost, SIGKILL);
  const double killedAt = sim::monotonicSeconds();
  const std::string silent = fmt::format("stopping round 0 on every node: node {} (", lost);
  ASSERT_TRUE(fleet.pumpUntil([&] { return s.masterSaid(silent) >= 0; }, 30)) << fleet.text(0);
  const double detected = s.masterSaid(silent) - killedAt;
  EXPECT_NE(fleet.linesWith(0, silent).front().text.find("on 127.0.0.1 went silent"),
            std::string::npos)
      << fleet.linesWith(0, silent).front().text;
  EXPECT_LT(detected, kHeartbeatTimeout + 1 + 2 * kMargin);
  EXPECT_GT(detected, kHeartbeatTimeout - 1.5);

  // Restarts elastic at 63, without waiting for the lost node.
  ASSERT_TRUE(fleet.pumpUntil([&] { return LaunchSim::count(s.planned(1)) == kNodes - 1; }, 60))
      << fleet.text(0);
  const double restarted = LaunchSim::latest(s.planned(1)) - s.masterSaid(silent);
  EXPECT_LT(restarted, 15) << "stop -> every agent holds round 1's plan";
  for (int node = 0; node < lost; ++node) {
    const double stopped = s.workerStopped(node);
    EXPECT_GE(stopped, 0) << "node " << node << "'s worker got no SIGTERM";
  }

  // Ends: each worker's 3 steps, then every agent exits 0.
  ASSERT_TRUE(fleet.pumpUntil(
      [&] {
        for (int node = 0; node < lost; ++node) {
          if (!fleet.member(node).exited) return false;
        }
        return true;
      },
      90))
      << fleet.text(0);
  for (int node = 0; node < lost; ++node) {
    EXPECT_EQ(fleet.exitCode(node), 0) << "node " << node << ":\n" << fleet.text(node);
    EXPECT_EQ(fleet.linesWith(node, "world_size=63 attempt=1").size(), 1u) << fleet.text(node);
  }
  std::printf("64 nodes: formed in %.2f s (last join -> plans %.2f s); a SIGKILLed agent named "
              "after %.2f s (--heartbeat-timeout %g); restarted at 63 in %.2f s\n",
              formed, lastJoinToPlans, detected, kHeartbeatTimeout, restarted);
}

}  // namespace
}  // namespace dtrain::testing::launcher_scale_test
