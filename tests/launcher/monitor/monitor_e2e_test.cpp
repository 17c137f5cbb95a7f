// Watching a multi-node job on a simulated cluster (network namespaces + real sshd): every node's
// agent samples its node and publishes through the store; the master serves one endpoint for the
// whole job, writes one metrics file, and on a stall names the rank behind with the native stack
// its node's agent took (Note [Monitor roles] in launcher/monitor/monitor.h); each node's network,
// disk and memory figures reach all three of the master's sinks: the endpoint, the metrics file
// and the TensorBoard event file.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "launcher/monitor/command.h"
#include "multinode_support.h"
#include "prometheus_text_support.h"
#include "test_support.h"

namespace dtrain::testing::monitor_e2e_test {
namespace {

TEST(MultiNodeMonitor, OneEndpointForTheJobAndTheStackOfARankHungOnAnotherNode) {
  const std::string commWorker = binaryDir() + "/comm_worker";
  if (::access(commWorker.c_str(), X_OK) != 0) GTEST_SKIP() << "comm_worker not built (no Gloo)";
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  const std::string file = c->dir() + "/metrics.jsonl";
  // Rank 3 (node 1) hangs when it reaches collective 150, about 3 s into the job; the others wait
  // for it in that collective. The collective timeout (120 s) is far away.
  LaunchProcess p(
      fanOut(*c, {"--nproc-per-node", "2", "--sample-interval", "0.5", "--metrics-port", "0",
                  "--metrics-file", file, "--stall-timeout", "3", "--stall-action", "stop",
                  commWorker, "--iters", "100000", "--iter-ms", "20", "--timeout-ms", "120000"}),
      {"DTRAIN_FAULT=hang@rank=3,step=150"});
  const int port = metricsPort(p, 30);
  ASSERT_GT(port, 0) << p.err();

  // One scrape shows both nodes' ranks, labelled with the host list's names.
  const std::string node0 = c->hosts()[0];
  const std::string node1 = c->hosts()[1];
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(5);
  PromScrape scrape;
  bool both = false;
  for (int i = 0; i < 200 && !both; ++i) {
    if (auto res = client.Get("/metrics"); res && res->status == 200) {
      scrape = parsePrometheusText(res->body);
      both = scrape.value("dtrain_rss_bytes", {{"node", node0}, {"rank", "0"}}) &&
             scrape.value("dtrain_rss_bytes", {{"node", node1}, {"rank", "3"}}) &&
             scrape.value("dtrain_collective_seq", {{"node", node1}, {"rank", "3"}});
    }
    p.pump(100);
  }
  EXPECT_TRUE(both) << "no scrape with both nodes' ranks; last one had " << scrape.samples.size()
                    << " samples\n"
                    << p.err();
  EXPECT_EQ(scrape.value("dtrain_world_size"), 4);
  EXPECT_TRUE(scrape.value("dtrain_heartbeat_age_seconds", {{"node", node1}}));
  EXPECT_EQ(scrape.value("dtrain_workers_alive", {{"node", node1}}), 2);

  LaunchResult r = p.wait(90);
  ASSERT_FALSE(r.timedOut) << r.all();
  EXPECT_EQ(r.exitCode, 124) << r.all();
  EXPECT_EQ(countLines(r.err, "launch: STALL"), 1) << r.err;
  EXPECT_EQ(countLines(r.err, "no rank has published progress"), 0) << "every rank publishes";
  EXPECT_NE(r.err.find("behind: rank 3\n"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 3 has not started seq 150 allreduce"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(", node " + node1 + ", step 150): last collectives:"), std::string::npos)
      << r.err;
  const size_t stack = r.err.find("native stack of rank 3:");
  ASSERT_NE(stack, std::string::npos) << "taken by node 1's agent\n" << r.err;
  if (launcher::monitor::commandExists("eu-stack")) {
    const size_t next = r.err.find("native stack of rank", stack + 10);
    EXPECT_NE(r.err.substr(stack, next == std::string::npos ? std::string::npos : next - stack)
                  .find("hangOnCommThread"),
              std::string::npos)
        << r.err;
  }
  EXPECT_NE(r.err.find("a deadline passed"), std::string::npos) << r.err;

  // One file on the master with both nodes' samples.
  std::ifstream in(file);
  std::string line;
  std::set<std::string> nodes;
  while (std::getline(in, line))
    nodes.insert(nlohmann::json::parse(line)["node"].get<std::string>());
  EXPECT_EQ(nodes, (std::set<std::string>{node0, node1}));
}

// The test worker (no collectives): every node's agent samples its node's figures.
TEST(MultiNodeMonitor, EveryNodesFiguresReachTheEndpointTheFileAndTensorBoard) {
  DTRAIN_CLUSTER_OR_SKIP(c, 2);
  const std::string file = c->dir() + "/metrics.jsonl";
  const std::string tensorboard = c->dir() + "/tb";
  LaunchProcess p(fanOut(*c, {"--nproc-per-node", "1", "--sample-interval", "0.5", "--metrics-port",
                              "0", "--metrics-file", file, "--tensorboard-dir", tensorboard,
                              workerPath(), "--steps", "60", "--step-ms", "100", "--quiet"}));
  const int port = metricsPort(p, 30);
  ASSERT_GT(port, 0) << p.err();
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(5);
  const std::vector<std::string> nodes = {c->hosts()[0], c->hosts()[1]};
  // Each node's collectives' interface: launch's NCCL_SOCKET_IFNAME on a multi-node job.
  std::map<std::string, std::string> collectives;
  PromScrape scrape;
  for (int i = 0; i < 200 && collectives.size() < 2; ++i) {
    if (auto res = client.Get("/metrics"); res && res->status == 200) {
      scrape = parsePrometheusText(res->body);
      collectives.clear();
      for (const auto& node : nodes) {
        for (const auto& s : scrape.find("dtrain_net_collectives", {{"node", node}})) {
          const std::map<std::string, std::string> labels{{"node", node},
                                                          {"interface", s.labels.at("interface")}};
          if (s.value == 1 && scrape.value("dtrain_net_tx_bytes_per_s", labels)) {
            collectives[node] = s.labels.at("interface");
          }
        }
      }
    }
    p.pump(100);
  }
  ASSERT_EQ(collectives.size(), 2u) << "no scrape with both nodes' interfaces; last one had "
                                    << scrape.samples.size() << " samples\n"
                                    << p.err();
  for (const auto& node : nodes) {
    EXPECT_TRUE(scrape.value("dtrain_context_switches_per_s", {{"node", node}})) << node;
    EXPECT_TRUE(scrape.value("dtrain_swap_used_bytes", {{"node", node}})) << node;
    auto disks = scrape.find("dtrain_disk_logs", {{"node", node}});
    ASSERT_EQ(disks.size(), 1u) << node << ": the metrics file's directory";
    EXPECT_TRUE(scrape.value("dtrain_disk_free_ratio",
                             {{"node", node}, {"mount", disks[0].labels.at("mount")}}));
  }
  LaunchResult r = p.wait(60);
  ASSERT_FALSE(r.timedOut) << r.all();
  EXPECT_EQ(r.exitCode, 0) << r.all();

  // The master's file: both nodes' interface and filesystem records.
  std::ifstream in(file);
  std::string line;
  std::set<std::string> interfaceNodes;
  std::set<std::string> mountNodes;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("interface")) interfaceNodes.insert(j["node"].get<std::string>());
    if (j.contains("mount")) mountNodes.insert(j["node"].get<std::string>());
  }
  const std::set<std::string> both(nodes.begin(), nodes.end());
  EXPECT_EQ(interfaceNodes, both);
  EXPECT_EQ(mountNodes, both);
  // The TensorBoard event file holds the same records; its tags are plain strings in it
  // (tensorboard.launch reads such files back record by record).
  std::string events;
  for (const auto& e : std::filesystem::directory_iterator(tensorboard)) {
    events += readFile(e.path().string());
  }
  for (const auto& node : nodes) {
    const std::string tag = "net_rx_bytes_per_s/" + node + "/" + collectives[node];
    EXPECT_NE(events.find(tag), std::string::npos) << tag;
  }
}

}  // namespace
}  // namespace dtrain::testing::monitor_e2e_test
