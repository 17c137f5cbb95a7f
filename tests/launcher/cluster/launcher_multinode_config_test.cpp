// Multi-node options: validation, precedence of the scheduler's variables, the agent plan that
// carries the job's options to the other nodes.
#include <gtest/gtest.h>

#include "dtrain/base/error.h"
#include "launcher/cluster/protocol/plan_codec.h"
#include "launcher/config/launch_args.h"

namespace dtrain::launcher::launcher_multinode_config_test {
namespace {

std::string usageError(const std::vector<std::string>& args,
                       const std::map<std::string, std::string>& env = {}) {
  try {
    parseLaunchArgs(args, env);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(MultiNodeArgs, RefusedCombinationsNameTheOptions) {
  const std::pair<std::vector<std::string>, const char*> kBad[] = {
      {{"--nnodes", "2", "./t"}, "--node-rank R on every node"},
      {{"--nnodes", "2", "--node-rank", "0", "./t"}, "--rdzv-endpoint HOST:PORT"},
      {{"--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h", "./t"}, "is not below"},
      {{"--hosts", "a,b", "--node-rank", "1", "./t"}, "the node ranks follow the list"},
      {{"--hosts", "a,b", "--hostfile", "f", "./t"}, "use one of them"},
      {{"--include", "a", "./t"}, "give --hostfile or --hosts too"},
      {{"--hosts", "a,b", "--include", "a", "--exclude", "b", "./t"}, "exclude each other"},
      {{"--hosts", "a,a", "./t"}, "listed twice"},
      {{"--hosts", "a", "--heartbeat-interval", "5", "--heartbeat-timeout", "5", "./t"},
       "must be longer than --heartbeat-interval"},
      {{"--hosts", "a", "--rdzv-timeout", "0", "./t"}, "--rdzv-timeout"},
      {{"--hosts", "a", "--nccl-debug", "LOUD", "./t"}, "--nccl-debug \"LOUD\""},
      {{"--hosts", "a", "--ssh-option", "novalue", "./t"}, "--ssh-option \"novalue\""},
      {{"--node-rank", "1", "./t"}, "a one-node job has only node rank 0"},
  };
  for (const auto& [args, want] : kBad) {
    std::string m = usageError(args);
    EXPECT_NE(m.find(want), std::string::npos) << args[0] << " " << args[1] << " -> " << m;
  }
  EXPECT_EQ(usageError({"--hosts", "a:2,b:2", "--include", "a:1", "./t"}), "(accepted)");
  EXPECT_EQ(usageError({"--nnodes", "1:3", "--node-rank", "2", "--rdzv-endpoint", "h:1", "./t"}),
            "(accepted)");
}

TEST(MultiNodeArgs, SchedulerVariablesComeLast) {
  const std::map<std::string, std::string> pet = {{"PET_NNODES", "3"},
                                                  {"PET_NODE_RANK", "1"},
                                                  {"PET_MASTER_ADDR", "10.0.0.1"},
                                                  {"PET_NPROC_PER_NODE", "4"},
                                                  {"DTRAIN_LAUNCH_NPROC_PER_NODE", "2"}};
  LaunchConfig c = parseLaunchArgs({"./t"}, pet).config;
  EXPECT_EQ(c.maxNodes, 3);
  EXPECT_EQ(c.nodeRank, 1);
  EXPECT_EQ(c.rdzvHost, "10.0.0.1");
  EXPECT_EQ(c.nprocPerNode.count, 2) << "DTRAIN_LAUNCH_* wins over PET_*";
  c = parseLaunchArgs({"--node-rank", "2", "./t"}, pet).config;
  EXPECT_EQ(c.nodeRank, 2) << "the command line wins";
  // A bad value names the variable it came from.
  EXPECT_NE(usageError({"./t"}, {{"PET_NNODES", "x"}, {"PET_NODE_RANK", "0"}}).find("PET_NNODES"),
            std::string::npos);
  // Slurm, with the bracket node list.
  c = parseLaunchArgs(
          {"./t"},
          {{"SLURM_JOB_NODELIST", "gpu[07-08]"}, {"SLURM_NNODES", "2"}, {"SLURM_NODEID", "1"}})
          .config;
  EXPECT_EQ(c.rdzvHost, "gpu07");
  EXPECT_EQ(c.nodeRank, 1);
}

TEST(AgentPlan, CarriesTheJobsOptionsEnvironmentAndToken) {
  LaunchConfig master = parseLaunchArgs({"--max-restarts", "3", "--grace-period", "7",
                                         "--log-line-prefix-template", "<${node_rank}> ",
                                         "--nccl-ib-disable", "./t", "a"},
                                        {{"DTRAIN_LAUNCH_EXIT_BARRIER_TIMEOUT", "9"}})
                            .config;
  AgentSetup s;
  s.config = master;
  s.node = "2";
  s.requestedRank = 2;
  s.label = "gpu3";
  s.slots = 4;
  s.gpus = {1, 3};
  s.storeAddr = "10.0.0.1";
  s.storePort = 29400;
  s.token = std::string(64, 'a');
  s.forwarded = {{"PATH", "/opt/bin"}, {"ODD", "line1\nline2=x"}};
  LaunchConfig base = parseLaunchArgs({"--agent", "./t", "a"}, {}).config;
  AgentSetup back = agentSetupFromRecords(
      remote::decodePlan(remote::encodePlan(agentPlanRecords(s))), base);
  EXPECT_EQ(back.config.maxRestarts, 3);
  EXPECT_DOUBLE_EQ(back.config.gracePeriod, 7);
  EXPECT_DOUBLE_EQ(back.config.exitBarrierTimeout, 9) << "DTRAIN_LAUNCH_* of the master travels";
  EXPECT_EQ(back.config.linePrefixTemplate, "<${node_rank}> ");
  EXPECT_TRUE(back.config.linePrefixGiven);
  EXPECT_TRUE(back.config.nccl.ibDisable);
  EXPECT_TRUE(back.config.agent);
  EXPECT_EQ(back.node, "2");
  EXPECT_EQ(back.label, "gpu3");
  EXPECT_EQ(back.slots, 4);
  EXPECT_EQ(back.gpus, (std::vector<int>{1, 3}));
  EXPECT_EQ(back.storeAddr, "10.0.0.1");
  EXPECT_EQ(back.storePort, 29400);
  EXPECT_EQ(back.token, s.token);
  EXPECT_EQ(back.forwarded, s.forwarded);
  EXPECT_TRUE(back.watchStdin);
  remote::Records bad = agentPlanRecords(s);
  bad.emplace_back("surprise", "x");
  EXPECT_THROW(agentSetupFromRecords(bad, base), InvalidArgument);
}

}  // namespace
}  // namespace dtrain::launcher::launcher_multinode_config_test
