// dtrain::metrics: the record schema as JSONL, the Prometheus text exposition (parsed, not
// grepped: tests/support/prometheus_text_support.h) and the endpoint that serves it, scraped over
// HTTP.
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <sstream>

#include <gtest/gtest.h>
#include <httplib.h>

#include "dtrain/base/error.h"
#include "dtrain/base/metrics.h"
#include "prometheus_text_support.h"
#include "test_support.h"

namespace dtrain::metrics::metrics_test {
namespace {

using dtrain::testing::TempDir;

using dtrain::testing::parsePrometheusText;
using dtrain::testing::PromScrape;

Record sampleRecord() {
  Record r;
  r.time = 1700000000.25;
  r.runId = "run-7";
  r.node = "node-a";
  r.rank = 1;
  r.step = 42;
  r.fields = {{"loss", 0.125}, {"samples_per_s", 812.5}, {"loss_scale", 65536}};
  return r;
}

TEST(MetricsRecord, JsonLineKeepsTheSchemaKeysFirstAndRoundTrips) {
  Record r = sampleRecord();
  std::string line = toJsonLine(r);
  // Integral values (the loss scale) as JSON integers.
  EXPECT_EQ(line, R"({"time":1700000000.25,"source":"trainer","run_id":"run-7",)"
                  R"("node":"node-a","rank":1,"step":42,"loss":0.125,"samples_per_s":812.5,)"
                  R"("loss_scale":65536})");
  EXPECT_EQ(line.find('\n'), std::string::npos);
  Record back = parseJsonLine(line);
  EXPECT_EQ(back.time, r.time);
  EXPECT_EQ(back.source, "trainer");
  EXPECT_EQ(back.runId, r.runId);
  EXPECT_EQ(back.node, r.node);
  EXPECT_EQ(back.rank, r.rank);
  EXPECT_FALSE(back.gpu.has_value());
  EXPECT_EQ(back.step, r.step);
  EXPECT_EQ(back.fields, r.fields);
}

TEST(MetricsRecord, NonFiniteValuesAreNullAndReadBackAsNaN) {
  Record r = sampleRecord();
  r.fields = {{"loss", std::numeric_limits<double>::quiet_NaN()}, {"grad_norm", INFINITY}};
  std::string line = toJsonLine(r);
  EXPECT_NE(line.find(R"("loss":null,"grad_norm":null)"), std::string::npos) << line;
  Record back = parseJsonLine(line);
  ASSERT_EQ(back.fields.size(), 2u);
  EXPECT_TRUE(std::isnan(*back.field("loss")));
}

TEST(MetricsRecord, LaunchRecordsWithoutRankOrStep) {
  Record r;
  r.time = 5;
  r.source = "launch";
  r.node = "n";
  r.gpu = 3;
  r.fields = {{"gpu_util", 97}};
  Record back = parseJsonLine(toJsonLine(r));
  EXPECT_EQ(back.source, "launch");
  EXPECT_FALSE(back.rank.has_value());
  EXPECT_FALSE(back.step.has_value());
  EXPECT_EQ(back.gpu, 3);
}

TEST(MetricsRecord, FieldNamesFollowPrometheusAndAvoidTheSchemaKeys) {
  for (const char* good : {"loss", "samples_per_s", "_x", "a1"}) {
    EXPECT_TRUE(validFieldName(good)) << good;
  }
  for (const char* bad : {"", "1loss", "loss-rate", "loss rate", "step", "rank", "time", "node",
                          "gpu", "run_id", "source", "l\xc3\xa4"}) {
    EXPECT_FALSE(validFieldName(bad)) << bad;
  }
  Record r = sampleRecord();
  r.fields.push_back({"loss", 1});
  EXPECT_THROW(toJsonLine(r), InvalidArgument);  // repeated
  r.fields = {{"loss-rate", 1}};
  EXPECT_THROW(toJsonLine(r), InvalidArgument);
}

TEST(MetricsRecord, ParseRefusesMalformedLines) {
  for (const char* bad :
       {"", "not json", "[1,2]", R"({"source":"trainer"})", R"({"time":"x","source":"t"})",
        R"({"time":1,"source":"t","loss":"high"})", R"({"time":1,"source":"t","rank":1.5})"}) {
    EXPECT_THROW(parseJsonLine(bad), InvalidArgument) << bad;
  }
}

TEST(MetricsRecord, ArraysRoundTrip) {
  Record gpu;
  gpu.source = "launch";
  gpu.node = "n";
  gpu.gpu = 0;
  gpu.fields = {{"gpu_util", NAN}};
  auto back = parseJsonArray(toJsonArray({sampleRecord(), gpu}));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].fields, sampleRecord().fields);
  EXPECT_EQ(back[1].gpu, 0);
  EXPECT_TRUE(std::isnan(*back[1].field("gpu_util")));
  EXPECT_THROW(parseJsonArray("{}"), InvalidArgument);
  EXPECT_THROW(parseJsonArray(R"([{"time":1}])"), InvalidArgument);
}

