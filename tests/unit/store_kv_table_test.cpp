// KvTable without sockets: parking, waking, cancelling (Note [Parked requests]).
#include <gtest/gtest.h>

#include "store/kv_table.h"

namespace dtrain::store {
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

}  // namespace
}  // namespace dtrain::store
