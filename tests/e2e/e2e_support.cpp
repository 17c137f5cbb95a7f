#include "e2e_support.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "test_support.h"

namespace dtrain::testing {

std::vector<std::string> timings() {
  return {"--heartbeat-interval", "0.5", "--heartbeat-timeout", "3", "--rdzv-timeout", "20",
          "--grace-period", "2"};
}

std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<std::string> fanOut(const Cluster& c, const std::vector<std::string>& extra) {
  return cat(cat({"--hosts", c.hostList(), "--ssh-config", c.sshConfig()}, timings()), extra);
}

std::vector<pid_t> pidsOn(const Cluster& c, int k, const std::string& needle) {
  std::vector<pid_t> pids;
  FILE* p = ::popen(("ip netns pids " + c.name() + "-" + std::to_string(k) + " 2>/dev/null").c_str(), "r");
  if (!p) return pids;
  for (int pid; std::fscanf(p, "%d", &pid) == 1;) {
    std::string cmd = readFile("/proc/" + std::to_string(pid) + "/cmdline");
    for (auto& ch : cmd) {
      if (ch == '\0') ch = ' ';
    }
    if (cmd.find(needle) != std::string::npos) pids.push_back(pid);
  }
  ::pclose(p);
  return pids;
}

}  // namespace dtrain::testing
