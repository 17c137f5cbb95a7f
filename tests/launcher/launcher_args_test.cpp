// splitLauncherArgs / parseLaunchArgs / workerCommandLine: tables of command lines.
#include <gtest/gtest.h>

#include "dtrain/base/error.h"
#include "launcher/config/launch_args.h"
#include "launcher/node/program.h"

namespace dtrain::launcher::launcher_args_test {
namespace {

using Args = std::vector<std::string>;
using Options = std::vector<OptionValue>;

struct SplitCase {
  const char* name;
  Args args;
  Options launcher;
  Args program;
};

class SplitTest : public ::testing::TestWithParam<SplitCase> {};

TEST_P(SplitTest, SplitsWhereTheProgramBegins) {
  const SplitCase& c = GetParam();
  SplitArgs s = splitLauncherArgs(c.args);
  ASSERT_EQ(s.options.size(), c.launcher.size());
  for (size_t i = 0; i < c.launcher.size(); ++i) {
    EXPECT_EQ(s.options[i].name, c.launcher[i].name) << i;
    EXPECT_EQ(s.options[i].value, c.launcher[i].value) << i;
  }
  EXPECT_EQ(s.program, c.program);
}

INSTANTIATE_TEST_SUITE_P(
    Table, SplitTest,
    ::testing::Values(
        SplitCase{"ProgramOnly", {"./train"}, {}, {"./train"}},
        SplitCase{"ValueSeparate",
                  {"--nproc-per-node", "4", "./train", "--lr", "1"},
                  {{"nproc-per-node", "4"}},
                  {"./train", "--lr", "1"}},
        SplitCase{"ValueJoined",
                  {"--nproc-per-node=4", "./train"},
                  {{"nproc-per-node", "4"}},
                  {"./train"}},
        SplitCase{"TorchrunUnderscores",
                  {"--nproc_per_node=2", "--max_restarts", "3", "t.py"},
                  {{"nproc-per-node", "2"}, {"max-restarts", "3"}},
                  {"t.py"}},
        SplitCase{"RdzvIdIsRunId", {"--rdzv_id", "abc", "x"}, {{"run-id", "abc"}}, {"x"}},
        SplitCase{"Flag", {"--standalone", "x"}, {{"standalone", "true"}}, {"x"}},
        SplitCase{"ShortWithValue",
                  {"-r", "3", "-t3", "x"},
                  {{"redirects", "3"}, {"tee", "3"}},
                  {"x"}},
        SplitCase{"ShortFlag", {"-m", "pkg.train"}, {{"module", "true"}}, {"pkg.train"}},
        SplitCase{"DoubleDash",
                  {"--nproc-per-node", "2", "--", "--weird-name", "--x"},
                  {{"nproc-per-node", "2"}},
                  {"--weird-name", "--x"}},
        SplitCase{"ProgramFlagsUntouched",
                  {"x", "--nproc-per-node", "9"},
                  {},
                  {"x", "--nproc-per-node", "9"}},
        SplitCase{"ValueLooksLikeFlag",
                  {"--log-line-prefix-template", "--", "x"},
                  {{"log-line-prefix-template", "--"}},
                  {"x"}},
        SplitCase{"ValueWithEquals",
                  {"--env=A=b=c", "--env", "--X=1", "x"},
                  {{"env", "A=b=c"}, {"env", "--X=1"}},
                  {"x"}},
        SplitCase{"EmptyValue", {"--role=", "x"}, {{"role", ""}}, {"x"}},
        SplitCase{"NoProgram", {"--nproc-per-node", "2"}, {{"nproc-per-node", "2"}}, {}},
        SplitCase{"DashAloneIsAProgram", {"-"}, {}, {"-"}}),
    [](const ::testing::TestParamInfo<SplitCase>& info) { return info.param.name; });

TEST(SplitLauncherArgs, HelpAndVersion) {
  EXPECT_TRUE(splitLauncherArgs({"--help"}).help);
  EXPECT_TRUE(splitLauncherArgs({"-h", "x"}).help);
  EXPECT_FALSE(splitLauncherArgs({"x", "--help"}).help);
  EXPECT_TRUE(splitLauncherArgs({"--version"}).version);
}

struct BadSplit {
  const char* name;
  Args args;
  const char* mentions;
};

class BadSplitTest : public ::testing::TestWithParam<BadSplit> {};

TEST_P(BadSplitTest, NamesTheProblem) {
  try {
    splitLauncherArgs(GetParam().args);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(GetParam().mentions), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table, BadSplitTest,
    ::testing::Values(BadSplit{"Unknown", {"--nprocs", "2", "x"}, "unknown option --nprocs"},
                      BadSplit{"UnknownShort", {"-z", "x"}, "unknown option -z"},
                      BadSplit{"MissingValue", {"--run-id"}, "--run-id needs a value"},
                      BadSplit{"FlagWithValue", {"--standalone=maybe", "x"}, "is a flag"},
                      BadSplit{"ShortFlagWithValue", {"-mx", "x"}, "takes no value"}),
    [](const ::testing::TestParamInfo<BadSplit>& info) { return info.param.name; });

TEST(ParseLaunchArgs, FillsTheConfig) {
  ParsedCommand p = parseLaunchArgs({"--nproc_per_node",
                                     "auto",
                                     "--max-restarts",
                                     "2",
                                     "--grace-period",
                                     "1.5",
                                     "--env",
                                     "A=1",
                                     "--env",
                                     "B=x,y",
                                     "--rdzv-endpoint",
                                     "10.0.0.1:29400",
                                     "--master_port",
                                     "29501",
                                     "--local-ranks-filter",
                                     "0,3",
                                     "--redirects",
                                     "0:1,1:3",
                                     "--log-max-bytes",
                                     "64k",
                                     "train.py",
                                     "--epochs",
                                     "3"},
                                    {});
  const LaunchConfig& c = p.config;
  EXPECT_EQ(p.action, ParsedCommand::Action::Run);
  EXPECT_EQ(c.nprocPerNode.kind, NprocSpec::Kind::Auto);
  EXPECT_EQ(c.maxRestarts, 2);
  EXPECT_DOUBLE_EQ(c.gracePeriod, 1.5);
  ASSERT_EQ(c.env.size(), 2u);
  EXPECT_EQ(c.env[1].second, "x,y") << "a comma is part of the value";
  EXPECT_EQ(c.rdzvHost, "10.0.0.1");
  EXPECT_EQ(c.rdzvPort, 29400);
  EXPECT_EQ(c.masterPort, 29501);
  EXPECT_EQ(c.localRanksFilter, (std::vector<int>{0, 3}));
  EXPECT_EQ(c.redirects.streamsFor(1), 3);
  EXPECT_EQ(c.redirects.streamsFor(2), 0);
  EXPECT_EQ(c.logMaxBytes, 64 * 1024);
  EXPECT_EQ(c.program, "train.py");
  EXPECT_EQ(c.programArgs, (Args{"--epochs", "3"}));
}

TEST(ParseLaunchArgs, EnvironmentFillsWhatTheCommandLineLeaves) {
  std::map<std::string, std::string> env = {{"DTRAIN_LAUNCH_NPROC_PER_NODE", "3"},
                                            {"DTRAIN_LAUNCH_MAX_RESTARTS", "5"},
                                            {"DTRAIN_LAUNCH_DRY_RUN", "1"},
                                            {"DTRAIN_LAUNCH_ENV", "A=1\nB=2"},
                                            {"UNRELATED", "x"}};
  LaunchConfig c = parseLaunchArgs({"--max-restarts", "1", "x"}, env).config;
  EXPECT_EQ(c.nprocPerNode.count, 3);
  EXPECT_EQ(c.maxRestarts, 1) << "the command line wins";
  EXPECT_TRUE(c.dryRun);
  EXPECT_EQ(c.env.size(), 2u);
  EXPECT_EQ(optionLabel(c, "nproc-per-node"), "DTRAIN_LAUNCH_NPROC_PER_NODE (environment)");
  EXPECT_EQ(optionLabel(c, "max-restarts"), "--max-restarts");
}

TEST(ParseLaunchArgs, EnvironmentErrorsNameTheVariable) {
  try {
    parseLaunchArgs({"x"}, {{"DTRAIN_LAUNCH_GRACE_PERIOD", "-3"}});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("DTRAIN_LAUNCH_GRACE_PERIOD"), std::string::npos);
  }
  EXPECT_THROW(parseLaunchArgs({"x"}, {{"DTRAIN_LAUNCH_TYPO", "1"}}), InvalidArgument);
}

// --exit-barrier-timeout: seconds, 0 for no limit, 300 by default; from the flag (either
// spelling) or DTRAIN_LAUNCH_EXIT_BARRIER_TIMEOUT.
TEST(ParseLaunchArgs, ExitBarrierTimeout) {
  EXPECT_DOUBLE_EQ(parseLaunchArgs({"x"}, {}).config.exitBarrierTimeout, 300.0);
  EXPECT_DOUBLE_EQ(
      parseLaunchArgs({"--exit-barrier-timeout", "1.5", "x"}, {}).config.exitBarrierTimeout, 1.5);
  EXPECT_DOUBLE_EQ(parseLaunchArgs({"--exit_barrier_timeout=0", "x"}, {}).config.exitBarrierTimeout,
                   0.0)
      << "0: no limit";
  LaunchConfig fromEnv =
      parseLaunchArgs({"x"}, {{"DTRAIN_LAUNCH_EXIT_BARRIER_TIMEOUT", "7"}}).config;
  EXPECT_DOUBLE_EQ(fromEnv.exitBarrierTimeout, 7.0);
  EXPECT_EQ(optionLabel(fromEnv, "exit-barrier-timeout"),
            "DTRAIN_LAUNCH_EXIT_BARRIER_TIMEOUT (environment)");
  EXPECT_DOUBLE_EQ(parseLaunchArgs({"--exit-barrier-timeout", "2", "x"},
                                   {{"DTRAIN_LAUNCH_EXIT_BARRIER_TIMEOUT", "7"}})
                       .config.exitBarrierTimeout,
                   2.0)
      << "the command line wins";
}

TEST(ParseLaunchArgs, BadExitBarrierTimeoutNamesTheFlagOrVariable) {
  for (const char* bad : {"-1", "x", "", "1s", "inf", "nan", "1e10"}) {
    try {
      parseLaunchArgs({std::string("--exit-barrier-timeout=") + bad, "x"}, {});
      FAIL() << "accepted " << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("--exit-barrier-timeout"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("0 for no limit"), std::string::npos) << e.what();
    }
    try {
      parseLaunchArgs({"x"}, {{"DTRAIN_LAUNCH_EXIT_BARRIER_TIMEOUT", bad}});
      FAIL() << "accepted " << bad << " from the environment";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("DTRAIN_LAUNCH_EXIT_BARRIER_TIMEOUT (environment)"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(splitLauncherArgs({"--exit-barrier-timeout"}), InvalidArgument) << "needs a value";
}

// Values up to the kernel's limit for one argument (128 KiB) are read, never matched by a regular
// expression (launch used to die of SIGSEGV from ~25 KB up); whatever an option makes of one,
// the result is the value or one short message that quotes at most ~200 characters of it.
// Every option of the table, both spellings, from the command line and the environment.
constexpr size_t kArgMax = 128 * 1024;

void expectValueOrShortError(const Args& args, const std::map<std::string, std::string>& env,
                             const std::string& what) {
  try {
    parseLaunchArgs(args, env);
  } catch (const InvalidArgument& e) {
    const std::string message = e.what();
    EXPECT_LT(message.size(), 600u) << what << ": " << message.substr(0, 1000);
    EXPECT_EQ(message.find(std::string(kMaxQuotedChars + 1, 'x')), std::string::npos) << what;
  }
}

TEST(ParseLaunchArgs, ValuesUpToTheArgumentLimitNeverCrash) {
  const std::vector<std::string> names = valueOptionNames();
  ASSERT_GE(names.size(), 20u);
  for (const auto& name : names) {
    std::string joined = "--" + name + "=";
    joined += std::string(kArgMax - 1 - joined.size(), 'x');  // the NUL is the last byte
    expectValueOrShortError({joined, "prog"}, {}, joined.substr(0, 40));
    expectValueOrShortError({"--" + name, std::string(kArgMax - 1, 'x'), "prog"}, {}, name);
    std::string keyed = "--" + name + "=A=";  // a value that --env takes apart
    keyed += std::string(kArgMax - 1 - keyed.size(), 'x');
    expectValueOrShortError({keyed, "prog"}, {}, keyed.substr(0, 40));
    expectValueOrShortError({"prog"}, {{optionEnvName(name), std::string(kArgMax - 1, 'x')}},
                            optionEnvName(name));
  }
}

TEST(ParseLaunchArgs, LongEnvValueArrivesIntact) {
  std::string value(100000, 'v');
  for (size_t i = 0; i < value.size(); i += 7) value[i] = static_cast<char>('a' + i % 26);
  value[1] = '=';  // '=' and ',' inside the value are part of it
  value[2] = ',';
  LaunchConfig c =
      parseLaunchArgs({"--env", "CONFIG=" + value, "--env=B=" + value, "x"}, {}).config;
  ASSERT_EQ(c.env.size(), 2u);
  EXPECT_EQ(c.env[0].first, "CONFIG");
  EXPECT_TRUE(c.env[0].second == value) << "value of " << c.env[0].second.size() << " characters";
  EXPECT_TRUE(c.env[1].second == value);
}

TEST(SplitLauncherArgs, UnknownLongOptionIsQuotedShort) {
  const std::string name(100000, 'q');
  try {
    splitLauncherArgs({"--" + name + "=1", "x"});
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    const std::string message = e.what();
    EXPECT_LT(message.size(), 500u) << message.substr(0, 1000);
    EXPECT_NE(message.find("unknown option --" + std::string(kMaxQuotedChars - 2, 'q') + "..."),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("(100002 characters)"), std::string::npos) << message;
  }
}

TEST(QuoteValue, CutsAndEscapes) {
  EXPECT_EQ(quoteValue("abc"), "\"abc\"");
  EXPECT_EQ(quoteValue("a\"b\\c\n"), "\"a\\\"b\\\\c\\x0a\"");
  EXPECT_EQ(quoteValue(std::string(kMaxQuotedChars, 'z')),
            "\"" + std::string(kMaxQuotedChars, 'z') + "\"");
  EXPECT_EQ(quoteValue(std::string(kMaxQuotedChars + 1, 'z')),
            "\"" + std::string(kMaxQuotedChars, 'z') + "...\" (201 characters)");
  EXPECT_EQ(excerpt(std::string(1000, 'y')),
            std::string(kMaxQuotedChars, 'y') + "... (1000 characters)");
}

TEST(HelpText, EveryOptionOnce) {
  const std::string help = helpText();
  for (const auto& name : valueOptionNames()) {
    EXPECT_EQ(help.find("--" + name + " "), help.rfind("--" + name + " ")) << name;
    EXPECT_NE(help.find("--" + name + " "), std::string::npos) << name;
  }
  EXPECT_NE(help.find("  -r, --redirects SPEC"), std::string::npos) << help;
  EXPECT_NE(help.find("      --standalone "), std::string::npos) << help;
  size_t lineStart = 0;
  while (lineStart < help.size()) {
    size_t nl = help.find('\n', lineStart);
    if (nl == std::string::npos) nl = help.size();
    EXPECT_LE(nl - lineStart, 100u) << help.substr(lineStart, nl - lineStart);
    lineStart = nl + 1;
  }
}

TEST(OptionEnvName, UpperSnakeCase) {
  EXPECT_EQ(optionEnvName("nproc-per-node"), "DTRAIN_LAUNCH_NPROC_PER_NODE");
  EXPECT_EQ(optionEnvName("env"), "DTRAIN_LAUNCH_ENV");
}

struct CommandCase {
  const char* name;
  Args args;  // launch's arguments
  Args argv;  // what the worker runs
  bool interpreted;
};

class CommandLineTest : public ::testing::TestWithParam<CommandCase> {};

TEST_P(CommandLineTest, BuildsTheWorkersArgv) {
  LaunchConfig c = parseLaunchArgs(GetParam().args, {}).config;
  WorkerCommand cmd = workerCommandLine(c);
  EXPECT_EQ(cmd.argv, GetParam().argv);
  EXPECT_EQ(cmd.interpreted, GetParam().interpreted);
  EXPECT_EQ(cmd.file, cmd.argv[0]);
}

INSTANTIATE_TEST_SUITE_P(
    Table, CommandLineTest,
    ::testing::Values(
        CommandCase{"Binary", {"./train", "--lr", "1"}, {"./train", "--lr", "1"}, false},
        CommandCase{"Script", {"train.py", "-x"}, {"python3", "train.py", "-x"}, true},
        CommandCase{"ScriptOtherPython",
                    {"--python", "/opt/py/bin/python3", "t.py"},
                    {"/opt/py/bin/python3", "t.py"},
                    true},
        CommandCase{"NoPython", {"--no-python", "t.py"}, {"t.py"}, false},
        CommandCase{"Module", {"-m", "pkg.train", "a"}, {"python3", "-m", "pkg.train", "a"}, true},
        CommandCase{"PyInTheMiddle", {"./x.py.sh"}, {"./x.py.sh"}, false}),
    [](const ::testing::TestParamInfo<CommandCase>& info) { return info.param.name; });

TEST(ShellQuote, QuotesOnlyWhatNeedsIt) {
  EXPECT_EQ(shellQuote({"a", "b-c", "/x/y.py", "--k=v"}), "a b-c /x/y.py --k=v");
  // A quote closes, is double-quoted and reopens: the same words under sh, csh, tcsh and fish.
  EXPECT_EQ(shellQuote({"a b", "", "it's", "$(id)"}), "'a b' '' 'it'\"'\"'s' '$(id)'");
}

}  // namespace
}  // namespace dtrain::launcher::launcher_args_test