TEST(MetricsPrometheus, TextHasOneBlockPerFieldAndTheLatestValuePerSeries) {
  Record a = sampleRecord();  // rank 1, step 42
  Record b = sampleRecord();
  b.rank = 0;
  b.step = 40;
  b.fields = {{"loss", 0.5}};
  Record newer = sampleRecord();  // rank 1 again: replaces a's values
  newer.step = 43;
  newer.fields = {{"loss", 0.0625}};
  Record gpu;
  gpu.source = "launch";
  gpu.node = "node \"b\"\\";
  gpu.gpu = 2;
  gpu.fields = {{"gpu_util", NAN}, {"read_bytes", 4096}};
  Record job;  // no node: a job-wide figure, no labels at all
  job.source = "launch";
  job.fields = {{"world_size", 8}};

  PromScrape e = parsePrometheusText(prometheusText({a, b, newer, gpu, job}));
  for (const char* name : {"dtrain_step", "dtrain_loss", "dtrain_samples_per_s",
                           "dtrain_loss_scale", "dtrain_gpu_util", "dtrain_world_size"}) {
    EXPECT_EQ(e.types[name], "gauge") << name;
  }
  EXPECT_EQ(e.types["dtrain_read_bytes"], "counter");
  const std::map<std::string, std::string> rank1{{"node", "node-a"}, {"rank", "1"}};
  const std::map<std::string, std::string> rank0{{"node", "node-a"}, {"rank", "0"}};
  EXPECT_EQ(e.value("dtrain_step", rank1), 43);
  EXPECT_EQ(e.value("dtrain_loss", rank1), 0.0625);
  EXPECT_EQ(e.value("dtrain_samples_per_s", rank1), 812.5);  // kept from the older record
  EXPECT_EQ(e.value("dtrain_step", rank0), 40);
  EXPECT_EQ(e.value("dtrain_loss", rank0), 0.5);
  ASSERT_TRUE(e.value("dtrain_gpu_util", {{"node", "node \"b\"\\"}, {"gpu", "2"}}));
  EXPECT_TRUE(std::isnan(*e.value("dtrain_gpu_util", {{"node", "node \"b\"\\"}, {"gpu", "2"}})));
  EXPECT_EQ(e.value("dtrain_world_size"), 8);
  EXPECT_EQ(e.samples.size(), 9u);
  for (const auto& sample : e.samples) {
    EXPECT_FALSE(e.help[sample.name].empty()) << sample.name << " has no # HELP";
  }
  EXPECT_EQ(e.help["dtrain_loss"], fieldHelp("loss"));
  EXPECT_STREQ(fieldHelp("my_own_figure"), "a figure the program recorded");
}

