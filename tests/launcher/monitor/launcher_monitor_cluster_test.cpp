// The store protocol of multi-node monitoring (launcher/monitor/cluster_keys.h) on a HashStore,
// and the master's JobView of several nodes.
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "dtrain/base/progress.h"
#include "launcher/monitor/cluster_keys.h"
#include "launcher/monitor/job_view.h"
#include "prometheus_text_support.h"

namespace dtrain::launcher::monitor::launcher_monitor_cluster_test {
namespace {

Record nodeRecord(const std::string& node, double time, std::optional<int> rank = std::nullopt) {
  Record r;
  r.time = time;
  r.source = "launch";
  r.runId = "r";
  r.node = node;
  r.rank = rank;
  r.fields = {{"rss_bytes", 10.0}};
  return r;
}

TEST(ClusterKeys, NodeRecordsGoThroughTheStoreAndBumpTheVersion) {
  store::HashStore round;
  publishNodeRecords(round, 1, {nodeRecord("b", 1.0), nodeRecord("b", 1.0, 3)});
  publishNodeRecords(round, 2, {nodeRecord("c", 2.0)});
  EXPECT_EQ(round.add(progress::kVersionKey, 0), 2);
  round.setString(progress::nodeKey(3), "{not json");
  std::vector<std::string> problems;
  auto nodes = readNodeRecords(round, 4, /*ownNode=*/2, &problems);
  ASSERT_EQ(nodes.size(), 1u) << "node 2 is the reader's own, node 0 never published";
  ASSERT_EQ(nodes.at(1).size(), 2u);
  EXPECT_EQ(nodes.at(1)[1].rank, 3);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("monitor/node/3"), std::string::npos) << problems[0];
}

TEST(ClusterKeys, StackRequestsAreAnsweredOncePerId) {
  store::HashStore round;
  EXPECT_FALSE(pendingStackRequest(round, 0));
  const int64_t first = requestStacks(round, {1, 3});
  auto pending = pendingStackRequest(round, 0);
  ASSERT_TRUE(pending);
  EXPECT_EQ(pending->id, first);
  EXPECT_EQ(pending->ranks, (std::vector<int>{1, 3}));
  EXPECT_FALSE(pendingStackRequest(round, first)) << "already answered";

  // Node 1 answers the first request; node 2 answers only an old one, then never.
  answerStacks(round, 1, first, {{1, "TID 1:\n#0 hang\n"}});
  answerStacks(round, 2, first - 1, {{3, "stale"}});
  auto t0 = std::chrono::steady_clock::now();
  auto stacks = collectStacks(round, first, 3, /*ownNode=*/0, std::chrono::milliseconds(300));
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(stacks.size(), 1u);
  EXPECT_EQ(stacks.at(1), "TID 1:\n#0 hang\n");
  EXPECT_GE(waited, 0.29) << "waited for node 2 until the deadline";
  EXPECT_LT(waited, 2.0);

  const int64_t second = requestStacks(round, {3});
  EXPECT_GT(second, first);
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    answerStacks(round, 2, second, {{3, "TID 3:\n#0 wait\n"}});
    answerStacks(round, 1, second, {});
  });
  stacks = collectStacks(round, second, 3, 0, std::chrono::seconds(10));
  late.join();
  EXPECT_EQ(stacks.size(), 1u);
  EXPECT_EQ(stacks.at(3), "TID 3:\n#0 wait\n");
}

TEST(JobView, NodesTheirAgesAndANewAttempt) {
  JobView view;
  view.setJob(0, 4, 2);
  view.ingest("a", {nodeRecord("a", 1.0), nodeRecord("a", 1.0, 0)}, 100.0);
  view.ingest("b", {nodeRecord("b", 1.0), nodeRecord("b", 1.0, 2)}, 103.0);
  Record trainer = nodeRecord("b", 1.0, 2);
  trainer.source = "trainer";
  trainer.step = 5;
  trainer.fields = {{"loss", 0.5}};
  view.setTrainerRecords({trainer});
  auto scrape = dtrain::testing::parsePrometheusText(view.prometheus(104.0));
  EXPECT_EQ(scrape.value("dtrain_heartbeat_age_seconds", {{"node", "a"}}), 4.0);
  EXPECT_EQ(scrape.value("dtrain_heartbeat_age_seconds", {{"node", "b"}}), 1.0);
  EXPECT_EQ(scrape.value("dtrain_rss_bytes", {{"node", "b"}, {"rank", "2"}}), 10.0);
  EXPECT_EQ(scrape.value("dtrain_loss", {{"node", "b"}, {"rank", "2"}}), 0.5);
  EXPECT_EQ(scrape.value("dtrain_max_restarts"), 2);

  view.newAttempt(1);
  scrape = dtrain::testing::parsePrometheusText(view.prometheus(104.0));
  EXPECT_EQ(scrape.value("dtrain_attempt"), 1);
  EXPECT_FALSE(scrape.value("dtrain_rss_bytes", {{"node", "b"}, {"rank", "2"}}))
      << "the earlier attempt's ranks are gone";
  EXPECT_TRUE(scrape.value("dtrain_rss_bytes", {{"node", "b"}})) << "the node stays";
  EXPECT_FALSE(scrape.value("dtrain_loss", {{"node", "b"}, {"rank", "2"}}));
}

}  // namespace
}  // namespace dtrain::launcher::monitor::launcher_monitor_cluster_test
