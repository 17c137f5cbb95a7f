// dtrain/base/progress.h: a rank's report on the wire, what counts as progress, and the publisher
// thread writing to a store (a HashStore here; launch's TcpStore in the integration tests).
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <thread>

#include <gtest/gtest.h>

#include "dtrain/base/error.h"
#include "dtrain/base/progress.h"
#include "monitor/progress_publisher.h"

namespace dtrain::progress::progress_test {
namespace {

RankReport sample() {
  RankReport r;
  r.rank = 3;
  r.nodeRank = 1;
  r.pid = 4242;
  r.time = 1700000000.25;
  r.step = 17;
  CollectiveState c;
  c.name = "pg/default";
  c.issued = 42;
  c.tail = {{40, "allreduce(float32 x 4096, sum)", "done", 0.4},
            {41, "broadcast(float32 x 8, root 0)", "running", 1200.0}};
  r.collectives = {c};
  r.figures = {{"loss", 0.25}, {"diverged", std::nan("")}};
  r.figuresStep = 17;
  r.figuresTime = 1700000000.0;
  metrics::Record record;
  record.time = 1700000000.0;
  record.step = 17;
  record.fields = {{"loss", 0.25}, {"samples_per_s", 812}};
  r.records = {record};
  r.lastRecord = 9;
  return r;
}

TEST(ProgressReport, RoundTrips) {
  RankReport back = decodeReport(encodeReport(sample()));
  EXPECT_EQ(back.rank, 3);
  EXPECT_EQ(back.nodeRank, 1);
  EXPECT_EQ(back.pid, 4242);
  EXPECT_EQ(back.step, 17);
  ASSERT_EQ(back.collectives.size(), 1u);
  EXPECT_EQ(back.collectives[0].issued, 42u);
  ASSERT_EQ(back.collectives[0].tail.size(), 2u);
  EXPECT_EQ(back.collectives[0].tail[1].state, "running");
  EXPECT_TRUE(back.collectives[0].tail[1].open());
  ASSERT_EQ(back.figures.size(), 2u);
  EXPECT_EQ(back.figuresStep, 17);
  bool sawNan = false;
  for (const auto& [name, value] : back.figures)
    sawNan = sawNan || (name == "diverged" && std::isnan(value));
  EXPECT_TRUE(sawNan) << "a non-finite figure travels as null and comes back as NaN";
  ASSERT_EQ(back.records.size(), 1u);
  EXPECT_EQ(back.lastRecord, 9u);
  EXPECT_EQ(back.records[0].step, 17);
  EXPECT_EQ(back.records[0].fields, sample().records[0].fields) << "in the order recorded";
  EXPECT_FALSE(advanced(sample(), back));
}

TEST(ProgressReport, MalformedReportsAreRefusedByName) {
  EXPECT_THROW(decodeReport("[]"), InvalidArgument);
  EXPECT_THROW(decodeReport("{\"rank\": 1}"), InvalidArgument);
  try {
    decodeReport("{\"rank\":1,\"pid\":2,\"time\":3,\"collectives\":[{\"name\":\"x\",\"issued\":-1,"
                 "\"tail\":[]}]}");
    FAIL() << "a negative count was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("\"issued\""), std::string::npos) << e.what();
  }
  // More records than their numbering allows.
  EXPECT_THROW(decodeReport(R"({"rank":1,"pid":2,"time":3,"collectives":[],"records":)"
                            R"({"last":0,"items":[{"time":1,"source":"trainer","loss":1}]}})"),
               InvalidArgument);
}

TEST(ProgressReport, WhatCountsAsProgress) {
  RankReport a = sample();
  RankReport b = a;
  b.time += 10;
  b.collectives[0].tail[1].ms += 5000;
  EXPECT_FALSE(advanced(a, b)) << "time passing is not progress";
  b = a;
  b.collectives[0].tail[1].state = "done";
  EXPECT_TRUE(advanced(a, b));
  b = a;
  b.collectives[0].issued = 43;
  EXPECT_TRUE(advanced(a, b));
  b = a;
  b.step = 18;
  EXPECT_TRUE(advanced(a, b));
  b = a;
  b.figuresTime += 1;
  EXPECT_TRUE(advanced(a, b)) << "new figures";
  b = a;
  b.lastRecord += 1;
  EXPECT_TRUE(advanced(a, b)) << "a new record";
}

TEST(ProgressPublisher, PublishesOnlyWhatChangedThroughItsOwnStore) {
  auto store = std::make_shared<store::HashStore>();
  PublisherOptions o;
  o.rank = 5;
  o.connect = [store] { return store; };
  o.interval = std::chrono::milliseconds(20);
  ProgressPublisher p(o);
  std::atomic<uint64_t> issued{3};
  uint64_t id = p.addSource([&] {
    CollectiveState c;
    c.name = "pg/default";
    c.issued = issued.load();
    return c;
  });
  ASSERT_TRUE(p.flush(std::chrono::milliseconds(2000)));
  ASSERT_TRUE(store->check({rankKey(5)}));
  RankReport r = decodeReport(store->getString(rankKey(5)));
  EXPECT_EQ(r.rank, 5);
  EXPECT_EQ(r.collectives.at(0).issued, 3u);
  const int64_t version = store->add(kVersionKey, 0);
  EXPECT_GE(version, 1);
  // Nothing changes: several rounds, no new writes.
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  EXPECT_EQ(store->add(kVersionKey, 0), version) << "an idle rank writes nothing";
  issued = 4;
  p.setFigures(9, {{"loss", 1.5}});
  ASSERT_TRUE(p.flush(std::chrono::milliseconds(2000)));
  EXPECT_GT(store->add(kVersionKey, 0), version);
  r = decodeReport(store->getString(rankKey(5)));
  EXPECT_EQ(r.collectives.at(0).issued, 4u);
  EXPECT_EQ(r.step, 9);
  EXPECT_EQ(r.figures.at(0).first, "loss");
  p.removeSource(id);
  ASSERT_TRUE(p.flush(std::chrono::milliseconds(2000)));
  EXPECT_TRUE(decodeReport(store->getString(rankKey(5))).collectives.empty());
  EXPECT_TRUE(p.stop(std::chrono::milliseconds(2000)));
}

