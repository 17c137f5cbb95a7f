// The monitoring options of launch: parsed values, defaults, and one clear usage error each.
#include <gtest/gtest.h>

#include "dtrain/base/error.h"
#include "launcher/config/launch_args.h"

namespace dtrain::launcher::launcher_monitor_options_test {
namespace {

using Args = std::vector<std::string>;

MonitorOptions parse(const Args& options, const std::map<std::string, std::string>& env = {}) {
  Args args = options;
  args.push_back("./train");
  return parseLaunchArgs(args, env).config.monitor;
}

std::string usageError(const Args& options) {
  try {
    parse(options);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(MonitorOptions, DefaultsSampleEveryFiveSecondsAndNothingElse) {
  MonitorOptions o = parse({});
  EXPECT_EQ(o.sampleInterval, 5.0);
  EXPECT_EQ(o.metricsPort, -1);
  EXPECT_TRUE(o.metricsFile.empty());
  EXPECT_TRUE(o.tensorboardDir.empty());
  EXPECT_EQ(o.statusInterval, 0);
  EXPECT_EQ(o.stallTimeout, 0);
  EXPECT_EQ(o.stallAction, StallAction::Report);
}

TEST(MonitorOptions, ParsedValues) {
  MonitorOptions o = parse({"--sample-interval", "0.5", "--metrics-port", "127.0.0.1:9400",
                            "--metrics-file=m.jsonl", "--tensorboard-dir", "runs/a",
                            "--status-interval", "30", "--stall-timeout", "600", "--stall-action",
                            "stop"});
  EXPECT_EQ(o.sampleInterval, 0.5);
  EXPECT_EQ(o.metricsHost, "127.0.0.1");
  EXPECT_EQ(o.metricsPort, 9400);
  EXPECT_EQ(o.metricsFile, "m.jsonl");
  EXPECT_EQ(o.tensorboardDir, "runs/a");
  EXPECT_EQ(o.statusInterval, 30);
  EXPECT_EQ(o.stallTimeout, 600);
  EXPECT_EQ(o.stallAction, StallAction::Stop);
  EXPECT_EQ(parse({"--metrics-port", "0"}).metricsPort, 0);
  EXPECT_EQ(parse({"--metrics-port", "9400"}).metricsHost, "0.0.0.0");
  EXPECT_EQ(parse({"--metrics_port", "[::1]:9400"}).metricsHost, "::1");
  // torchrun's --monitor-interval stays accepted and does not touch sampling.
  EXPECT_EQ(parse({"--monitor-interval", "0.1"}).sampleInterval, 5.0);
  EXPECT_EQ(parse({}, {{"DTRAIN_LAUNCH_STALL_TIMEOUT", "60"}}).stallTimeout, 60);
}

TEST(MonitorOptions, UsageErrorsNameTheOption) {
  EXPECT_NE(
      usageError({"--stall-action", "stop"}).find("--stall-action stop needs --stall-timeout"),
      std::string::npos);
  EXPECT_NE(usageError({"--stall-action", "kill"}).find("use report"), std::string::npos);
  EXPECT_NE(usageError({"--stall-timeout", "1"}).find("at least 2 seconds"), std::string::npos);
  EXPECT_NE(usageError({"--sample-interval", "0.001"}).find("--sample-interval"),
            std::string::npos);
  EXPECT_NE(usageError({"--sample-interval", "0"}).find("--sample-interval"), std::string::npos);
  EXPECT_NE(usageError({"--metrics-port", "70000"}).find("not a port"), std::string::npos);
  EXPECT_NE(usageError({"--metrics-port", ":9400"}).find("empty"), std::string::npos);
  EXPECT_NE(usageError({"--metrics-file="}).find("--metrics-file is empty"), std::string::npos);
  EXPECT_NE(usageError({"--tensorboard-dir="}).find("--tensorboard-dir is empty"),
            std::string::npos);
}

}  // namespace
}  // namespace dtrain::launcher::launcher_monitor_options_test
