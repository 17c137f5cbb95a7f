// What launch's monitoring concludes from samples: stall detection and who is behind, the
// memory and idle-GPU warnings, the status line, metrics records and the Prometheus text (parsed).
#include <cmath>

#include <gtest/gtest.h>

#include "dtrain/base/error.h"
#include "launcher/monitor/records.h"
#include "launcher/monitor/stall_detector.h"
#include "launcher/monitor/watches.h"
#include "prometheus_text_support.h"

namespace dtrain::launcher::monitor::launcher_monitor_analysis_test {
namespace {

using progress::CollectiveEntry;
using progress::CollectiveState;
using progress::RankReport;

RankReport report(int rank, uint64_t issued, const std::string& newestState,
                  std::optional<int64_t> step = std::nullopt) {
  RankReport r;
  r.rank = rank;
  r.pid = 1000 + rank;
  r.step = step;
  CollectiveState c;
  c.name = "pg/default";
  c.issued = issued;
  for (uint64_t s = issued >= 3 ? issued - 3 : 0; s < issued; ++s) {
    CollectiveEntry e;
    e.seq = s;
    e.what = "allreduce(float32 x 4096, sum)";
    e.state = s + 1 == issued ? newestState : "done";
    e.ms = 0.5;
    c.tail.push_back(e);
  }
  r.collectives.push_back(c);
  return r;
}

TEST(StallDetector, NoProgressNamesTheRankThatNeverStartedTheCollective) {
  StallDetector d(10);
  d.reset(3);
  for (int r = 0; r < 3; ++r) d.update(0, report(r, 5, "done"));
  // Seq 5: ranks 0 and 2 run it, rank 1 hangs before sending anything (queued).
  d.update(1, report(0, 6, "running"));
  d.update(1, report(1, 6, "queued"));
  d.update(1, report(2, 6, "running"));
  EXPECT_FALSE(d.check(10.5)) << "not yet 10 s without progress";
  // A republished identical report is not progress.
  d.update(5, report(0, 6, "running"));
  auto stall = d.check(11.5);
  ASSERT_TRUE(stall);
  EXPECT_EQ(stall->kind, Stall::Kind::NoProgress);
  EXPECT_EQ(stall->stuck, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(stall->behind, std::vector<int>{1});
  EXPECT_NEAR(stall->quietSeconds, 10.5, 1e-9);
  EXPECT_NE(stall->where.find("rank 1 has not started seq 5"), std::string::npos) << stall->where;
  EXPECT_NE(stall->where.find("ranks 0, 2 are running"), std::string::npos) << stall->where;
  EXPECT_FALSE(d.check(30)) << "one report per stall";
  EXPECT_TRUE(d.inStall());
  // It moves again: the stall is over, and a new one would be reported again.
  for (int r = 0; r < 3; ++r) d.update(31, report(r, 7, "done"));
  EXPECT_FALSE(d.check(31));
  EXPECT_FALSE(d.inStall());
  EXPECT_TRUE(d.check(45));
}

TEST(StallDetector, FewerCollectivesIssuedMeansBehind) {
  StallDetector d(5);
  d.reset(4);
  d.update(0, report(0, 42, "running"));
  d.update(0, report(1, 41, "done"));  // never reached seq 41
  d.update(0, report(2, 42, "running"));
  d.update(0, report(3, 42, "running"));
  auto stall = d.check(6);
  ASSERT_TRUE(stall);
  EXPECT_EQ(stall->behind, std::vector<int>{1});
  EXPECT_NE(stall->where.find("rank 1 has issued 41 collectives"), std::string::npos)
      << stall->where;
  EXPECT_NE(stall->where.find("ranks 0, 2, 3 are at seq 41"), std::string::npos) << stall->where;
}

TEST(StallDetector, EveryoneInTheSameCollectiveIsNotBlamedOnAnyone) {
  StallDetector d(5);
  d.reset(2);
  d.update(0, report(0, 9, "running"));
  d.update(0, report(1, 9, "running"));
  auto stall = d.check(5);
  ASSERT_TRUE(stall);
  EXPECT_TRUE(stall->behind.empty());
  EXPECT_NE(stall->where.find("none stands out"), std::string::npos) << stall->where;
}

TEST(StallDetector, ALaggingRankWhileOthersMove) {
  StallDetector d(5);
  d.reset(3);
  RankReport stepOnly;
  for (int r = 0; r < 3; ++r) {
    RankReport x;
    x.rank = r;
    x.step = 1;
    d.update(0, x);
  }
  for (int t = 1; t <= 8; ++t) {
    for (int r : {0, 2}) {
      RankReport x;
      x.rank = r;
      x.step = 1 + t;
      d.update(t, x);
    }
  }
  auto stall = d.check(8);
  ASSERT_TRUE(stall);
  EXPECT_EQ(stall->kind, Stall::Kind::Lagging);
  EXPECT_EQ(stall->stuck, std::vector<int>{1});
  EXPECT_EQ(stall->moving, (std::vector<int>{0, 2}));
  EXPECT_EQ(stall->behind, std::vector<int>{1});
}

TEST(StallDetector, EndedAndSilentRanksAreNotJudged) {
  StallDetector d(5);
  d.reset(3);
  d.update(0, report(0, 3, "done"));
  d.update(0, report(1, 3, "done"));
  d.rankEnded(0);
  d.rankEnded(1);
  EXPECT_FALSE(d.check(100)) << "finished ranks are not stuck";
  d.reset(3);
  d.update(0, report(0, 3, "running"));
  auto stall = d.check(6);
  ASSERT_TRUE(stall);
  EXPECT_EQ(stall->silent, (std::vector<int>{1, 2}));
}

TEST(StallDetector, ReportListsRanksTailsAndStacks) {
  StallDetector d(10);
  d.reset(2);
  d.update(0, report(0, 6, "running", 4));
  d.update(0, report(1, 6, "queued", 4));
  auto stall = d.check(12);
  ASSERT_TRUE(stall);
  StallReportContext ctx;
  ctx.timeout = 10;
  ctx.nodes = {{0, "h"}, {1, "h"}};
  ctx.stacks = {{1, "TID 1001:\n#0 0x1 hangOnCommThread\n"}};
  ctx.stopping = true;
  std::string text = formatStallReport(*stall, d.ranks(), ctx);
  EXPECT_EQ(text.rfind("launch: STALL: no rank has made progress for 12.0 s (--stall-timeout 10); "
                       "behind: rank 1\n",
                       0),
            0u)
      << text;
  EXPECT_NE(text.find("rank 1 (pid 1001, node h, step 4): last collectives:"), std::string::npos)
      << text;
  EXPECT_NE(text.find("seq 5 allreduce(float32 x 4096, sum) queued"), std::string::npos) << text;
  EXPECT_NE(text.find("native stack of rank 1:\n    TID 1001:\n    #0 0x1 hangOnCommThread\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("exits 124"), std::string::npos) << text;
  // The behind rank comes first.
  EXPECT_LT(text.find("rank 1 (pid"), text.find("rank 0 (pid")) << text;
}

TEST(FormatRanks, CompressesRuns) {
  EXPECT_EQ(formatRanks({3, 0, 1, 2, 5, 7, 8}), "0-3, 5, 7, 8");
  EXPECT_EQ(formatRanks({}), "");
}

std::vector<RankSample> ranksAt(std::initializer_list<std::pair<int, int64_t>> rss) {
  std::vector<RankSample> out;
  for (auto [rank, bytes] : rss) {
    RankSample s;
    s.rank = rank;
    s.rssBytes = bytes;
    out.push_back(s);
  }
  return out;
}

NodeSample nodeAt(int64_t used, int64_t limit) {
  NodeSample n;
  n.mem.totalBytes = int64_t{64} << 30;
  n.mem.availableBytes = int64_t{60} << 30;
  CgroupMemory c;
  c.usageBytes = used;
  c.limitBytes = limit;
  c.limitDir = "/sys/fs/cgroup/job";
  n.cgroup = c;
  return n;
}

TEST(MemoryWatch, WarnsAt90PercentNamingTheLargestAndFastestGrowingRanks) {
  constexpr int64_t MiB = 1 << 20;
  MemoryWatch w;
  w.addRanks(0, ranksAt({{0, 100 * MiB}, {1, 50 * MiB}, {2, 20 * MiB}}));
  w.addRanks(20, ranksAt({{0, 110 * MiB}, {1, 200 * MiB}, {2, 20 * MiB}}));
  EXPECT_FALSE(w.check(20, nodeAt(800 * MiB, 1000 * MiB), "h")) << "80 %";
  auto warning = w.check(20, nodeAt(920 * MiB, 1000 * MiB), "h");
  ASSERT_TRUE(warning);
  EXPECT_NE(warning->find("node h: 92 % of memory in use (memory cgroup /sys/fs/cgroup/job: 920 "
                          "MiB of its 1000 MiB limit in use)"),
            std::string::npos)
      << *warning;
  EXPECT_NE(warning->find("largest: rank 1 200 MiB, rank 0 110 MiB, rank 2 20 MiB"),
            std::string::npos)
      << *warning;
  EXPECT_NE(warning->find("fastest-growing: rank 1 +150 MiB in the last 20 s (8 MiB/s), rank 0 "
                          "+10 MiB"),
            std::string::npos)
      << *warning;
  EXPECT_NE(warning->find("runs out of memory in about 10 s"), std::string::npos) << *warning;
  EXPECT_FALSE(w.check(21, nodeAt(950 * MiB, 1000 * MiB), "h")) << "once per crossing";
  EXPECT_FALSE(w.check(22, nodeAt(870 * MiB, 1000 * MiB), "h")) << "87 %: not re-armed yet";
  EXPECT_FALSE(w.check(23, nodeAt(840 * MiB, 1000 * MiB), "h"));
  EXPECT_TRUE(w.check(24, nodeAt(910 * MiB, 1000 * MiB), "h")) << "re-armed below 85 %";
}

TEST(MemoryWatch, GrowthCoversOnlyTheLastMinute) {
  constexpr int64_t MiB = 1 << 20;
  MemoryWatch w;
  w.addRanks(0, ranksAt({{0, 10 * MiB}}));
  w.addRanks(50, ranksAt({{0, 500 * MiB}}));
  w.addRanks(100, ranksAt({{0, 520 * MiB}}));
  auto g = w.growth(100);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].grownBytes, 20 * MiB) << "the sample from 100 s ago is outside the window";
  EXPECT_DOUBLE_EQ(g[0].seconds, 50);
}

TEST(GpuIdleWatch, OneWarningAfterFiveIdleMinutesWhileWorkersRun) {
  GpuIdleWatch w;
  GpuSample g0;
  g0.index = 0;
  g0.utilPercent = 2;
  GpuSample g1 = g0;
  g1.index = 1;
  g1.utilPercent = 0;
  EXPECT_FALSE(w.observe(0, {g0, g1}, true, "h"));
  EXPECT_FALSE(w.observe(299, {g0, g1}, true, "h"));
  auto warning = w.observe(300, {g0, g1}, true, "h");
  ASSERT_TRUE(warning);
  EXPECT_NE(warning->find("node h: GPUs 0 (2 %), 1 (0 %) under 5 % utilisation for 300 s"),
            std::string::npos)
      << *warning;
  EXPECT_FALSE(w.observe(400, {g0, g1}, true, "h")) << "one warning";
  GpuSample busy = g1;
  busy.utilPercent = 60;
  EXPECT_FALSE(w.observe(500, {g0, busy}, true, "h"));
  EXPECT_FALSE(w.observe(600, {g0, g1}, false, "h")) << "no workers running: not the job's";
  EXPECT_FALSE(w.observe(601, {g0, g1}, true, "h"));
  EXPECT_TRUE(w.observe(901, {g0, g1}, true, "h")) << "a new idle spell";
}

Record launchRecord(std::optional<int> rank, std::optional<int> gpu, std::vector<Field> fields) {
  Record r;
  r.time = 1700000000.5;
  r.source = "launch";
  r.runId = "run1";
  r.node = "host-a";
  r.rank = rank;
  r.gpu = gpu;
  r.fields = std::move(fields);
  return r;
}

progress::RankReport trainerReport(int rank, uint64_t last, int carried) {
  progress::RankReport r;
  r.rank = rank;
  r.lastRecord = last;
  for (uint64_t n = last - carried + 1; n <= last; ++n) {
    Record record;
    record.time = 1000.0 + static_cast<double>(n);
    record.source = "whatever the rank says";
    record.runId = "the rank's";
    record.node = "the rank's hostname";
    record.step = static_cast<int64_t>(n);
    record.fields = {{"loss", 1.0 / static_cast<double>(n)}};
    r.records.push_back(record);
  }
  return r;
}

TEST(Records, EachTrainerRecordIsWrittenOnceAndGapsAreCounted) {
  uint64_t written = 0, missed = 0;
  auto first = newTrainerRecords(trainerReport(3, 4, 4), written, "run1", "host-a", &missed);
  ASSERT_EQ(first.size(), 4u);
  EXPECT_EQ(written, 4u);
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(first[i].step, static_cast<int64_t>(i + 1));
    EXPECT_EQ(first[i].source, "trainer");
    EXPECT_EQ(first[i].runId, "run1") << "launch's run id";
    EXPECT_EQ(first[i].node, "host-a") << "launch's name of the rank's node";
    EXPECT_EQ(first[i].rank, 3);
    EXPECT_EQ(first[i].time, 1001.0 + static_cast<double>(i)) << "as the trainer made it";
  }
  // The next report still carries records 3 and 4: only 5 and 6 are new.
  auto second = newTrainerRecords(trainerReport(3, 6, 4), written, "run1", "host-a", &missed);
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[0].step, 5);
  EXPECT_EQ(written, 6u);
  EXPECT_TRUE(
      newTrainerRecords(trainerReport(3, 6, 4), written, "run1", "host-a", &missed).empty());
  EXPECT_EQ(missed, 0u);
  // The rank recorded 10 more than the report carries (3): 7 of them are missed.
  auto third = newTrainerRecords(trainerReport(3, 16, 3), written, "run1", "host-a", &missed);
  ASSERT_EQ(third.size(), 3u);
  EXPECT_EQ(third[0].step, 14);
  EXPECT_EQ(missed, 7u);
}

TEST(Records, SampleRecordsAttributeGpuMemoryToRanks) {
  SampleContext ctx;
  ctx.time = 1.0;
  ctx.runId = "r";
  ctx.node = "h";
  ctx.attempt = 1;
  ctx.workers = 2;
  ctx.workersAlive = 2;
  NodeSample node;
  node.mem.totalBytes = 1000;
  node.mem.availableBytes = 250;
  node.load1 = 1.5;
  RankSample r0;
  r0.rank = 0;
  r0.pid = 41235;
  r0.pids = {41235, 50000};
  r0.cpuPercent = 97;
  r0.rssBytes = 5;
  RankSample r1 = r0;
  r1.rank = 1;
  r1.pid = 41236;
  r1.pids = {41236};
  r1.cpuPercent = -1;
  GpuSample g;
  g.index = 0;
  g.utilPercent = 90;
  g.processes = {{41235, 100}, {50000, 20}, {77777, 1}};
  std::map<int, progress::RankReport> progress{{0, report(0, 12, "running")}};
  auto records = sampleRecords(ctx, node, {r0, r1}, {g}, progress);
  ASSERT_EQ(records.size(), 5u);  // node, 2 ranks, gpu, gpu x rank 0
  EXPECT_EQ(*records[0].field("mem_used_ratio"), 0.75);
  EXPECT_EQ(*records[0].field("restarts"), 1);
  EXPECT_EQ(*records[1].field("collective_seq"), 12);
  EXPECT_FALSE(records[2].field("cpu_percent")) << "no rate yet: left out, not -1";
  EXPECT_EQ(records[4].gpu, 0);
  EXPECT_EQ(records[4].rank, 0);
  EXPECT_EQ(*records[4].field("gpu_process_mem_bytes"), 120) << "worker and its child";
}

TEST(Prometheus, EverySeriesLabelledAndParsable) {
  std::vector<Record> records{
      launchRecord(std::nullopt, std::nullopt, {{"load1", 0.5}, {"workers_alive", 2}}),
      launchRecord(0, std::nullopt, {{"rss_bytes", 100}, {"read_bytes", 7}}),
      launchRecord(1, std::nullopt, {{"rss_bytes", 200}, {"read_bytes", 9}}),
      launchRecord(std::nullopt, 0, {{"gpu_util", std::nan("")}}),
      launchRecord(0, 0, {{"gpu_process_mem_bytes", 64}})};
  Record trainer = launchRecord(1, std::nullopt, {{"loss", 0.25}, {"rss_bytes", 1}});
  trainer.source = "trainer";
  trainer.step = 40;
  records.push_back(trainer);
  records[0].node = "we\"ird\\node";
  JobState job;
  job.attempt = 1;
  job.restarts = 1;
  job.maxRestarts = 3;
  job.worldSize = 2;
  job.heartbeatAge = {{"host-a", 0.25}};
  auto scrape = dtrain::testing::parsePrometheusText(exposition(records, job));
  EXPECT_EQ(scrape.value("dtrain_attempt"), 1);
  EXPECT_EQ(scrape.value("dtrain_restarts"), 1);
  EXPECT_EQ(scrape.value("dtrain_max_restarts"), 3);
  EXPECT_EQ(scrape.value("dtrain_world_size"), 2);
  EXPECT_EQ(scrape.value("dtrain_stalled"), 0);
  EXPECT_EQ(scrape.value("dtrain_heartbeat_age_seconds", {{"node", "host-a"}}), 0.25);
  EXPECT_EQ(scrape.value("dtrain_load1", {{"node", "we\"ird\\node"}}), 0.5) << "label escaped";
  EXPECT_EQ(scrape.value("dtrain_rss_bytes", {{"node", "host-a"}, {"rank", "1"}}), 200)
      << "launch's own series wins over a trainer figure of the same name";
  EXPECT_EQ(scrape.value("dtrain_loss", {{"node", "host-a"}, {"rank", "1"}}), 0.25);
  EXPECT_EQ(scrape.value("dtrain_step", {{"node", "host-a"}, {"rank", "1"}}), 40);
  EXPECT_TRUE(std::isnan(*scrape.value("dtrain_gpu_util", {{"node", "host-a"}, {"gpu", "0"}})));
  EXPECT_EQ(scrape.value("dtrain_gpu_process_mem_bytes",
                         {{"node", "host-a"}, {"rank", "0"}, {"gpu", "0"}}),
            64);
  EXPECT_EQ(scrape.types["dtrain_read_bytes"], "counter");
  EXPECT_EQ(scrape.types["dtrain_rss_bytes"], "gauge");
  for (const auto& sample : scrape.samples) {
    EXPECT_TRUE(scrape.types.count(sample.name)) << sample.name << " has no # TYPE";
    EXPECT_FALSE(scrape.help[sample.name].empty()) << sample.name << " has no # HELP";
    EXPECT_EQ(sample.name.rfind("dtrain_", 0), 0u) << sample.name;
  }
}

TEST(StatusLine, MinMedianMaxAndTheTightestNode) {
  std::vector<Record> latest{
      launchRecord(
          std::nullopt, std::nullopt,
          {{"workers_alive", 3}, {"mem_used_ratio", 0.41}, {"mem_headroom_bytes", 1288490189.0}}),
      launchRecord(0, std::nullopt, {{"cpu_percent", 12}}),
      launchRecord(1, std::nullopt, {{"cpu_percent", 98}}),
      launchRecord(2, std::nullopt, {{"cpu_percent", 50}})};
  JobState job;
  job.worldSize = 4;
  EXPECT_EQ(formatStatusLine(latest, job),
            "launch: status: attempt 0, ranks alive 3/4; CPU % per rank min/median/max "
            "12/50/98; GPU % n/a (no GPU sampled); memory: node host-a 41 % in use, 1.2 GiB "
            "headroom\n");
}

}  // namespace
}  // namespace dtrain::launcher::monitor::launcher_monitor_analysis_test
