// Watching a running job, with real processes under launch: the metrics endpoint scraped (and
// parsed) during a job and after a restart, the metrics file, the stall report of a rank hung in
// a collective with its native stack (--stall-action stop and report), the memory warning before
// a cgroup's OOM kill, the status line, and launch's own CPU cost at a 1 s interval.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <regex>
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "hostile_http_support.h"
#include "launcher/monitor/cgroup_memory.h"
#include "launcher/monitor/command.h"
#include "launcher/monitor/node_files.h"
#include "launcher/monitor/node_sampler.h"
#include "launcher/monitor/proc_files.h"
#include "launcher_support.h"
#include "prometheus_text_support.h"
#include "test_support.h"

namespace dtrain::testing::launcher_monitor_test {
namespace {

using launcher::monitor::CgroupLocation;
using launcher::monitor::commandExists;
using launcher::monitor::locateOwnMemoryCgroup;

std::string hostName() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

std::optional<PromScrape> scrape(int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(2);
  client.set_read_timeout(5);
  auto res = client.Get("/metrics");
  if (!res || res->status != 200) return std::nullopt;
  EXPECT_NE(res->get_header_value("Content-Type").find("text/plain; version=0.0.4"),
            std::string::npos);
  return parsePrometheusText(res->body);  // throws (fails the test) on a malformed line
}

// Scrapes until `ready` holds (launch samples every 0.2 s; ranks publish once a second).
PromScrape scrapeUntil(LaunchProcess& p, int port,
                       const std::function<bool(const PromScrape&)>& ready, double seconds) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  PromScrape last;
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto s = scrape(port)) {
      last = *s;
      if (ready(last)) return last;
    }
    p.pump(200);
  }
  ADD_FAILURE() << "the scrape never became ready; last one had " << last.samples.size()
                << " samples";
  return last;
}

// Pids of the given attempt's workers from their first line.
std::map<int, int> workerPids(const std::string& out, int attempt) {
  std::map<int, int> pids;
  static const std::regex re("worker rank=([0-9]+) .* attempt=([0-9]+) .* pid=([0-9]+) ");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it) {
    if (std::stoi((*it)[2]) == attempt) pids[std::stoi((*it)[1])] = std::stoi((*it)[3]);
  }
  return pids;
}

// A directory with a stand-in nvidia-smi that prints the recorded CSV, and lists every worker of
// the launch that runs it (its parent) as a process on GPU 0.
std::string standInNvidiaSmi(const TempDir& tmp) {
  const std::string bin = tmp.file("bin");
  std::filesystem::create_directories(bin);
  const std::string data = sourceDir() + "/tests/data/nvidia_smi";
  writeFile(bin + "/nvidia-smi",
            "#!/bin/sh\n"
            "case \"$1\" in\n"
            "  --query-gpu=*) exec cat '" +
                data +
                "/query_gpu.csv' ;;\n"
                "  --query-compute-apps=*)\n"
                "    for g in $(pgrep -P $PPID); do for w in $(pgrep -P $g); do\n"
                "      echo \"$w, GPU-8c3e1a52-4f0b-2d6e-91a7-5b2f0c7d9e13, 1024\"\n"
                "    done; done ;;\n"
                "  *) exit 9 ;;\n"
                "esac\n");
  ::chmod((bin + "/nvidia-smi").c_str(), 0755);
  return bin;
}

