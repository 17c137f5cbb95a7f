// dtrain/progress.h: a rank's report on the wire, what counts as progress, and the publisher
// thread writing to a store (a HashStore here; launch's TcpStore in the integration tests).
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

#include <gtest/gtest.h>

#include "dtrain/error.h"
#include "dtrain/progress.h"
#include "monitor/progress_publisher.h"

namespace dtrain::progress {
namespace {

RankReport sample() {
  RankReport r;
  r.rank = 3;
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
  return r;
}

TEST(ProgressReport, RoundTrips) {
  RankReport back = decodeReport(encodeReport(sample()));
  EXPECT_EQ(back.rank, 3);
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
  for (const auto& [name, value] : back.figures) sawNan = sawNan || (name == "diverged" && std::isnan(value));
  EXPECT_TRUE(sawNan) << "a non-finite figure travels as null and comes back as NaN";
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
  Registration r = watchCollectives([] { return CollectiveState{}; });
  EXPECT_FALSE(flushProgress(10));
}

}  // namespace
}  // namespace dtrain::progress
