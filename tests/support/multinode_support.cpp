#include "multinode_support.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <sstream>

#include "free_port.h"
#include "test_support.h"

namespace dtrain::testing {

std::vector<std::string> timings() {
  return {"--heartbeat-interval", "0.5", "--heartbeat-timeout", "3",
          "--rdzv-timeout",       "20",  "--grace-period",      "2"};
}

std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The simulated hosts are this machine, but ssh gives their workers a clean environment: an
// OPENBLAS_* variable of this one (OPENBLAS_CORETYPE picks OpenBLAS's kernels) would make a run on
// the cluster differ in the last bits from the same run started here, which the bitwise tests
// compare. Pass them on, as a user would with --env.
std::vector<std::string> blasEnv() {
  std::vector<std::string> args;
  for (char** e = environ; *e; ++e) {
    if (std::string(*e).rfind("OPENBLAS_", 0) == 0) args.insert(args.end(), {"--env", *e});
  }
  return args;
}

int storePort(const Cluster& c) {
  static std::map<std::string, int> ports;  // one per cluster, picked once
  auto it = ports.find(c.name());
  if (it != ports.end()) return it->second;
  const int port = freePortOn(c.bridgeAddress());
  EXPECT_GT(port, 0) << "no free port on " << c.bridgeAddress();
  ports[c.name()] = port;
  return port;
}

std::vector<std::string> fanOutFromANode(const Cluster& c, const std::vector<std::string>& extra) {
  return cat(
      cat(cat({"--hosts", c.hostList(), "--ssh-config", c.sshConfig()}, timings()), blasEnv()),
      extra);
}

std::vector<std::string> fanOut(const Cluster& c, const std::vector<std::string>& extra) {
  return cat(cat({"--hosts", c.hostList(), "--ssh-config", c.sshConfig(), "--rdzv-endpoint",
                  c.bridgeAddress() + ":" + std::to_string(storePort(c))},
                 cat(timings(), blasEnv())),
             extra);
}

std::vector<pid_t> pidsOn(const Cluster& c, int k, const std::string& needle) {
  std::vector<pid_t> pids;
  FILE* p = ::popen(
      ("ip netns pids " + c.name() + "-" + std::to_string(k) + " 2>/dev/null").c_str(), "r");
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

std::vector<std::string> listeningAddresses(const std::string& procNetTcp, int port) {
  // "  0: 0100007F:1F90 00000000:0000 0A ...": the local address as the kernel's u32 (IPv4) or
  // four u32 (IPv6) in hex, the port in hex, state 0A = LISTEN.
  std::vector<std::string> out;
  std::istringstream in(procNetTcp);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string slot, local, remote, state;
    if (!(words >> slot >> local >> remote >> state) || state != "0A") continue;
    const size_t colon = local.find(':');
    if (colon == std::string::npos || std::stoi(local.substr(colon + 1), nullptr, 16) != port)
      continue;
    const std::string addr = local.substr(0, colon);
    if (addr.size() == 8) {
      in_addr a{};
      a.s_addr = static_cast<in_addr_t>(std::stoul(addr, nullptr, 16));
      char text[INET_ADDRSTRLEN] = {};
      ::inet_ntop(AF_INET, &a, text, sizeof text);
      out.push_back(text);
    } else {
      out.push_back("[" + addr + "]");
    }
  }
  return out;
}

}  // namespace dtrain::testing