// Every series launch promises, with its labels, for `ranks` ranks on this node.
void expectEverySeries(const PromScrape& s, int attempt, const std::map<int, int>& pids) {
  const std::string node = hostName();
  EXPECT_EQ(s.value("dtrain_attempt"), attempt);
  EXPECT_EQ(s.value("dtrain_restarts"), attempt);
  EXPECT_EQ(s.value("dtrain_max_restarts"), 1);
  EXPECT_EQ(s.value("dtrain_world_size"), 2);
  EXPECT_EQ(s.value("dtrain_stalled"), 0);
  auto age = s.value("dtrain_heartbeat_age_seconds", {{"node", node}});
  ASSERT_TRUE(age) << "heartbeat age of node " << node;
  EXPECT_LT(*age, 5.0);
  for (const char* name : {"load1", "mem_total_bytes", "mem_available_bytes", "mem_used_ratio",
                           "mem_headroom_bytes", "workers", "workers_alive"}) {
    EXPECT_TRUE(s.value(std::string("dtrain_") + name, {{"node", node}})) << name;
  }
  if (locateOwnMemoryCgroup().version != 0) {
    EXPECT_TRUE(s.value("dtrain_cgroup_usage_bytes", {{"node", node}}));
  }
  for (const auto& [rank, pid] : pids) {
    const std::map<std::string, std::string> labels{{"node", node}, {"rank", std::to_string(rank)}};
    EXPECT_EQ(s.value("dtrain_pid", labels), pid) << "rank " << rank;
    for (const char* name :
         {"local_rank", "cpu_percent", "rss_bytes", "rss_peak_bytes", "threads", "processes",
          "read_bytes", "write_bytes", "step", "loss", "samples_per_s"}) {
      EXPECT_TRUE(s.value(std::string("dtrain_") + name, labels)) << name << " of rank " << rank;
    }
    EXPECT_GT(*s.value("dtrain_rss_bytes", labels), 0);
    EXPECT_EQ(s.value("dtrain_samples_per_s", labels), 100.0 + rank);
    EXPECT_TRUE(s.value("dtrain_gpu_process_mem_bytes",
                        {{"node", node}, {"rank", std::to_string(rank)}, {"gpu", "0"}}))
        << "the stand-in nvidia-smi lists rank " << rank << " on GPU 0";
  }
  for (int gpu = 0; gpu < 4; ++gpu) {
    const std::map<std::string, std::string> labels{{"node", node}, {"gpu", std::to_string(gpu)}};
    for (const char* name :
         {"gpu_mem_used_bytes", "gpu_mem_total_bytes", "gpu_temperature_c", "gpu_processes"}) {
      EXPECT_TRUE(s.value(std::string("dtrain_") + name, labels)) << name << " of GPU " << gpu;
    }
  }
  EXPECT_EQ(s.value("dtrain_gpu_util", {{"node", node}, {"gpu", "0"}}), 97);
  EXPECT_FALSE(s.value("dtrain_gpu_util", {{"node", node}, {"gpu", "3"}})) << "[Not Supported]";
  EXPECT_EQ(s.types.at("dtrain_read_bytes"), "counter");
}

