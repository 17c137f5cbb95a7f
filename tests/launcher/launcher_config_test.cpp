// LaunchConfig's value parsers and validate(): tables of good and bad values.
#include <gtest/gtest.h>

#include "dtrain/base/error.h"
#include "launcher/config/launch_config.h"

namespace dtrain::launcher::launcher_config_test {
namespace {

TEST(ParseStreamSpec, TorchrunForms) {
  EXPECT_EQ(parseStreamSpec("0", "--tee").all, 0);
  EXPECT_EQ(parseStreamSpec("3", "--tee").all, 3);
  StreamSpec s = parseStreamSpec("0:1,2:3", "--redirects");
  EXPECT_EQ(s.streamsFor(0), kStdoutBit);
  EXPECT_EQ(s.streamsFor(1), 0);
  EXPECT_EQ(s.streamsFor(2), kStdoutBit | kStderrBit);
  EXPECT_TRUE(s.any());
  EXPECT_FALSE(parseStreamSpec("0:0", "--tee").any());
  for (const char* bad : {"", "4", "-1", "x", "0:4", "a:1", "0:1,0:2", "0:1,", "1:"}) {
    EXPECT_THROW(parseStreamSpec(bad, "--tee"), InvalidArgument) << bad;
  }
}

TEST(ParseNnodes, CountOrRange) {
  EXPECT_EQ(parseNnodes("1", "--nnodes"), std::make_pair(1, 1));
  EXPECT_EQ(parseNnodes("1:4", "--nnodes"), std::make_pair(1, 4));
  for (const char* bad : {"0", "3:2", "x", "1:", ":2", "-1", "1:0"}) {
    EXPECT_THROW(parseNnodes(bad, "--nnodes"), InvalidArgument) << bad;
  }
}

TEST(ParseEndpoint, HostAndPort) {
  EXPECT_EQ(parseEndpoint("10.0.0.1:29400", "e"), std::make_pair(std::string("10.0.0.1"), 29400));
  EXPECT_EQ(parseEndpoint("node0", "e"), std::make_pair(std::string("node0"), 0));
  EXPECT_EQ(parseEndpoint("[::1]:5", "e"), std::make_pair(std::string("::1"), 5));
  for (const char* bad : {":29400", "h:0", "h:70000", "h:x", "::1:5", "[::1"}) {
    EXPECT_THROW(parseEndpoint(bad, "e"), InvalidArgument) << bad;
  }
}

TEST(ParseValues, Numbers) {
  EXPECT_EQ(parseIntValue("7", "--x", 0, 10), 7);
  EXPECT_THROW(parseIntValue("11", "--x", 0, 10), InvalidArgument);
  EXPECT_THROW(parseIntValue(" 7", "--x", 0, 10), InvalidArgument);
  EXPECT_THROW(parseIntValue("7x", "--x", 0, 10), InvalidArgument);
  EXPECT_DOUBLE_EQ(parseSeconds("0.25", "--g"), 0.25);
  for (const char* bad : {"0", "-1", "x", "", "inf", "nan"}) {
    EXPECT_THROW(parseSeconds(bad, "--g"), InvalidArgument) << bad;
  }
  EXPECT_THROW(parseSeconds("1e10", "--g"), InvalidArgument) << "past kMaxTimeoutSeconds";
  EXPECT_DOUBLE_EQ(parseTimeoutSeconds("0", "--t"), 0.0);
  EXPECT_DOUBLE_EQ(parseTimeoutSeconds("2.5", "--t"), 2.5);
  for (const char* bad : {"-1", "-0.5", "x", "", "inf", "nan", "1e10", "3 "}) {
    EXPECT_THROW(parseTimeoutSeconds(bad, "--t"), InvalidArgument) << bad;
  }
  EXPECT_EQ(parseByteCount("0", "--b"), 0);
  EXPECT_EQ(parseByteCount("4k", "--b"), 4096);
  EXPECT_EQ(parseByteCount("2M", "--b"), 2 << 20);
  EXPECT_EQ(parseByteCount("1G", "--b"), int64_t{1} << 30);
  EXPECT_THROW(parseByteCount("1T", "--b"), InvalidArgument);
  EXPECT_THROW(parseByteCount("-1", "--b"), InvalidArgument);
  EXPECT_TRUE(parseBool("TRUE", "f"));
  EXPECT_FALSE(parseBool("0", "f"));
  EXPECT_THROW(parseBool("maybe", "f"), InvalidArgument);
}

TEST(ParseNproc, CountsAndKeywords) {
  EXPECT_EQ(parseNproc("4", "n").count, 4);
  EXPECT_EQ(parseNproc("auto", "n").kind, NprocSpec::Kind::Auto);
  EXPECT_EQ(parseNproc("gpu", "n").kind, NprocSpec::Kind::Gpu);
  EXPECT_EQ(parseNproc("cpu", "n").kind, NprocSpec::Kind::Cpu);
  for (const char* bad : {"0", "-2", "4096000", "many", ""}) {
    EXPECT_THROW(parseNproc(bad, "n"), InvalidArgument) << bad;
  }
}

TEST(ResolveNproc, FromTheMachine) {
  NprocSpec spec;
  spec.kind = NprocSpec::Kind::Auto;
  EXPECT_EQ(resolveNproc(spec, 16, 0), 16) << "auto without GPUs: the CPUs";
  EXPECT_EQ(resolveNproc(spec, 16, 8), 8) << "auto with GPUs: the GPUs";
  spec.kind = NprocSpec::Kind::Cpu;
  EXPECT_EQ(resolveNproc(spec, 16, 8), 16);
  spec.kind = NprocSpec::Kind::Gpu;
  EXPECT_EQ(resolveNproc(spec, 16, 2), 2);
  EXPECT_THROW(resolveNproc(spec, 16, 0), InvalidArgument);
  spec.kind = NprocSpec::Kind::Count;
  spec.count = 3;
  EXPECT_EQ(resolveNproc(spec, 1, 0), 3);
}

TEST(ExpandLinePrefix, Placeholders) {
  EXPECT_EQ(expandLinePrefix(kDefaultLinePrefixTemplate, 5, 1, "default", 0), "[rank 5]: ");
  EXPECT_EQ(expandLinePrefix("${role_name}${rank}/${local_rank}@${attempt}:", 5, 1, "tr", 2),
            "tr5/1@2:");
  EXPECT_EQ(expandLinePrefix("${rank", 5, 1, "x", 0), "${rank");
}

// validate(): one broken field per row, each named in the message.
struct BadConfig {
  const char* name;
  void (*breakIt)(LaunchConfig&);
  const char* mentions;
};

class ValidateTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(ValidateTest, RefusesNamingTheOption) {
  LaunchConfig c;
  c.program = "./train";
  validate(c);  // the base is valid
  GetParam().breakIt(c);
  try {
    validate(c);
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(GetParam().mentions), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table, ValidateTest,
    ::testing::Values(
        BadConfig{"NoProgram", [](LaunchConfig& c) { c.program.clear(); }, "no program"},
        BadConfig{"ZeroWorkers", [](LaunchConfig& c) { c.nprocPerNode.count = 0; },
                  "--nproc-per-node"},
        BadConfig{"MinAboveMax",
                  [](LaunchConfig& c) {
                    c.minNodes = 3;
                    c.maxNodes = 2;
                  },
                  "--nnodes"},
        BadConfig{"MultiNodeWithoutNodeRank", [](LaunchConfig& c) { c.maxNodes = 2; },
                  "--node-rank R"},
        BadConfig{"NodeRank", [](LaunchConfig& c) { c.nodeRank = 1; }, "--node-rank"},
        BadConfig{"Backend", [](LaunchConfig& c) { c.rdzvBackend = "etcd"; }, "--rdzv-backend"},
        BadConfig{"MasterPort", [](LaunchConfig& c) { c.masterPort = 70000; }, "--master-port"},
        BadConfig{"SamePorts", [](LaunchConfig& c) { c.masterPort = c.rdzvPort = 29500; },
                  "share a port"},
        BadConfig{"Restarts", [](LaunchConfig& c) { c.maxRestarts = -1; }, "--max-restarts"},
        BadConfig{"Grace", [](LaunchConfig& c) { c.gracePeriod = 0; }, "--grace-period"},
        BadConfig{"GraceHuge", [](LaunchConfig& c) { c.gracePeriod = 1e300; }, "--grace-period"},
        BadConfig{"ExitBarrier", [](LaunchConfig& c) { c.exitBarrierTimeout = -1; },
                  "--exit-barrier-timeout"},
        BadConfig{"ExitBarrierHuge", [](LaunchConfig& c) { c.exitBarrierTimeout = 1e300; },
                  "--exit-barrier-timeout"},
        BadConfig{"Monitor", [](LaunchConfig& c) { c.monitorInterval = -1; }, "--monitor-interval"},
        BadConfig{"ModuleNoPython", [](LaunchConfig& c) { c.module = c.noPython = true; },
                  "--no-python"},
        BadConfig{"EmptyPython", [](LaunchConfig& c) { c.python.clear(); }, "--python"},
        BadConfig{"LogMax", [](LaunchConfig& c) { c.logMaxBytes = 10; }, "--log-max-bytes"},
        BadConfig{"RunId", [](LaunchConfig& c) { c.runId = "a/b"; }, "--run-id"},
        BadConfig{"RunIdDots", [](LaunchConfig& c) { c.runId = ".."; }, "--run-id"},
        BadConfig{"Template", [](LaunchConfig& c) { c.linePrefixTemplate = "${nope}"; },
                  "--log-line-prefix-template"},
        BadConfig{"ReservedEnv",
                  [](LaunchConfig& c) {
                    c.env.push_back({"WORLD_SIZE", "1"});
                  },
                  "WORLD_SIZE"},
        BadConfig{"LaunchOptionEnv",
                  [](LaunchConfig& c) {
                    c.env.push_back({"DTRAIN_LAUNCH_X", "1"});
                  },
                  "DTRAIN_LAUNCH_X"},
        BadConfig{"FromEnvironment",
                  [](LaunchConfig& c) {
                    c.gracePeriod = -2;
                    c.optionSources["grace-period"] = "DTRAIN_LAUNCH_GRACE_PERIOD";
                  },
                  "DTRAIN_LAUNCH_GRACE_PERIOD (environment)"}),
    [](const ::testing::TestParamInfo<BadConfig>& info) { return info.param.name; });

TEST(ParseEnvAssignment, KeyValue) {
  EXPECT_EQ(parseEnvAssignment("A=b=c", "--env"),
            std::make_pair(std::string("A"), std::string("b=c")));
  EXPECT_EQ(parseEnvAssignment("A=", "--env").second, "");
  for (const char* bad : {"A", "=x", "1A=x", "A B=x", "RANK=1", "DTRAIN_STORE_TOKEN=x"}) {
    EXPECT_THROW(parseEnvAssignment(bad, "--env"), InvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace dtrain::launcher::launcher_config_test
