// KvTable without sockets: parking, waking, cancelling (Note [Parked requests]).
#include <gtest/gtest.h>

#include "store/kv_table.h"

namespace dtrain::store::store_kv_table_test {
namespace {

using wire::Op;
using wire::Request;

struct FakeWaiter : KvTable::Waiter {
  int woken = 0;
  void onKeysReady() override { ++woken; }
};

Request req(Op op, std::vector<std::string> keys, std::string value = "") {
  Request r;
  r.op = op;
  r.keys = std::move(keys);
  r.value = Bytes(value.begin(), value.end());
  r.timeoutMs = 1000;
  return r;
}

// Runs a request nobody waits on (the table may move its value).
std::optional<Bytes> run(KvTable& t, Request r) { return t.execute(r, nullptr); }

wire::FrameHeader statusOf(const Bytes& frame) { return wire::decodeHeader(frame.data()); }

TEST(KvTable, WaitParksUntilEveryKeyExists) {
  KvTable t;
  FakeWaiter w;
  Request wait = req(Op::Wait, {"a", "b"});
  EXPECT_FALSE(t.execute(wait, &w).has_value());
  EXPECT_EQ(t.numRegistrations(), 2u);
  run(t, req(Op::Set, {"a"}, "1"));
  EXPECT_EQ(w.woken, 0);
  EXPECT_EQ(t.numRegistrations(), 1u);
  run(t, req(Op::Set, {"b"}, "2"));
  EXPECT_EQ(w.woken, 1);
  EXPECT_EQ(t.numRegistrations(), 0u);
  EXPECT_EQ(statusOf(t.answerParked(wait)).type, static_cast<uint8_t>(wire::Status::Ok));
}

TEST(KvTable, AWakeRechecksKeysDeletedMeanwhile) {
  KvTable t;
  FakeWaiter w;
  run(t, req(Op::Set, {"a"}, "1"));
  Request wait = req(Op::Wait, {"a", "b"});
  EXPECT_FALSE(t.execute(wait, &w).has_value());
  run(t, req(Op::Delete, {"a"}));
  run(t, req(Op::Set, {"b"}, "2"));
  EXPECT_EQ(w.woken, 0) << "woke although \"a\" was deleted";
  run(t, req(Op::Add, {"a"}));
  EXPECT_EQ(w.woken, 1);
}

TEST(KvTable, CancelLeavesNoRegistrations) {
  KvTable t;
  FakeWaiter w1, w2;
  Request get = req(Op::Get, {"x"});
  Request wait = req(Op::Wait, {"x", "y", "x"});
  EXPECT_FALSE(t.execute(get, &w1).has_value());
  EXPECT_FALSE(t.execute(wait, &w2).has_value());
  EXPECT_EQ(t.numRegistrations(), 3u);  // a repeated key registers once
  t.cancel(&w2);
  t.cancel(&w2);
  EXPECT_EQ(t.numRegistrations(), 1u);
  run(t, req(Op::Set, {"x"}, "v"));
  EXPECT_EQ(w1.woken, 1);
  EXPECT_EQ(w2.woken, 0);
  EXPECT_EQ(t.numRegistrations(), 0u);
}

TEST(KvTable, TimeoutAnswerListsMissingIndices) {
  KvTable t;
  run(t, req(Op::Set, {"b"}, "1"));
  Bytes frame = t.timeoutResponse(req(Op::Wait, {"a", "b", "c"}));
  wire::Reader in(frame.data() + wire::kHeaderBytes, frame.size() - wire::kHeaderBytes);
  uint64_t count = 0, i0 = 0, i1 = 0;
  ASSERT_TRUE(in.u64(&count) && in.u64(&i0) && in.u64(&i1));
  EXPECT_EQ(count, 2u);
  EXPECT_EQ(i0, 0u);
  EXPECT_EQ(i1, 2u);
}

TEST(KvTable, ZeroTimeoutAnswersAtOnce) {
  KvTable t;
  Request get = req(Op::Get, {"absent"});
  get.timeoutMs = 0;
  auto answer = t.execute(get, nullptr);
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(statusOf(*answer).type, static_cast<uint8_t>(wire::Status::Timeout));
  EXPECT_EQ(t.numRegistrations(), 0u);
}

TEST(KvTable, AddRefusesNonCountersAndOverflow) {
  KvTable t;
  run(t, req(Op::Set, {"t"}, "12x"));
  Request add = req(Op::Add, {"t"});
  add.delta = 1;
  EXPECT_EQ(statusOf(*t.execute(add, nullptr)).type, static_cast<uint8_t>(wire::Status::Error));
  run(t, req(Op::Set, {"t"}, "9223372036854775807"));
  EXPECT_EQ(statusOf(*t.execute(add, nullptr)).type, static_cast<uint8_t>(wire::Status::Error));
}

TEST(KvTable, WaitChangedParksUntilTheValueDiffersFromTheOneSeen) {
  KvTable t;
  FakeWaiter w;
  run(t, req(Op::Add, {"n"}));  // "0"
  Request changed = req(Op::WaitChanged, {"n"});
  changed.expected = Bytes{'0'};
  EXPECT_FALSE(t.execute(changed, &w).has_value());
  EXPECT_EQ(t.numRegistrations(), 1u) << "registered under its key although the key exists";
  run(t, req(Op::Set, {"n"}, "0"));  // the same value again: no change
  EXPECT_EQ(w.woken, 0);
  EXPECT_EQ(t.numRegistrations(), 1u);
  Request add = req(Op::Add, {"n"});
  add.delta = 1;
  run(t, add);
  EXPECT_EQ(w.woken, 1);
  EXPECT_EQ(t.numRegistrations(), 0u);
  Bytes answer = t.answerParked(changed);
  wire::Reader in(answer.data() + wire::kHeaderBytes, answer.size() - wire::kHeaderBytes);
  Bytes value;
  ASSERT_TRUE(in.bytes(16, &value));
  EXPECT_EQ(value, Bytes{'1'});
  // Its timeout names the one key, present or not.
  Bytes frame = t.timeoutResponse(changed);
  wire::Reader tin(frame.data() + wire::kHeaderBytes, frame.size() - wire::kHeaderBytes);
  uint64_t count = 0, index = 9;
  ASSERT_TRUE(tin.u64(&count) && tin.u64(&index));
  EXPECT_EQ(count, 1u);
  EXPECT_EQ(index, 0u);
}

TEST(KvTable, MultiGetAnswersPresentAndAbsentAndRefusesMoreThanTheValueLimit) {
  KvTable t(/*maxValueBytes=*/10);
  run(t, req(Op::Set, {"a"}, "12345"));
  run(t, req(Op::Set, {"b"}, "6789"));
  auto answer = t.execute(*std::make_unique<Request>(req(Op::MultiGet, {"a", "x", "b"})), nullptr);
  ASSERT_TRUE(answer.has_value());
  ASSERT_EQ(statusOf(*answer).type, static_cast<uint8_t>(wire::Status::Ok));
  std::vector<std::optional<Bytes>> values;
  ASSERT_TRUE(wire::decodeMultiValues(Bytes(answer->begin() + wire::kHeaderBytes, answer->end()), 3,
                                      10, &values));
  EXPECT_EQ(values, (std::vector<std::optional<Bytes>>{Bytes{'1', '2', '3', '4', '5'}, std::nullopt,
                                                       Bytes{'6', '7', '8', '9'}}));
  Request tooMuch = req(Op::MultiGet, {"a", "b", "a"});  // 14 bytes of values
  EXPECT_EQ(statusOf(*t.execute(tooMuch, nullptr)).type, static_cast<uint8_t>(wire::Status::Error));
}

}  // namespace
}  // namespace dtrain::store::store_kv_table_test
