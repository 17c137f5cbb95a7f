// What launch reads from /proc to name a process that survived SIGKILL: state, command, children.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "launcher/supervisor/process_info.h"

namespace dtrain::launcher::launcher_process_info_test {
namespace {

// Polls until `pid` is in state `letter` (the kernel moves a signalled child asynchronously).
bool reachesState(pid_t pid, char letter) {
  for (int i = 0; i < 500; ++i) {
    if (processState(pid) == letter) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

TEST(ProcessInfo, StateCommandAndChildren) {
  std::optional<ProcessInfo> self = inspectProcess(::getpid());
  ASSERT_TRUE(self.has_value());
  EXPECT_EQ(self->stateLetter, 'R');
  EXPECT_EQ(self->state, "R (running)");
  EXPECT_NE(self->command.find("dtrain_unit_tests"), std::string::npos) << self->command;

  pid_t child = ::fork();
  if (child == 0) {
    while (true) ::pause();
  }
  ASSERT_GT(child, 0);
  std::vector<pid_t> children = childProcesses(::getpid());
  EXPECT_NE(std::find(children.begin(), children.end(), child), children.end());

  ::kill(child, SIGSTOP);
  ASSERT_TRUE(reachesState(child, 'T'));
  EXPECT_EQ(inspectProcess(child)->state, "T (stopped)");

  ::kill(child, SIGKILL);
  ASSERT_TRUE(reachesState(child, 'Z'));
  std::optional<ProcessInfo> zombie = inspectProcess(child);
  ASSERT_TRUE(zombie.has_value());
  EXPECT_EQ(zombie->state, "Z (zombie)");
  EXPECT_EQ(zombie->command, "[dtrain_unit_tes]")
      << "no argv left: the name, as the kernel cuts it";

  ::waitpid(child, nullptr, 0);
  EXPECT_FALSE(inspectProcess(child).has_value());
  EXPECT_EQ(processState(child), 0);
  EXPECT_TRUE(childProcesses(child).empty());
}

}  // namespace
}  // namespace dtrain::launcher::launcher_process_info_test