TEST(LaunchMonitor, EndpointAnswersEverySeriesDuringTheJobAndAfterARestart) {
  TempDir tmp;
  const std::string bin = standInNvidiaSmi(tmp);
  const std::string file = tmp.file("metrics.jsonl");
  LaunchProcess p(
      launchArgs({"--nproc-per-node", "2", "--max-restarts", "1", "--sample-interval", "0.2",
                  "--metrics-port", "0", "--metrics-file", file},
                 {"--steps", "70", "--step-ms", "100", "--publish-figures"}),
      {"DTRAIN_FAULT=exit:3@rank=1,step=35,attempt=0", "PATH=" + bin + ":" + std::getenv("PATH")});
  const int port = metricsPort(p);
  ASSERT_GT(port, 0) << p.err();
  ASSERT_TRUE(waitForWorkers(p, 2)) << p.err();
  const auto first = workerPids(p.out(), 0);
  ASSERT_EQ(first.size(), 2u);

  PromScrape during = scrapeUntil(
      p, port,
      [&](const PromScrape& s) {
        return s.find("dtrain_loss").size() == 2 &&
               s.find("dtrain_gpu_process_mem_bytes").size() == 2 &&
               s.find("dtrain_cpu_percent").size() == 2 && s.value("dtrain_attempt") == 0;
      },
      20);
  expectEverySeries(during, 0, first);

  // Rank 1 fails at step 35; launch restarts both.
  ASSERT_TRUE(p.waitFor(
      [](const std::string& o, const std::string&) { return countLines(o, " attempt=1 ") >= 2; },
      30))
      << p.err();
  const auto second = workerPids(p.out(), 1);
  ASSERT_EQ(second.size(), 2u);
  PromScrape after = scrapeUntil(
      p, port,
      [&](const PromScrape& s) {
        return s.value("dtrain_attempt") == 1 &&
               s.value("dtrain_pid", {{"node", hostName()}, {"rank", "0"}}) == second.at(0) &&
               s.value("dtrain_pid", {{"node", hostName()}, {"rank", "1"}}) == second.at(1) &&
               s.find("dtrain_loss").size() == 2 && s.find("dtrain_cpu_percent").size() == 2;
      },
      20);
  expectEverySeries(after, 1, second);

  LaunchResult r = p.wait(60);
  EXPECT_EQ(r.exitCode, 0) << r.err;

  // The file: one schema record a line -- launch's samples of both attempts, and the ranks' own
  // records (dtrain::metrics in the worker, through the store) as they made them.
  std::ifstream in(file);
  std::string line;
  int lines = 0;
  std::set<int> attempts;
  std::set<std::string> kinds;
  std::map<int, std::vector<int64_t>> steps;  // rank -> the steps of its records, in file order
  while (std::getline(in, line)) {
    ++lines;
    auto j = nlohmann::json::parse(line);
    ASSERT_TRUE(j["time"].is_number()) << line;
    EXPECT_EQ(j["node"], hostName()) << line;
    EXPECT_TRUE(j["run_id"].is_string()) << line;
    if (j["source"] == "trainer") {
      ASSERT_TRUE(j["rank"].is_number_integer() && j["step"].is_number_integer()) << line;
      const int rank = j["rank"].get<int>();
      const int64_t step = j["step"].get<int64_t>();
      EXPECT_EQ(j["loss"].get<double>(), 1.0 / static_cast<double>(step + 1)) << line;
      EXPECT_EQ(j["samples_per_s"].get<double>(), 100.0 + rank) << line;
      steps[rank].push_back(step);
      continue;
    }
    EXPECT_EQ(j["source"], "launch") << line;
    EXPECT_FALSE(j.contains("step")) << "launch records have no step: " << line;
    if (j.contains("attempt")) attempts.insert(j["attempt"].get<int>());
    kinds.insert(j.contains("gpu") ? (j.contains("rank") ? "gpu-rank" : "gpu")
                                   : (j.contains("rank") ? "rank" : "node"));
  }
  EXPECT_GT(lines, 20);
  EXPECT_EQ(attempts, (std::set<int>{0, 1}));
  EXPECT_EQ(kinds, (std::set<std::string>{"node", "rank", "gpu", "gpu-rank"}));
  // The second attempt ran to the end: every one of its 70 steps, once, in order (the first
  // attempt's records come before them: steps from 0 up to about 35).
  ASSERT_EQ(steps.size(), 2u);
  for (const auto& [rank, list] : steps) {
    ASSERT_GE(list.size(), 70u) << "rank " << rank;
    std::vector<int64_t> last(list.end() - 70, list.end());
    std::vector<int64_t> expected(70);
    std::iota(expected.begin(), expected.end(), 0);
    EXPECT_EQ(last, expected) << "rank " << rank;
    EXPECT_GT(list.size(), 70u + 20u) << "rank " << rank << ": the first attempt's records";
  }
}

