// The multi-node path of monitoring, in one process over a real store: an agent's Monitor samples
// its node and writes its records to the store; the master's Monitor serves them beside its own,
// writes them to its file, and, on a stall, gets the native stack of the agent's stuck rank
// through the store (Note [Monitor roles] in launcher/monitor/monitor.h). The workers are real
// processes (sleep); their progress reports are written by the test.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "dtrain/base/progress.h"
#include "dtrain/base/tcp_store.h"
#include "launcher/monitor/command.h"
#include "launcher/monitor/monitor.h"
#include "prometheus_text_support.h"
#include "test_support.h"

namespace dtrain::launcher::monitor::launcher_monitor_nodes_test {
namespace {

using dtrain::testing::TempDir;

pid_t sleeper() {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sleep", "sleep", "60", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

struct Sleepers {
  std::vector<pid_t> pids;
  ~Sleepers() {
    for (pid_t p : pids) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
  }
};

class RecordingControl : public JobControl {
 public:
  void stopForDeadline(const std::string& reason) override { reasons.push_back(reason); }
  std::vector<std::string> reasons;
};

progress::RankReport report(int rank, pid_t pid, const std::string& newestState) {
  progress::RankReport r;
  r.rank = rank;
  r.pid = pid;
  r.step = 7;
  progress::CollectiveState c;
  c.name = "pg/default";
  c.issued = 8;
  c.tail = {{6, "allreduce(float32 x 16, sum)", "done", 0.1},
            {7, "allreduce(float32 x 16, sum)", newestState, 0.0}};
  r.collectives = {c};
  // One trainer record; the node rank says where the rank runs (local world size 1 here).
  r.nodeRank = rank;
  metrics::Record record;
  record.time = 1700000000.0 + rank;
  record.step = 7;
  record.fields = {{"loss", 0.5 + rank}};
  r.records = {record};
  r.lastRecord = 1;
  return r;
}

MonitorContext contextFor(const store::TcpStoreServer& server, int nodeRank, bool aggregates) {
  MonitorContext c;
  c.runId = "nodes-test";
  c.node = nodeRank == 0 ? "node-a" : "node-b";
  c.nodeRank = nodeRank;
  c.numNodes = 2;
  c.samplesNode = true;
  c.aggregates = aggregates;
  c.localWorldSize = 1;
  c.worldSize = 2;
  c.storeHost = "127.0.0.1";
  c.storePort = server.port();
  c.storeToken = "tok";
  return c;
}

TEST(MonitorNodes, AnAgentsSamplesAndStacksReachTheMaster) {
  store::TcpStoreServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  so.token = "tok";
  auto server = store::TcpStoreServer::start(so);
  TempDir tmp;
  Sleepers workers;
  workers.pids = {sleeper(), sleeper()};

  MonitorOptions masterOptions;
  masterOptions.sampleInterval = 0.2;
  masterOptions.metricsPort = 0;
  masterOptions.metricsHost = "127.0.0.1";
  masterOptions.metricsFile = tmp.file("m.jsonl");
  masterOptions.stallTimeout = 2;
  masterOptions.stallAction = StallAction::Stop;
  MonitorOptions agentOptions = masterOptions;
  agentOptions.metricsPort = -1;  // an agent serves nothing, writes no file
  agentOptions.metricsFile.clear();

  RecordingControl control;
  Monitor master(masterOptions, contextFor(*server, 0, true));
  MonitorContext agentContext = contextFor(*server, 1, false);
  agentContext.nodeFigures.directories = {{DirectoryRole::Checkpoint, tmp.path()}};
  Monitor agent(agentOptions, agentContext);
  master.attemptStarted(0, 2);
  master.workerStarted(0, 0, workers.pids[0]);
  agent.attemptStarted(0, 2);
  agent.workerStarted(1, 0, workers.pids[1]);

  // Ranks 0 and 1 report: rank 1 never started collective 7, which rank 0 runs.
  store::TcpStoreOptions co;
  co.port = server->port();
  co.token = "tok";
  store::PrefixStore round("round0", std::make_shared<store::TcpStore>(co));
  round.setString(progress::rankKey(0),
                  progress::encodeReport(report(0, workers.pids[0], "running")));
  round.setString(progress::rankKey(1),
                  progress::encodeReport(report(1, workers.pids[1], "queued")));
  round.add(progress::kVersionKey, 1);

  ::testing::internal::CaptureStderr();
  master.start(&control);
  agent.start(nullptr);

  // The master serves the agent's node beside its own.
  httplib::Client client("127.0.0.1", master.metricsPort());
  dtrain::testing::PromScrape scrape;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto res = client.Get("/metrics"); res && res->status == 200) {
      scrape = dtrain::testing::parsePrometheusText(res->body);
      if (scrape.value("dtrain_rss_bytes", {{"node", "node-b"}, {"rank", "1"}}) &&
          scrape.value("dtrain_rss_bytes", {{"node", "node-a"}, {"rank", "0"}}) &&
          scrape.value("dtrain_context_switches_per_s", {{"node", "node-b"}}) &&
          !control.reasons.empty()) {
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  agent.stop();
  master.stop();
  const std::string err = ::testing::internal::GetCapturedStderr();

  EXPECT_EQ(scrape.value("dtrain_pid", {{"node", "node-b"}, {"rank", "1"}}), workers.pids[1]);
  EXPECT_EQ(scrape.value("dtrain_collective_seq", {{"node", "node-b"}, {"rank", "1"}}), 8)
      << "the master adds the progress it read to the agent's rank records";
  EXPECT_TRUE(scrape.value("dtrain_heartbeat_age_seconds", {{"node", "node-b"}}));
  EXPECT_TRUE(scrape.value("dtrain_workers_alive", {{"node", "node-b"}}));
  EXPECT_TRUE(scrape.value("dtrain_step", {{"node", "node-b"}, {"rank", "1"}}))
      << "a rank's trainer record is labelled with the node it runs on";
  // The agent's node figures: its checkpoint filesystem, labelled with its node and mount.
  EXPECT_TRUE(scrape.value("dtrain_swap_used_bytes", {{"node", "node-b"}}));
  auto disks = scrape.find("dtrain_disk_checkpoints", {{"node", "node-b"}});
  ASSERT_EQ(disks.size(), 1u);
  EXPECT_EQ(disks[0].value, 1);
  EXPECT_TRUE(scrape.value("dtrain_disk_free_ratio",
                           {{"node", "node-b"}, {"mount", disks[0].labels.at("mount")}}));

  // The stall report names rank 1 and shows its stack, taken by the agent on "its" node.
  ASSERT_EQ(control.reasons.size(), 1u) << err;
  EXPECT_NE(err.find("behind: rank 1\n"), std::string::npos) << err;
  EXPECT_NE(err.find("rank 1 (pid " + std::to_string(workers.pids[1]) + ", node node-b, step 7)"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("native stack of rank 1:"), std::string::npos) << err;
  EXPECT_NE(err.find("native stack of rank 0:"), std::string::npos) << err;
  if (commandExists("eu-stack")) {
    const size_t at = err.find("native stack of rank 1:");
    EXPECT_NE(err.find("nanosleep", at), std::string::npos) << "sleep's stack:\n" << err;
  }

  // The master's file holds both nodes' records, the agent's once per sample.
  std::ifstream in(tmp.file("m.jsonl"));
  std::string line;
  std::set<std::string> nodes;
  std::map<double, int> agentNodeRecordsAt;
  std::map<int, std::string> trainerNodes;  // rank -> node of its trainer record
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    nodes.insert(j["node"].get<std::string>());
    if (j["source"] == "trainer") {
      const int rank = j["rank"].get<int>();
      EXPECT_EQ(trainerNodes.count(rank), 0u) << "each record once: " << line;
      trainerNodes[rank] = j["node"].get<std::string>();
      EXPECT_EQ(j["loss"].get<double>(), 0.5 + rank) << line;
      EXPECT_EQ(j["step"], 7) << line;
      continue;
    }
    if (j["node"] == "node-b" && !j.contains("rank") && !j.contains("gpu") &&
        !j.contains("interface") && !j.contains("mount")) {
      ++agentNodeRecordsAt[j["time"].get<double>()];
    }
  }
  EXPECT_EQ(nodes, (std::set<std::string>{"node-a", "node-b"}));
  EXPECT_EQ(trainerNodes, (std::map<int, std::string>{{0, "node-a"}, {1, "node-b"}}))
      << "each rank's trainer record, labelled with the node that runs it";
  ASSERT_FALSE(agentNodeRecordsAt.empty());
  for (const auto& [time, count] : agentNodeRecordsAt) EXPECT_EQ(count, 1) << "at " << time;
}

}  // namespace
}  // namespace dtrain::launcher::monitor::launcher_monitor_nodes_test
