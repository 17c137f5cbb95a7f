#include <gtest/gtest.h>

#include "flight_recorder.h"

namespace dtrain::comm::flight_recorder_test {
namespace {

CollectiveInfo allreduce(uint64_t seq, size_t count) {
  CollectiveInfo i;
  i.seq = seq;
  i.kind = CollectiveKind::Allreduce;
  i.count = count;
  return i;
}

TEST(FlightRecorder, KeepsTheMostRecentEntriesWithTheirStates) {
  FlightRecorder rec(4);
  for (uint64_t s = 0; s < 6; ++s) rec.recordQueued(allreduce(s, 10 + s));
  rec.setState(4, FlightRecorder::State::Done);
  rec.setState(5, FlightRecorder::State::Running);
  rec.setState(0, FlightRecorder::State::Failed);  // evicted: ignored
  auto entries = rec.snapshot();
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(entries.front().info.seq, 2u);
  EXPECT_EQ(entries.back().info.seq, 5u);
  EXPECT_EQ(entries[2].state, FlightRecorder::State::Done);
  std::string dump = rec.dump(2);
  EXPECT_NE(dump.find("seq 4 allreduce(float32 x 14, sum) done"), std::string::npos) << dump;
  EXPECT_NE(dump.find("seq 5 allreduce(float32 x 15, sum) running"), std::string::npos) << dump;
  EXPECT_EQ(dump.find("seq 3"), std::string::npos) << dump;
}

TEST(CollectiveInfo, DescribesShapesAndTagsDifferWithTheCollective) {
  CollectiveInfo a = allreduce(7, 12);
  a.shape = {3, 4};
  EXPECT_EQ(a.describe(), "allreduce(float32 [3, 4], sum)");
  CollectiveInfo b = allreduce(7, 12);
  EXPECT_EQ(a.tag(), b.tag()) << "the shape does not change the tag";
  b.count = 11;
  EXPECT_NE(a.tag(), b.tag());
  CollectiveInfo c = allreduce(8, 12);
  EXPECT_NE(a.tag(), c.tag());
  CollectiveInfo d = allreduce(7, 12);
  d.dtype = DataType::Int32;
  EXPECT_NE(a.tag(), d.tag());
  CollectiveInfo bc;
  bc.kind = CollectiveKind::Broadcast;
  bc.dtype = DataType::Int64;
  bc.count = 3;
  bc.root = 1;
  EXPECT_EQ(bc.describe(), "broadcast(int64 x 3, root 1)");
}

TEST(Fingerprint, ComparesShapesWhenBothSidesGiveOne) {
  CollectiveInfo a = allreduce(1, 12);
  a.shape = {3, 4};
  CollectiveInfo b = a;
  b.shape = {4, 3};
  EXPECT_FALSE(Fingerprint::of(a).sameCollective(Fingerprint::of(b)));
  b.shape.clear();
  EXPECT_TRUE(Fingerprint::of(a).sameCollective(Fingerprint::of(b)));
  EXPECT_EQ(Fingerprint::of(a).toInfo().describe(), a.describe());
}

}  // namespace
}  // namespace dtrain::comm::flight_recorder_test
