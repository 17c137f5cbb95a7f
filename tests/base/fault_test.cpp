#include <signal.h>

#include <chrono>

#include <gtest/gtest.h>

#include "dtrain/base/error.h"
#include "fault.h"

namespace dtrain::fault::fault_test {
namespace {

struct GoodSpec {
  const char* spec;
  Kind kind;
  int64_t arg;
  int rank;
  int64_t step;
  int attempt;
  const char* roundTrip;
};

class FaultParseTest : public ::testing::TestWithParam<GoodSpec> {};

TEST_P(FaultParseTest, ParsesAndPrintsBack) {
  const GoodSpec& g = GetParam();
  auto faults = parseFaults(g.spec);
  ASSERT_EQ(faults.size(), 1u);
  EXPECT_EQ(faults[0].kind, g.kind);
  EXPECT_EQ(faults[0].arg, g.arg);
  EXPECT_EQ(faults[0].rank, g.rank);
  EXPECT_EQ(faults[0].step, g.step);
  EXPECT_EQ(faults[0].attempt, g.attempt);
  EXPECT_EQ(faults[0].describe(), g.roundTrip);
}

INSTANTIATE_TEST_SUITE_P(
    Table, FaultParseTest,
    ::testing::Values(
        GoodSpec{"exit:3", Kind::Exit, 3, -1, -1, -1, "exit:3"},
        GoodSpec{"exit:0@rank=1", Kind::Exit, 0, 1, -1, -1, "exit:0@rank=1"},
        GoodSpec{"signal:KILL@rank=3,step=17,attempt=0", Kind::Signal, SIGKILL, 3, 17, 0,
                 "signal:KILL@rank=3,step=17,attempt=0"},
        GoodSpec{"signal:SIGSEGV", Kind::Signal, SIGSEGV, -1, -1, -1, "signal:SEGV"},
        GoodSpec{"signal:15", Kind::Signal, SIGTERM, -1, -1, -1, "signal:TERM"},
        GoodSpec{"abort@step=2", Kind::Abort, 0, -1, 2, -1, "abort@step=2"},
        GoodSpec{"hang@rank=0", Kind::Hang, 0, 0, -1, -1, "hang@rank=0"},
        GoodSpec{"stop", Kind::Stop, 0, -1, -1, -1, "stop"},
        GoodSpec{"slow:250@attempt=1", Kind::Slow, 250, -1, -1, 1, "slow:250@attempt=1"},
        GoodSpec{"nan-grad@rank=2,step=5", Kind::NanGrad, 0, 2, 5, -1, "nan-grad@rank=2,step=5"},
        GoodSpec{"skip-collective@rank=1", Kind::SkipCollective, 0, 1, -1, -1,
                 "skip-collective@rank=1"},
        GoodSpec{"wrong-shape", Kind::WrongShape, 0, -1, -1, -1, "wrong-shape"},
        GoodSpec{"flood:10000", Kind::Flood, 10000, -1, -1, -1, "flood:10000"},
        GoodSpec{"grandchild@rank=0", Kind::Grandchild, 0, 0, -1, -1, "grandchild@rank=0"},
        GoodSpec{"error-file:7", Kind::ErrorFile, 7, -1, -1, -1, "error-file:7"},
        GoodSpec{" exit:1 ", Kind::Exit, 1, -1, -1, -1, "exit:1"}));

struct BadSpec {
  const char* spec;
  const char* mentions;  // the message must name the offending part
};

class FaultRejectTest : public ::testing::TestWithParam<BadSpec> {};

TEST_P(FaultRejectTest, SaysWhatIsWrong) {
  const BadSpec& b = GetParam();
  try {
    parseFaults(b.spec);
    FAIL() << "accepted " << b.spec;
  } catch (const InvalidArgument& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("DTRAIN_FAULT"), std::string::npos) << what;
    EXPECT_NE(what.find(b.mentions), std::string::npos) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table, FaultRejectTest,
    ::testing::Values(BadSpec{"explode", "explode"}, BadSpec{"exit", "needs"},
                      BadSpec{"abort:3", "takes no"}, BadSpec{"exit:x", "\"x\""},
                      BadSpec{"exit:300", "300"}, BadSpec{"signal:NOPE", "NOPE"},
                      BadSpec{"exit:1@rnk=1", "rnk"}, BadSpec{"exit:1@rank=-1", "rank=-1"},
                      BadSpec{"exit:1@rank", "rank"}, BadSpec{"exit:1@", "empty condition"},
                      BadSpec{"slow:-5", "-5"}));

TEST(FaultTest, SeveralFaultsAndMatching) {
  auto faults = parseFaults("exit:1@rank=1;slow:10@step=3,attempt=2;");
  ASSERT_EQ(faults.size(), 2u);
  EXPECT_TRUE(faults[0].matches(1, 0, 0));
  EXPECT_TRUE(faults[0].matches(1, 99, 5));
  EXPECT_FALSE(faults[0].matches(0, 0, 0));
  EXPECT_TRUE(faults[1].matches(7, 3, 2));
  EXPECT_FALSE(faults[1].matches(7, 3, 1));
  EXPECT_FALSE(faults[1].matches(7, 4, 2));
  EXPECT_TRUE(parseFaults("").empty());
}

TEST(FaultTest, NanGradPhaseAndValue) {
  auto faults = parseFaults("nan-grad:inf@rank=1,step=3,phase=after;nan-grad@step=2,phase=before");
  ASSERT_EQ(faults.size(), 2u);
  EXPECT_TRUE(faults[0].after);
  EXPECT_EQ(faults[0].arg, 1);  // inf
  EXPECT_EQ(faults[0].describe(), "nan-grad:inf@rank=1,step=3,phase=after");
  EXPECT_FALSE(faults[1].after);
  EXPECT_EQ(faults[1].arg, 0);  // NaN
  EXPECT_EQ(faults[1].describe(), "nan-grad@step=2");
  EXPECT_EQ(parseFaults("nan-grad:nan")[0].describe(), "nan-grad");
  for (const char* bad :
       {"nan-grad:zero", "nan-grad@phase=during", "exit:1@phase=after", "nan-grad@phase"}) {
    EXPECT_THROW(parseFaults(bad), InvalidArgument) << bad;
  }
}

TEST(IoFaultTest, ConditionsOnRankAndAttempt) {
  auto faults = parseIoFaults("crash@io=7,rank=0,attempt=0;write:ENOSPC@2,attempt=1");
  ASSERT_EQ(faults.size(), 2u);
  EXPECT_EQ(faults[0].rank, 0);
  EXPECT_EQ(faults[0].attempt, 0);
  EXPECT_EQ(faults[0].describe(), "crash@io=7,rank=0,attempt=0");
  EXPECT_EQ(faults[1].rank, -1);
  EXPECT_EQ(faults[1].describe(), "write:ENOSPC@2,attempt=1");
  for (const char* bad : {"crash@io=3,step=1", "write:EIO@1,rank=-1", "crash@io=3,attempt"}) {
    EXPECT_THROW(parseIoFaults(bad), InvalidArgument) << bad;
  }
  // fromEnv keeps what matches this rank and attempt.
  ::setenv("DTRAIN_IO_FAULT", "write:EIO@1,rank=1;fsync:EIO@1,attempt=0;open:EIO@1,attempt=3", 1);
  ::setenv("DTRAIN_RESTART_COUNT", "0", 1);
  IoFaultInjector rank0 = IoFaultInjector::fromEnv(0);
  EXPECT_EQ(rank0.before(IoOp::Write), 0);
  EXPECT_EQ(rank0.before(IoOp::Fsync), EIO);
  EXPECT_EQ(rank0.before(IoOp::Open), 0);
  IoFaultInjector rank1 = IoFaultInjector::fromEnv(1);
  EXPECT_EQ(rank1.before(IoOp::Write), EIO);
  ::unsetenv("DTRAIN_IO_FAULT");
  ::unsetenv("DTRAIN_RESTART_COUNT");
  EXPECT_TRUE(IoFaultInjector::fromEnv(0).empty());
}

TEST(IoFaultTest, ParsesAndCounts) {
  auto faults = parseIoFaults("write:ENOSPC@3;fsync:EIO@1;crash@io=5");
  ASSERT_EQ(faults.size(), 3u);
  EXPECT_EQ(faults[0].describe(), "write:ENOSPC@3");
  EXPECT_EQ(faults[1].describe(), "fsync:EIO@1");
  EXPECT_EQ(faults[2].describe(), "crash@io=5");

  IoFaultInjector inj(parseIoFaults("write:ENOSPC@3;fsync:5@1"));
  EXPECT_EQ(inj.before(IoOp::Write), 0);
  EXPECT_EQ(inj.before(IoOp::Write), 0);
  EXPECT_EQ(inj.before(IoOp::Fsync), EIO);
  EXPECT_EQ(inj.before(IoOp::Write), ENOSPC);
  EXPECT_EQ(inj.before(IoOp::Write), 0);
}

TEST(IoFaultTest, CrashPointKillsAfterTheKthCall) {
  EXPECT_EXIT(
      {
        IoFaultInjector inj(parseIoFaults("crash@io=2"));
        inj.before(IoOp::Open);
        inj.after();
        inj.before(IoOp::Write);
        inj.after();
        std::exit(0);  // not reached
      },
      ::testing::KilledBySignal(SIGKILL), "");
}

// A slow disk: every write (or only the N-th) sleeps before it runs, then goes ahead.
TEST(IoFaultTest, SlowCallsSleepAndThenGoAhead) {
  auto faults = parseIoFaults("write:slow:120;fsync:slow:50@2,rank=1");
  ASSERT_EQ(faults.size(), 2u);
  EXPECT_EQ(faults[0].describe(), "write:slow:120");
  EXPECT_EQ(faults[1].describe(), "fsync:slow:50@2,rank=1");
  EXPECT_EQ(parseIoFaults("write:slow:7,attempt=0")[0].describe(), "write:slow:7,attempt=0");
  IoFaultInjector inj(parseIoFaults("write:slow:120;fsync:slow:150@2;write:EIO@2"));
  auto timed = [&](IoOp op, int expected) {
    auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(inj.before(op), expected);
    return std::chrono::steady_clock::now() - start;
  };
  EXPECT_GE(timed(IoOp::Write, 0), std::chrono::milliseconds(120));
  EXPECT_GE(timed(IoOp::Write, EIO), std::chrono::milliseconds(120));  // slow, then it fails
  EXPECT_LT(timed(IoOp::Fsync, 0), std::chrono::milliseconds(100));
  EXPECT_GE(timed(IoOp::Fsync, 0), std::chrono::milliseconds(150));
  EXPECT_LT(timed(IoOp::Open, 0), std::chrono::milliseconds(100));
}

TEST(IoFaultTest, RejectsBadSpecs) {
  for (const char* bad :
       {"write:ENOSPC", "unlink:EIO@1", "write:EWHAT@1", "write:EIO@0", "crash@io=0",
        "crash@step=1", "write@1", "write:slow:0", "write:slow:x", "write:slow:", "write:slow:5@0",
        "unlink:slow:5", "write:slow:5,step=1"}) {
    EXPECT_THROW(parseIoFaults(bad), InvalidArgument) << bad;
  }
}

TEST(SignalNamesTest, BothWays) {
  EXPECT_EQ(parseSignal("KILL"), SIGKILL);
  EXPECT_EQ(parseSignal("sigterm"), SIGTERM);
  EXPECT_EQ(parseSignal("11"), SIGSEGV);
  EXPECT_EQ(parseSignal("BOGUS"), -1);
  EXPECT_EQ(signalName(SIGSEGV), "SIGSEGV");
  EXPECT_EQ(signalName(SIGKILL), "SIGKILL");
  EXPECT_EQ(signalName(77), "signal 77");
}

}  // namespace
}  // namespace dtrain::fault::fault_test
