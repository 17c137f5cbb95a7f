// The NCCL watchdog's heartbeat monitor, without a GPU: its settings from PyTorch's variables and
// its message (docs/reliability.md M3). The timing cases are in heartbeat_monitor_failure_test.cpp.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "dtrain/base/error.h"
#include "heartbeat_monitor.h"

namespace dtrain::comm::heartbeat_monitor_test {
namespace {

// Sets (or unsets, for nullptr) a variable for one scope.
class ScopedVar {
 public:
  ScopedVar(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~ScopedVar() {
    if (had_) ::setenv(name_.c_str(), old_.c_str(), 1);
    else ::unsetenv(name_.c_str());
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

TEST(HeartbeatSettings, PyTorchsVariablesSetTheTimeoutAndTurnItOff) {
  ScopedVar on("TORCH_NCCL_ENABLE_MONITORING", nullptr);
  ScopedVar timeout("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", nullptr);
  HeartbeatSetting s = heartbeatFromEnv(Millis(1234));
  EXPECT_TRUE(s.enabled);
  EXPECT_EQ(s.timeout, Millis(1234));  // the options' value when nothing is set

  ::setenv("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "90", 1);
  s = heartbeatFromEnv(Millis(1234));
  EXPECT_TRUE(s.enabled);
  EXPECT_EQ(s.timeout, Millis(90000));

  ::setenv("TORCH_NCCL_ENABLE_MONITORING", "0", 1);
  EXPECT_FALSE(heartbeatFromEnv(Millis::zero()).enabled);
  ::setenv("TORCH_NCCL_ENABLE_MONITORING", "1", 1);
  EXPECT_TRUE(heartbeatFromEnv(Millis::zero()).enabled);
}

TEST(HeartbeatSettings, MalformedValuesAreRefusedNamingTheVariable) {
  ScopedVar on("TORCH_NCCL_ENABLE_MONITORING", nullptr);
  ScopedVar timeout("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", nullptr);
  for (const char* bad : {"0", "-5", "ten", "5s", "1e3"}) {
    ::setenv("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", bad, 1);
    try {
      heartbeatFromEnv(Millis::zero());
      ADD_FAILURE() << "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=" << bad << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=") + bad),
                std::string::npos)
          << e.what();
    }
  }
  ::unsetenv("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC");
  ::setenv("TORCH_NCCL_ENABLE_MONITORING", "yes", 1);
  EXPECT_THROW(heartbeatFromEnv(Millis::zero()), InvalidArgument);
}

TEST(HeartbeatMonitor, ZeroIsTheDefaultAndTheMessageNamesWhoWhereAndHowLong) {
  HeartbeatMonitorOptions o;
  o.who = "nccl rank 1/4 (cuda:1)";
  o.timeout = Millis::zero();
  o.describe = [] { return std::string("its last collectives: seq 7 allreduce running"); };
  HeartbeatMonitor monitor(o);
  EXPECT_EQ(monitor.timeout(), kDefaultHeartbeatTimeout);
  EXPECT_EQ(monitor.checkInterval(), Millis(10000));  // timeout / 8, at most 10 s
  monitor.beat("ncclCommAbort");
  const std::string m = monitor.message(Millis(481500));
  for (const char* part : {"nccl rank 1/4 (cuda:1)", "481.5 s", "heartbeat timeout 480 s",
                           "it was in: ncclCommAbort", "seq 7 allreduce running", "HINT"}) {
    EXPECT_NE(m.find(part), std::string::npos) << "missing \"" << part << "\" in: " << m;
  }
  HeartbeatMonitorOptions negative;
  negative.timeout = Millis(-1);
  EXPECT_THROW(HeartbeatMonitor{negative}, InvalidArgument);
}

}  // namespace
}  // namespace dtrain::comm::heartbeat_monitor_test
