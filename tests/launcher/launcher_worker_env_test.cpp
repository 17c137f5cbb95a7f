// workerEnv(config, node, localRank, round): docs/design.md#worker-environment, table-driven.
#include <gtest/gtest.h>

#include "env_contract.h"
#include "launcher/node/worker_env.h"

namespace dtrain::launcher::launcher_worker_env_test {
namespace {

NodeContext sampleNode() {
  NodeContext n;
  n.host = "node0";
  n.nodeRank = 0;
  n.numNodes = 1;
  n.localWorldSize = 4;
  n.rankOffset = 0;
  n.worldSize = 4;
  n.cpuCount = 16;
  n.masterAddr = "127.0.0.1";
  n.masterPort = 29500;
  n.storeAddr = "127.0.0.1";
  n.storePort = 29400;
  n.storeToken = "feedface";
  n.runId = "job1";
  n.jobDir = "/logs/job1";
  n.inherited = {{"PATH", "/usr/bin"},
                 {"HOME", "/root"},
                 {"DTRAIN_LAUNCH_MAX_RESTARTS", "3"},
                 {"RANK", "99"},
                 {"NCCL_DEBUG", "WARN"}};
  return n;
}

struct EnvCase {
  const char* name;
  int nodeRank;
  int nodeId;
  int numNodes;
  int localRank;
  int round;
  std::map<std::string, std::string> expect;
};

class WorkerEnvTest : public ::testing::TestWithParam<EnvCase> {};

TEST_P(WorkerEnvTest, SetsTheContract) {
  const EnvCase& c = GetParam();
  LaunchConfig config;
  config.maxRestarts = 2;
  NodeContext node = sampleNode();
  node.nodeRank = c.nodeRank;
  node.nodeId = c.nodeId;
  node.numNodes = c.numNodes;
  node.rankOffset = c.nodeRank * node.localWorldSize;  // equal nodes: prefix sums
  node.worldSize = c.numNodes * node.localWorldSize;
  EnvMap env = workerEnv(config, node, c.localRank, c.round);
  for (const auto& [key, value] : c.expect) {
    ASSERT_TRUE(env.count(key)) << key;
    EXPECT_EQ(env[key], value) << key;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table, WorkerEnvTest,
    ::testing::Values(
        EnvCase{"FirstWorker",
                0,
                0,
                1,
                0,
                0,
                {{"RANK", "0"},
                 {"LOCAL_RANK", "0"},
                 {"WORLD_SIZE", "4"},
                 {"LOCAL_WORLD_SIZE", "4"},
                 {"GROUP_RANK", "0"},
                 {"GROUP_WORLD_SIZE", "1"},
                 {"DTRAIN_NODE_ID", "0"},
                 {"ROLE_RANK", "0"},
                 {"ROLE_WORLD_SIZE", "4"},
                 {"ROLE_NAME", "default"},
                 {"MASTER_ADDR", "127.0.0.1"},
                 {"MASTER_PORT", "29500"},
                 {"TORCHELASTIC_RESTART_COUNT", "0"},
                 {"TORCHELASTIC_MAX_RESTARTS", "2"},
                 {"TORCHELASTIC_RUN_ID", "job1"},
                 {"TORCHELASTIC_USE_AGENT_STORE", "False"},
                 {"TORCHELASTIC_ERROR_FILE", "/logs/job1/attempt_0/rank_0/error.json"},
                 {"DTRAIN_STORE_ADDR", "127.0.0.1"},
                 {"DTRAIN_STORE_PORT", "29400"},
                 {"DTRAIN_STORE_TOKEN", "feedface"},
                 {"DTRAIN_RESTART_COUNT", "0"},
                 {"DTRAIN_RUN_ID", "job1"},
                 {"OMP_NUM_THREADS", "4"}}},
        EnvCase{"LastWorkerSecondRound",
                0,
                0,
                1,
                3,
                2,
                {{"RANK", "3"},
                 {"LOCAL_RANK", "3"},
                 {"TORCHELASTIC_RESTART_COUNT", "2"},
                 {"DTRAIN_RESTART_COUNT", "2"},
                 {"TORCHELASTIC_ERROR_FILE", "/logs/job1/attempt_2/rank_3/error.json"}}},
        EnvCase{"SecondNodeOfThree",
                1,
                1,
                3,
                2,
                0,
                {{"RANK", "6"},
                 {"LOCAL_RANK", "2"},
                 {"WORLD_SIZE", "12"},
                 {"LOCAL_WORLD_SIZE", "4"},
                 {"GROUP_RANK", "1"},
                 {"GROUP_WORLD_SIZE", "3"},
                 {"ROLE_RANK", "6"},
                 {"ROLE_WORLD_SIZE", "12"},
                 {"DTRAIN_NODE_ID", "1"}}},
        // Elastic: node id 5 (its --node-rank) is the second node of this round's three.
        EnvCase{"ElasticNodeKeepsItsIdNotItsGroupRank",
                1,
                5,
                3,
                0,
                1,
                {{"GROUP_RANK", "1"},
                 {"DTRAIN_NODE_ID", "5"},
                 {"RANK", "4"},
                 {"TORCHELASTIC_RESTART_COUNT", "1"}}}),
    [](const ::testing::TestParamInfo<EnvCase>& info) { return info.param.name; });

TEST(WorkerEnv, UnequalNodesAndForwardedOverlay) {
  NodeContext node = sampleNode();
  node.nodeRank = 2;
  node.numNodes = 3;
  node.localWorldSize = 2;  // nodes of 4, 3 and 2 workers
  node.rankOffset = 7;
  node.worldSize = 9;
  node.overlay = {{"NCCL_DEBUG", "INFO"}, {"PATH", "/opt/bin"}, {"NCCL_SOCKET_IFNAME", "eth1"}};
  LaunchConfig config;
  config.env = {{"PATH", "/from/env"}};
  EnvMap env = workerEnv(config, node, 1, 0);
  EXPECT_EQ(env["RANK"], "8");
  EXPECT_EQ(env["WORLD_SIZE"], "9");
  EXPECT_EQ(env["GROUP_RANK"], "2");
  EXPECT_EQ(env["NCCL_DEBUG"], "INFO");  // the master's over the node's own
  EXPECT_EQ(env["NCCL_SOCKET_IFNAME"], "eth1");
  EXPECT_EQ(env["PATH"], "/from/env");  // --env last
}

TEST(WorkerEnv, InheritsButNotLauncherOptions) {
  EnvMap env = workerEnv(LaunchConfig{}, sampleNode(), 1, 0);
  EXPECT_EQ(env["PATH"], "/usr/bin");
  EXPECT_EQ(env["NCCL_DEBUG"], "WARN");
  EXPECT_EQ(env.count("DTRAIN_LAUNCH_MAX_RESTARTS"), 0u) << "launcher options are not forwarded";
  EXPECT_EQ(env["RANK"], "1") << "an inherited RANK is replaced";
}

TEST(WorkerEnv, UserValuesWin) {
  LaunchConfig config;
  config.env = {{"NCCL_DEBUG", "INFO"}, {"OMP_NUM_THREADS", "2"}, {"EXTRA", "a b"}};
  EnvMap env = workerEnv(config, sampleNode(), 0, 0);
  EXPECT_EQ(env["NCCL_DEBUG"], "INFO");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "2");
  EXPECT_EQ(env["EXTRA"], "a b");
  NodeContext node = sampleNode();
  node.inherited["OMP_NUM_THREADS"] = "9";
  EXPECT_EQ(workerEnv(LaunchConfig{}, node, 0, 0)["OMP_NUM_THREADS"], "9");
}

TEST(WorkerEnv, OmpThreadsSplitTheCpus) {
  struct Row {
    int cpus, workers;
    const char* threads;
  };
  for (Row r : {Row{16, 4, "4"}, Row{2, 4, "1"}, Row{7, 2, "3"}, Row{1, 1, "1"}}) {
    NodeContext node = sampleNode();
    node.cpuCount = r.cpus;
    node.localWorldSize = r.workers;
    EXPECT_EQ(workerEnv(LaunchConfig{}, node, 0, 0)["OMP_NUM_THREADS"], r.threads)
        << r.cpus << " cpus, " << r.workers << " workers";
  }
}

TEST(WorkerEnv, GpuSlots) {
  NodeContext node = sampleNode();
  EXPECT_EQ(workerEnv(LaunchConfig{}, node, 0, 0).count("CUDA_VISIBLE_DEVICES"), 0u);
  node.gpuSlots = {0, 2};
  EXPECT_EQ(workerEnv(LaunchConfig{}, node, 1, 0)["CUDA_VISIBLE_DEVICES"], "0,2");
}

TEST(WorkerEnv, RedactionHidesTheTokenOnly) {
  EnvMap env = workerEnv(LaunchConfig{}, sampleNode(), 0, 0);
  EnvMap shown = redacted(env);
  EXPECT_EQ(shown[env::kStoreToken], env::kRedacted);
  EXPECT_EQ(shown["RANK"], env["RANK"]);
  for (const auto& kv : shown) EXPECT_EQ(kv.second.find("feedface"), std::string::npos) << kv.first;
  EXPECT_EQ(env[env::kStoreToken], "feedface") << "the original keeps it";
}

TEST(WorkerEnv, ChangesListOnlyWhatLaunchSets) {
  EnvMap changes = workerEnvChanges(LaunchConfig{}, sampleNode(), 0, 0);
  EXPECT_EQ(changes.count("PATH"), 0u);
  EXPECT_EQ(changes.count("HOME"), 0u);
  EXPECT_EQ(changes["RANK"], "0");
  EXPECT_EQ(changes.count("WORLD_SIZE"), 1u);
}

TEST(WorkerEnv, EnvStringsForExecve) {
  EXPECT_EQ(toEnvStrings({{"A", "1"}, {"B", "x=y"}}), (std::vector<std::string>{"A=1", "B=x=y"}));
}

}  // namespace
}  // namespace dtrain::launcher::launcher_worker_env_test