TEST(MetricsPrometheus, EndpointAnswersAScrapeWithEverySeries) {
  auto endpoint = PrometheusEndpoint::start({"127.0.0.1", 0});
  ASSERT_GT(endpoint->port(), 0);
  MetricsOptions options;
  options.runId = "job-1";
  options.node = "host-x";
  options.rank = 0;
  Metrics metrics(options);
  metrics.addSink(endpoint);
  metrics.record(
      7,
      {{"loss", 2.5}, {"accuracy", 0.25}, {"samples_per_s", 300}, {"allreduce_wait_share", 0.125}});

  httplib::Client client("127.0.0.1", endpoint->port());
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  PromScrape e = parsePrometheusText(res->body);
  const std::map<std::string, std::string> labels{{"node", "host-x"}, {"rank", "0"}};
  EXPECT_EQ(e.value("dtrain_step", labels), 7);
  EXPECT_EQ(e.value("dtrain_loss", labels), 2.5);
  EXPECT_EQ(e.value("dtrain_accuracy", labels), 0.25);
  EXPECT_EQ(e.value("dtrain_samples_per_s", labels), 300);
  EXPECT_EQ(e.value("dtrain_allreduce_wait_share", labels), 0.125);
  EXPECT_EQ(e.samples.size(), 5u);
  EXPECT_EQ(res->body, endpoint->text());

  // The next scrape sees the next step.
  metrics.record(8, {{"loss", 2.0}});
  res = client.Get("/metrics");
  ASSERT_TRUE(res);
  e = parsePrometheusText(res->body);
  EXPECT_EQ(e.value("dtrain_step", labels), 8);
  EXPECT_EQ(e.value("dtrain_loss", labels), 2.0);
  EXPECT_EQ(e.value("dtrain_accuracy", labels), 0.25);

  res = client.Get("/elsewhere");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
}

TEST(MetricsPrometheus, ServerAnswersWhatItsCallbackRendersAtEachScrape) {
  std::atomic<int> scrapes{0};
  PrometheusServer server({"127.0.0.1", 0}, [&] {
    return "# TYPE dtrain_scrapes gauge\ndtrain_scrapes " + std::to_string(++scrapes) + "\n";
  });
  httplib::Client client("127.0.0.1", server.port());
  for (int i = 1; i <= 2; ++i) {
    auto res = client.Get("/metrics");
    ASSERT_TRUE(res) << httplib::to_string(res.error());
    EXPECT_EQ(parsePrometheusText(res->body).value("dtrain_scrapes"), i);
  }
}

TEST(MetricsPrometheus, BusyPortIsRefusedNamingIt) {
  auto first = PrometheusEndpoint::start({"127.0.0.1", 0});
  try {
    PrometheusEndpoint::start({"127.0.0.1", first->port(), "--my-port"});
    FAIL() << "a second endpoint bound a busy port";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--my-port: cannot listen on 127.0.0.1:" +
                                         std::to_string(first->port())),
              std::string::npos)
        << e.what();
  }
}

TEST(MetricsJsonl, AppendsOneLinePerRecordAcrossOpens) {
  TempDir dir;
  const std::string path = dir.file("m.jsonl");
  MetricsOptions options;
  options.runId = "r";
  options.node = "n";
  options.rank = 2;
  {
    Metrics metrics(options);
    metrics.addSink(JsonlSink::open(path));
    metrics.record(1, {{"loss", 1.0}});
    metrics.record(2, {{"loss", 0.5}});
  }
  {
    Metrics metrics(options);  // a restarted run appends
    metrics.addSink(JsonlSink::open(path));
    metrics.record(3, {{"loss", 0.25}});
  }
  std::istringstream in(dtrain::testing::readFile(path));
  std::vector<Record> records;
  for (std::string line; std::getline(in, line);) records.push_back(parseJsonLine(line));
  ASSERT_EQ(records.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(records[i].step, i + 1);
    EXPECT_EQ(records[i].rank, 2);
    EXPECT_EQ(records[i].runId, "r");
    EXPECT_GT(records[i].time, 1.6e9);  // stamped with the wall clock
  }
  EXPECT_EQ(*records[2].field("loss"), 0.25);
}

TEST(MetricsJsonl, UnwritablePathIsNamed) {
  try {
    JsonlSink::open("/nonexistent-dir/m.jsonl");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/m.jsonl"), std::string::npos);
  }
}

TEST(Metrics, WithoutSinksRecordsNothingButStillChecksNames) {
  // This test process was not started by launch: no sink towards it either.
  ASSERT_EQ(std::getenv("DTRAIN_STORE_ADDR"), nullptr);
  EXPECT_EQ(LaunchSink::open(), nullptr);
  Metrics metrics;
  EXPECT_FALSE(metrics.enabled());
  EXPECT_FALSE(metrics.toLaunch());
  metrics.record(1, {{"loss", 1}});
  EXPECT_THROW(metrics.record(1, {{"bad name", 1}}), InvalidArgument);
  EXPECT_FALSE(metrics.runId().empty());
  EXPECT_FALSE(metrics.node().empty());
}

}  // namespace
}  // namespace dtrain::metrics::metrics_test
