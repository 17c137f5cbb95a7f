#pragma once
// Shared pieces of the multi-node e2e tests.
#include <string>
#include <vector>

#include "cluster_support.h"
#include "launcher_support.h"

namespace dtrain::testing {

// Test timings: heartbeat every 0.5 s, dead after 3 s, rendezvous 20 s, grace 2 s.
constexpr double kHeartbeatTimeout = 3;
constexpr double kGrace = 2;

// Brings up `n` hosts or skips the test (GTEST_SKIP needs the caller's scope: use the macro).
#define DTRAIN_CLUSTER_OR_SKIP(var, n)                      \
  std::string var##Skip;                                    \
  auto var = ::dtrain::testing::Cluster::up(n, &var##Skip); \
  if (!var) GTEST_SKIP() << var##Skip

// The fan-out options for cluster `c` (all its hosts) with the master here, outside the nodes,
// then `extra`. The store listens on the bridge's address at storePort(c) -- a port free here,
// not the default 29400, which other jobs on a shared machine may hold on every address.
std::vector<std::string> fanOut(const Cluster& c, const std::vector<std::string>& extra = {});
// The fan-out options without --rdzv-endpoint (a master inside a node: default address and port).
std::vector<std::string> fanOutFromANode(const Cluster& c,
                                         const std::vector<std::string>& extra = {});
int storePort(const Cluster& c);
// The common timing options alone.
std::vector<std::string> timings();
// a + b.
std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b);
// pids of processes on host k of `c` whose command line contains `needle`.
std::vector<pid_t> pidsOn(const Cluster& c, int k, const std::string& needle);
// The addresses with a TCP socket listening on `port`, from the text of /proc/net/tcp and
// /proc/net/tcp6 (IPv4 as "a.b.c.d", IPv6 as "[hex]").
std::vector<std::string> listeningAddresses(const std::string& procNetTcp, int port);

}  // namespace dtrain::testing