// The node's network, disk and scheduler figures (launcher/monitor/node_sampler.h) on the
// endpoint and in the file, each labelled with the node and its interface or mount; the
// checkpoint directory named by DTRAIN_CHECKPOINT_DIR (Note [Watched directories]).
TEST(LaunchMonitor, NodeFiguresReachTheEndpointAndTheFileWithTheirLabels) {
  TempDir tmp;
  const std::string file = tmp.file("metrics.jsonl");
  const std::string node = hostName();
  LaunchProcess p(launchArgs({"--nproc-per-node", "1", "--sample-interval", "0.2", "--metrics-port",
                              "127.0.0.1:0", "--metrics-file", file},
                             {"--steps", "30", "--step-ms", "100", "--quiet"}),
                  {"DTRAIN_CHECKPOINT_DIR=" + tmp.file("ckpt")});
  const int port = metricsPort(p);
  ASSERT_GT(port, 0) << p.err();
  // The interfaces launch reports: every one but loopback that has carried traffic.
  std::set<std::string> interfaces;
  {
    launcher::monitor::FileReader reader;
    std::vector<launcher::monitor::NetDevCounters> counters;
    launcher::monitor::parseNetDev(reader.read("/proc/net/dev").value_or(""), counters);
    for (const auto& c : counters) {
      if (c.interface() != "lo" && (c.rxBytes > 0 || c.txBytes > 0)) {
        interfaces.insert(std::string(c.interface()));
      }
    }
  }
  PromScrape s = scrapeUntil(
      p, port,
      [&](const PromScrape& s) {
        return s.value("dtrain_context_switches_per_s", {{"node", node}}) &&
               !s.find("dtrain_disk_free_ratio").empty() &&
               s.find("dtrain_net_rx_bytes_per_s").size() == interfaces.size();
      },
      20);
  EXPECT_GT(*s.value("dtrain_context_switches_per_s", {{"node", node}}), 0);
  const auto total = s.value("dtrain_swap_total_bytes", {{"node", node}});
  ASSERT_TRUE(total);
  const auto used = s.value("dtrain_swap_used_bytes", {{"node", node}});
  ASSERT_TRUE(used) << "a machine without swap reports 0";
  EXPECT_LE(*used, *total);
  for (const auto& i : interfaces) {
    const std::map<std::string, std::string> labels{{"node", node}, {"interface", i}};
    for (const char* name :
         {"net_rx_bytes_per_s", "net_tx_bytes_per_s", "net_rx_errors_per_s", "net_tx_errors_per_s",
          "net_rx_drops_per_s", "net_tx_drops_per_s", "net_collectives"}) {
      EXPECT_TRUE(s.value(std::string("dtrain_") + name, labels)) << name << " of " << i;
    }
  }
  // One filesystem holds the temporary directory: the checkpoint directory (not made yet: its
  // parent's) and the metrics file's directory.
  auto disks = s.find("dtrain_disk_checkpoints");
  ASSERT_EQ(disks.size(), 1u);
  EXPECT_EQ(disks[0].value, 1);
  EXPECT_EQ(disks[0].labels.at("node"), node);
  const std::string mount = disks[0].labels.at("mount");
  const std::string real = std::filesystem::canonical(tmp.path()).string();
  EXPECT_EQ(real.compare(0, mount.size(), mount), 0) << mount << " holds " << real;
  const std::map<std::string, std::string> labels{{"node", node}, {"mount", mount}};
  EXPECT_EQ(s.value("dtrain_disk_logs", labels), 1);
  EXPECT_EQ(s.value("dtrain_disk_data", labels), 0);
  EXPECT_GT(*s.value("dtrain_disk_free_bytes", labels), 0);
  EXPECT_GT(*s.value("dtrain_disk_total_bytes", labels), 0);
  const double ratio = *s.value("dtrain_disk_free_ratio", labels);
  EXPECT_GT(ratio, 0);
  EXPECT_LE(ratio, 1);

  LaunchResult r = p.wait(60);
  EXPECT_EQ(r.exitCode, 0) << r.err;
  std::ifstream in(file);
  std::string line;
  std::set<std::string> mounts;
  std::set<std::string> seen;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("mount")) {
      EXPECT_EQ(j["node"], node) << line;
      mounts.insert(j["mount"].get<std::string>());
    }
    if (j.contains("interface")) {
      EXPECT_EQ(j["node"], node) << line;
      seen.insert(j["interface"].get<std::string>());
    }
  }
  EXPECT_EQ(mounts, (std::set<std::string>{mount}));
  EXPECT_EQ(seen, interfaces);
}

std::string commWorker() { return binaryPath("comm_worker"); }