// Note [Trainer records]: the endpoint's figures keep the latest value of every field; the
// records travel as they were made, numbered, while they are recent.
TEST(ProgressPublisher, TrainerRecordsMergeIntoFiguresAndTravelAsMade) {
  auto store = std::make_shared<store::HashStore>();
  PublisherOptions o;
  o.rank = 2;
  o.connect = [store] { return store; };
  o.interval = std::chrono::milliseconds(20);
  ProgressPublisher p(o);
  p.setFigures(1, {{"loss", 2.0}, {"samples_per_s", 100}});
  metrics::Record eval;
  eval.step = 1;
  eval.time = 1700000000.5;
  eval.fields = {{"test_accuracy", 0.5}, {"bad name", 1}, {"step", 3}, {"test_accuracy", 0.9}};
  p.addRecord(eval);
  p.setFigures(2, {{"loss", 1.5}});
  ASSERT_TRUE(p.flush(std::chrono::milliseconds(2000)));
  RankReport r = decodeReport(store->getString(rankKey(2)));
  EXPECT_EQ(r.step, 2);
  EXPECT_EQ(r.figuresStep, 2);
  std::map<std::string, double> figures(r.figures.begin(), r.figures.end());
  EXPECT_EQ(figures, (std::map<std::string, double>{
                         {"loss", 1.5}, {"samples_per_s", 100}, {"test_accuracy", 0.5}}))
      << "the latest value of every field; invalid and repeated names dropped";
  EXPECT_EQ(r.lastRecord, 3u);
  ASSERT_EQ(r.records.size(), 3u);
  EXPECT_EQ(r.records[0].fields,
            (std::vector<metrics::Field>{{"loss", 2.0}, {"samples_per_s", 100}}));
  EXPECT_EQ(r.records[1].time, 1700000000.5);
  EXPECT_EQ(r.records[1].fields, (std::vector<metrics::Field>{{"test_accuracy", 0.5}}));
  EXPECT_EQ(r.records[2].step, 2);
  EXPECT_GT(r.records[2].time, 1.6e9) << "stamped when recorded";
}

// A checkpoint written in the background is recorded under the step it saved, steps after it:
// the rank's step stays the newest (launch's stall detection and the dtrain_step gauge read it),
// while the record itself travels with its own step.
TEST(ProgressPublisher, ARecordOfAnEarlierStepDoesNotMoveTheStepBack) {
  PublisherOptions o;
  o.connect = [] { return std::make_shared<store::HashStore>(); };
  ProgressPublisher p(o);
  p.setFigures(12, {{"loss", 0.5}});
  p.setFigures(10, {{"checkpoint_write_seconds", 0.25}});
  RankReport r = p.gather();
  EXPECT_EQ(r.step, 12);
  EXPECT_EQ(r.figuresStep, 12);
  ASSERT_EQ(r.records.size(), 2u);
  EXPECT_EQ(r.records[1].step, 10);
  std::map<std::string, double> figures(r.figures.begin(), r.figures.end());
  EXPECT_EQ(figures.at("checkpoint_write_seconds"), 0.25);
  p.setFigures(13, {{"loss", 0.4}});
  EXPECT_EQ(p.gather().step, 13);
}

TEST(ProgressPublisher, RecentRecordsAreBoundedByCountAndAge) {
  PublisherOptions o;
  o.connect = [] { return std::make_shared<store::HashStore>(); };
  o.recentRecords = 4;
  o.recentRecordSeconds = 0.3;
  ProgressPublisher p(o);
  for (int step = 1; step <= 10; ++step) p.setFigures(step, {{"loss", 1.0 / step}});
  RankReport r = p.gather();
  EXPECT_EQ(r.lastRecord, 10u);
  ASSERT_EQ(r.records.size(), 4u);
  EXPECT_EQ(r.records.front().step, 7);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  r = p.gather();
  EXPECT_EQ(r.lastRecord, 10u);
  EXPECT_TRUE(r.records.empty()) << "older than recentRecordSeconds";
  EXPECT_EQ(r.figures.at(0).second, 0.1) << "the figures stay";
}

TEST(ProgressPublisher, AStoreThatCannotBeReachedTurnsPublishingOff) {
  PublisherOptions o;
  o.connect = []() -> std::shared_ptr<store::Store> {
    DTRAIN_THROW(NetworkError, "no store here");
  };
  ProgressPublisher p(o);
  p.setStep(1);
  EXPECT_FALSE(p.flush(std::chrono::milliseconds(2000)));
}

TEST(ProgressPublisher, OutsideLaunchEverythingIsANoOp) {
  // This test process was not started by launch (no DTRAIN_STORE_ADDR).
  ASSERT_EQ(std::getenv("DTRAIN_STORE_ADDR"), nullptr);
  EXPECT_EQ(publisher(), nullptr);
  setStep(3);
  publishFigures(3, {{"loss", 1}});
  publishRecord(metrics::Record{});
  EXPECT_FALSE(publishing());
  Registration r = watchCollectives([] { return CollectiveState{}; });
  EXPECT_FALSE(flushProgress(10));
}

}  // namespace
}  // namespace dtrain::progress::progress_test