// The slice of `err` holding rank `rank`'s native stack.
std::string stackOf(const std::string& err, int rank) {
  const std::string head = "native stack of rank " + std::to_string(rank) + ":\n";
  size_t at = err.find(head);
  if (at == std::string::npos) return "";
  size_t end = err.find("native stack of rank", at + head.size());
  size_t hint = err.find("\n  launch stops", at);
  if (hint != std::string::npos && (end == std::string::npos || hint < end)) end = hint;
  return err.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

TEST(LaunchMonitor, AHangInACollectiveIsReportedWithTheRankAndItsNativeStackThenStopped) {
  // Rank 1 hangs when it reaches collective 30 (it never starts it); rank 0 waits in it. The
  // collective timeout (120 s) is far away: only the stall detection can end this.
  LaunchResult r = runLaunch({"--nproc-per-node", "2", "--sample-interval", "0.5",
                              "--stall-timeout", "3", "--stall-action", "stop", commWorker(),
                              "--iters", "100000", "--iter-ms", "20", "--timeout-ms", "120000"},
                             {"DTRAIN_FAULT=hang@rank=1,step=30"}, 90);
  EXPECT_EQ(r.exitCode, 124) << r.err;
  EXPECT_LT(r.seconds, 40) << "3 s of stall plus detection, stacks and teardown";
  EXPECT_NE(r.err.find("launch: STALL: no rank has made progress for"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(--stall-timeout 3); behind: rank 1\n"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 1 has not started seq 30 allreduce(float32 x 4096, sum) (queued), "
                       "which rank 0 is running"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("rank 1 (pid "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(", step 30): last collectives: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exit code 124 (a deadline passed: no rank made progress"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(countLines(r.err, "launch: STALL"), 1);
  if (!commandExists("eu-stack")) {
    EXPECT_NE(r.err.find("(no native stack: eu-stack is not installed"), std::string::npos);
    GTEST_SKIP() << "eu-stack (elfutils) is not installed: the native stack part is not checked";
  }
  const std::string stack = stackOf(r.err, 1);
  ASSERT_FALSE(stack.empty()) << r.err;
  EXPECT_NE(stack.find("hangOnCommThread"), std::string::npos)
      << "rank 1's stack shows where it hangs:\n"
      << stack;
  EXPECT_FALSE(stackOf(r.err, 0).empty()) << "every stuck rank's stack is shown";
}

TEST(LaunchMonitor, ReportOnlyLeavesTheJobRunningAndAStallThatEndsIsReportedOnce) {
  // Rank 1 sleeps 6 s before collective 30: behind by one collective, then it catches up.
  LaunchResult r = runLaunch({"--nproc-per-node", "2", "--sample-interval", "0.5",
                              "--stall-timeout", "3", commWorker(), "--iters", "60", "--iter-ms",
                              "20", "--timeout-ms", "60000"},
                             {"DTRAIN_FAULT=slow:6000@rank=1,step=30"}, 90);
  EXPECT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(countLines(r.err, "launch: STALL"), 1) << r.err;
  EXPECT_NE(r.err.find("behind: rank 1\n"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 1 has issued 30 collectives"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 0 is at seq 30 allreduce(float32 x 4096, sum) (running)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("HINT: the job keeps running (--stall-action report)"), std::string::npos);
}

TEST(LaunchMonitor, RanksThatPublishNoProgressAreNamedNotJudged) {
  // The test worker uses the store but no collectives and no progress calls. launch says so
  // once the workers ran 10 s without a report (at least the stall timeout), quoting how long
  // they ran by then: 11 s or more on a loaded machine.
  LaunchResult r = runLaunch(
      launchArgs({"--nproc-per-node", "2", "--sample-interval", "0.5", "--stall-timeout", "2"},
                 {"--steps", "40", "--step-ms", "400", "--quiet"}),
      {}, 60);
  EXPECT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(countLines(r.err, "launch: --stall-timeout 2: no rank has published progress after "),
            1)
      << r.err;
  EXPECT_EQ(countLines(r.err, "launch: STALL"), 0) << r.err;
}

// A memory cgroup of `limit` bytes this test may create and remove, or why not.
struct TestCgroup {
  std::string dir;
  std::string skip;
  ~TestCgroup() {
    if (dir.empty()) return;
    for (int i = 0; i < 50 && ::rmdir(dir.c_str()) != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
};

void makeCgroup(TestCgroup& cg, int64_t limit) {
  if (::geteuid() != 0) {
    cg.skip = "not root: cannot create a memory cgroup";
    return;
  }
  CgroupLocation own = locateOwnMemoryCgroup();
  const std::string name = "dtrain-oom-test-" + std::to_string(::getpid());
  if (own.version == 1) {
    cg.dir = own.dir + "/" + name;
  } else if (own.version == 2) {
    cg.dir = own.mountDir + "/" + name;
    std::ofstream(own.mountDir + "/cgroup.subtree_control") << "+memory";
  } else {
    cg.skip = "no memory cgroup controller mounted";
    return;
  }
  if (::mkdir(cg.dir.c_str(), 0755) != 0) {
    cg.skip = "cannot create " + cg.dir + ": " + std::strerror(errno);
    cg.dir.clear();
    return;
  }
  const std::string limitFile = cg.dir +
                                (own.version == 1 ? "/memory.limit_in_bytes" : "/memory.max");
  std::ofstream(limitFile) << limit;
  if (own.version == 2) std::ofstream(cg.dir + "/memory.swap.max") << 0;
  if (std::stoll(readFile(limitFile)) != limit) cg.skip = "the cgroup's limit did not take";
}

TEST(LaunchMonitor, MemoryWarningComesBeforeTheCgroupOomKill) {
  constexpr int64_t kLimit = 200 << 20;
  TestCgroup cg;
  makeCgroup(cg, kLimit);
  if (!cg.skip.empty()) GTEST_SKIP() << cg.skip;
  // launch moves itself into the cgroup before it starts (so do its workers); rank 1 grows by
  // 2 MiB every 100 ms until the kernel kills it: 90 % to 100 % takes one second, five ticks.
  LaunchProcess p(
      launchArgs({"--nproc-per-node", "2", "--sample-interval", "0.2"},
                 {"--steps", "100000", "--step-ms", "100", "--alloc-mb", "2", "--alloc-rank", "1",
                  "--quiet"}),
      {}, {"/bin/sh", "-c", "echo $$ > '" + cg.dir + "/cgroup.procs' && exec \"$@\"", "sh"});
  LaunchResult r = p.wait(120);
  ASSERT_FALSE(r.timedOut) << r.err;
  EXPECT_EQ(r.exitCode, 128 + 9) << "rank 1 killed by the OOM killer\n" << r.err;
  const size_t warning = r.err.find("launch: WARNING: node " + hostName() + ": ");
  ASSERT_NE(warning, std::string::npos) << r.err;
  EXPECT_NE(r.err.find("% of memory in use (memory cgroup ", warning), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("  largest: rank 1 ", warning), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("  fastest-growing: rank 1 +", warning), std::string::npos) << r.err;
  const size_t report = r.err.find("launch: job failed: rank 1");
  ASSERT_NE(report, std::string::npos) << r.err;
  EXPECT_LT(warning, report) << "the warning comes before the kill";
  EXPECT_NE(r.err.find("OOM killer", report), std::string::npos) << r.err;
}

TEST(LaunchMonitor, StatusLineEveryInterval) {
  LaunchResult r = runLaunch(
      launchArgs({"--nproc-per-node", "2", "--sample-interval", "0.2", "--status-interval", "0.5"},
                 {"--steps", "30", "--step-ms", "100", "--quiet"}),
      {"PATH=/usr/bin:/bin"}, 60);
  EXPECT_EQ(r.exitCode, 0) << r.err;
  static const std::regex line(
      "launch: status: attempt 0, ranks alive 2/2; CPU % per rank min/median/max "
      "[0-9]+/[0-9]+/[0-9]+; GPU % n/a \\(no GPU sampled\\); memory: node \\S+ [0-9]+ % in use, "
      "[0-9.]+ [KMG]?i?B headroom\n");
  EXPECT_TRUE(std::regex_search(r.err, line)) << r.err;
  EXPECT_GE(countLines(r.err, "launch: status: "), 3) << r.err;
}

// M21: launch's endpoint answers a scrape within 1 s while 200 idle and 40 garbage connections
// are open (binary, a 64 KiB request line, a 1 MiB header, a truncated request), as Prometheus
// pairs that keep their connections alive, or anyone else who can reach the port, would hold.
TEST(LaunchMonitor, TheEndpointAnswersAtOnceWhileIdleAndGarbageConnectionsAreOpen) {
  LaunchProcess p(launchArgs(
      {"--nproc-per-node", "2", "--sample-interval", "0.2", "--metrics-port", "127.0.0.1:0"},
      {"--steps", "100000", "--step-ms", "100", "--quiet"}));
  const int port = metricsPort(p);
  ASSERT_GT(port, 0) << p.err();
  ASSERT_TRUE(waitForWorkers(p, 2)) << p.err();
  HostileHttpClients hostile(port, 200, 40);
  ASSERT_EQ(hostile.opened(), 240);
  for (int i = 0; i < 5; ++i) {
    const ScrapeResult r = timedScrape(port, "/metrics", 5.0);
    ASSERT_EQ(r.status, 200) << r.error;
    EXPECT_LT(r.seconds, 1.0) << "scrape " << i;
    EXPECT_EQ(parsePrometheusText(r.body).value("dtrain_world_size"), 2);
    p.pump(100);
  }
  EXPECT_TRUE(hostile.idleStillOpen());
  p.signal(SIGTERM);
  p.wait(60);
}

TEST(LaunchMonitor, ABusyMetricsPortIsAUsageErrorBeforeAnythingStarts) {
  // The other listener allows port sharing (as cpp-httplib's default does): launch must not.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int yes = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &yes, sizeof yes);
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof sa;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  const int port = ntohs(sa.sin_port);
  LaunchResult r = runLaunch(
      launchArgs({"--metrics-port", "127.0.0.1:" + std::to_string(port)}, {"--steps", "1"}), {},
      30);
  ::close(fd);
  EXPECT_EQ(r.exitCode, 2) << r.err;
  EXPECT_NE(r.err.find("--metrics-port: cannot listen on 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << r.err;
  EXPECT_EQ(countLines(r.out, "worker rank="), 0) << "nothing was started";
}

// launch's own CPU time: every thread's (supervisor, store server, monitor, endpoint), from
// /proc/<pid>/task/*/schedstat (nanoseconds).
double cpuSecondsOf(pid_t pid) {
  double total = 0;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return -1;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream in(dir + "/" + e->d_name + "/schedstat");
    double ns = 0;
    if (in >> ns) total += ns / 1e9;
  }
  ::closedir(d);
  return total;
}

TEST(LaunchMonitor, SamplingCostsLaunchUnderOnePercentOfACore) {
  constexpr double kWindowSeconds = 12;
  TempDir tmp;
  LaunchProcess p(launchArgs({"--nproc-per-node", "4", "--sample-interval", "1", "--metrics-port",
                              "0", "--metrics-file", tmp.file("m.jsonl")},
                             {"--steps", "100000", "--step-ms", "100", "--quiet"}),
                  {"PATH=/usr/bin:/bin"});
  const int port = metricsPort(p);
  ASSERT_GT(port, 0) << p.err();
  ASSERT_TRUE(waitForWorkers(p, 4)) << p.err();
  // Past the start (store joins, first samples), then measure a steady window with a scrape in
  // it, as Prometheus would do.
  p.waitFor([](const std::string&, const std::string&) { return false; }, 2.0);
  const double cpu0 = cpuSecondsOf(p.pid());
  const auto t0 = std::chrono::steady_clock::now();
  p.waitFor([](const std::string&, const std::string&) { return false; }, kWindowSeconds / 2);
  EXPECT_TRUE(scrape(port));
  p.waitFor([](const std::string&, const std::string&) { return false; }, kWindowSeconds / 2);
  const double cpu1 = cpuSecondsOf(p.pid());
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  p.signal(SIGTERM);
  p.wait(60);
  ASSERT_GE(cpu0, 0);
  const double percent = 100.0 * (cpu1 - cpu0) / wall;
  std::printf("launch's own CPU with 4 workers, --sample-interval 1, endpoint and file on: "
              "%.1f ms over %.1f s = %.3f %% of a core\n",
              (cpu1 - cpu0) * 1e3, wall, percent);
  RecordProperty("launch_cpu_percent", std::to_string(percent));
  EXPECT_LT(percent, 1.0);
}

// The node figures' cost (issue 46: at most 0.2 % of a core at a 1 s interval), measured as
// above: two launches side by side, one with DTRAIN_NODE_FIGURES=0, over the same three 6 s
// windows, so both see the same machine; and the figures' own sampling in this process, where
// nothing else runs on the thread (CLOCK_THREAD_CPUTIME_ID over 200 samples).
TEST(LaunchMonitor, NodeFiguresCostUnderAFifthOfAPercentOfACore) {
  constexpr double kWindowSeconds = 6;
  constexpr int kWindows = 3;
  TempDir tmp;
  auto start = [&](bool figures) {
    return std::make_unique<LaunchProcess>(
        launchArgs({"--nproc-per-node", "4", "--sample-interval", "1", "--metrics-port", "0",
                    "--metrics-file", tmp.file(figures ? "on.jsonl" : "off.jsonl")},
                   {"--steps", "100000", "--step-ms", "100", "--quiet"}),
        std::vector<std::string>{"PATH=/usr/bin:/bin", "DTRAIN_CHECKPOINT_DIR=" + tmp.file("ckpt"),
                                 std::string("DTRAIN_NODE_FIGURES=") + (figures ? "1" : "0")});
  };
  auto on = start(true);
  auto off = start(false);
  for (auto* p : {on.get(), off.get()}) {
    ASSERT_GT(metricsPort(*p), 0) << p->err();
    ASSERT_TRUE(waitForWorkers(*p, 4)) << p->err();
  }
  on->waitFor([](const std::string&, const std::string&) { return false; }, 2.0);
  std::vector<double> onPercent;
  std::vector<double> offPercent;
  for (int w = 0; w < kWindows; ++w) {
    const double on0 = cpuSecondsOf(on->pid());
    const double off0 = cpuSecondsOf(off->pid());
    const auto t0 = std::chrono::steady_clock::now();
    // Pump both (their output pipes must not fill) for the window.
    while (std::chrono::steady_clock::now() - t0 < std::chrono::duration<double>(kWindowSeconds)) {
      on->pump(100);
      off->pump(100);
    }
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    onPercent.push_back(100.0 * (cpuSecondsOf(on->pid()) - on0) / wall);
    offPercent.push_back(100.0 * (cpuSecondsOf(off->pid()) - off0) / wall);
  }
  for (auto* p : {on.get(), off.get()}) {
    p->signal(SIGTERM);
    p->wait(60);
  }
  std::sort(onPercent.begin(), onPercent.end());
  std::sort(offPercent.begin(), offPercent.end());
  const double delta = onPercent[kWindows / 2] - offPercent[kWindows / 2];
  std::printf("launch's own CPU with 4 workers at --sample-interval 1, median of %d windows of "
              "%.0f s: with the node figures %.3f %%, without %.3f %% of a core: +%.3f %%\n",
              kWindows, kWindowSeconds, onPercent[kWindows / 2], offPercent[kWindows / 2], delta);
  RecordProperty("node_figures_cpu_percent", std::to_string(delta));
  EXPECT_LT(delta, 0.2);

  // The figures' own work, one sample a second: CPU per sample over a second.
  launcher::monitor::NodeFigureOptions o;
  o.directories = {{launcher::monitor::DirectoryRole::Checkpoint, tmp.path()},
                   {launcher::monitor::DirectoryRole::Log, tmp.path() + "/logs"}};
  launcher::monitor::NodeFigureSampler sampler(o);
  sampler.sample(0);
  timespec a{};
  timespec b{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
  constexpr int kSamples = 200;
  for (int i = 1; i <= kSamples; ++i) sampler.sample(i);
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
  const double cpu = static_cast<double>(b.tv_sec - a.tv_sec) +
                     static_cast<double>(b.tv_nsec - a.tv_nsec) / 1e9;
  const double perSample = cpu / kSamples;
  std::printf("the node figures' sampling alone: %.1f us of CPU a sample = %.4f %% of a core at "
              "1 s\n",
              perSample * 1e6, 100.0 * perSample);
  EXPECT_LT(100.0 * perSample, 0.2);
}

}  // namespace
}  // namespace dtrain::testing::launcher_monitor_test
