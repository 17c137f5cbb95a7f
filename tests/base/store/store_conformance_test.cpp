// One conformance suite for every Store. Implementations register a factory
// in the instantiation at the bottom; PrefixStore is checked over each of them.
#include <atomic>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "dtrain/base/error.h"
#include "dtrain/base/store.h"
#include "store_factories_support.h"

namespace dtrain::store::store_conformance_test {
namespace {

using testing::StoreFactory;

class StoreConformance : public ::testing::TestWithParam<StoreFactory> {
 protected:
  void SetUp() override { store_ = GetParam().make(); }
  std::shared_ptr<Store> another() { return GetParam().another(store_); }
  std::shared_ptr<Store> store_;
};

TEST_P(StoreConformance, SetThenGet) {
  store_->set("a", toBytes("1"));
  EXPECT_EQ(toString(store_->get("a")), "1");
  store_->set("a", toBytes("two"));
  EXPECT_EQ(store_->getString("a"), "two");
  store_->set("empty", {});
  EXPECT_TRUE(store_->get("empty").empty());
}

TEST_P(StoreConformance, BinaryValuesSurvive) {
  Bytes value;
  for (int i = 0; i < 256; ++i) value.push_back(static_cast<uint8_t>(i));
  store_->set("bin", value);
  EXPECT_EQ(store_->get("bin"), value);
}

TEST_P(StoreConformance, GetTimesOutNamingTheKey) {
  store_->setTimeout(Millis(100));
  try {
    store_->get("never");
    FAIL() << "get of a missing key returned";
  } catch (const TimeoutError& e) {
    // Through a PrefixStore the message names the full key ("job/never").
    EXPECT_NE(std::string(e.what()).find("never\""), std::string::npos) << e.what();
  }
}

TEST_P(StoreConformance, GetWaitsForALaterSet) {
  auto other = another();
  std::thread setter([&] {
    std::this_thread::sleep_for(Millis(50));
    other->set("late", toBytes("x"));
  });
  EXPECT_EQ(store_->getString("late"), "x");
  setter.join();
}

TEST_P(StoreConformance, AddIsAtomicAndReturnsTheNewValue) {
  EXPECT_EQ(store_->add("c", 5), 5);
  EXPECT_EQ(store_->add("c", -2), 3);
  EXPECT_EQ(store_->getString("c"), "3");
}

TEST_P(StoreConformance, SixteenThreadsTimesThousandAddsAreExact) {
  constexpr int kThreads = 16;
  constexpr int kAdds = 1000;
  std::vector<std::shared_ptr<Store>> clients;
  for (int t = 0; t < kThreads; ++t) clients.push_back(another());
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAdds; ++i) clients[t]->add("counter", 1);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(store_->add("counter", 0), kThreads * kAdds);
}

TEST_P(StoreConformance, SixteenThreadsOfCompareSetIncrementsLoseNoUpdate) {  // S10
  constexpr int kThreads = 16;
  constexpr int kIncrements = 100;
  std::vector<std::shared_ptr<Store>> clients;
  for (int t = 0; t < kThreads; ++t) clients.push_back(another());
  // Values are "<count>/<writer>": compareSet returns the value now stored, so only a value no
  // other thread would write tells that this thread's swap is the one that happened.
  store_->setString("cas", "0/-");
  auto countOf = [](const Bytes& v) { return std::stol(toString(v)); };  // stops at '/'
  std::atomic<long> attempts{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Bytes seen = clients[t]->get("cas");
      for (int i = 0; i < kIncrements;) {
        Bytes next = toBytes(std::to_string(countOf(seen) + 1) + "/" + std::to_string(t));
        Bytes now = clients[t]->compareSet("cas", seen, next);
        attempts.fetch_add(1);
        if (now == next) ++i;
        seen = now;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(countOf(store_->get("cas")), kThreads * kIncrements);
  EXPECT_GE(attempts.load(), kThreads * kIncrements);
}

TEST_P(StoreConformance, SixteenThreadsMixingSetGetAndAddOnSharedAndOwnHandles) {  // S10
  constexpr int kThreads = 16;
  constexpr int kRounds = 200;
  std::vector<std::shared_ptr<Store>> own;
  for (int t = 0; t < kThreads; ++t) own.push_back(another());
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    // Even threads share store_, odd ones have a handle each.
    Store& s = t % 2 == 0 ? *store_ : *own[t];
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        std::string key = "mix/" + std::to_string(t);
        s.setString(key, std::to_string(i));
        s.add("mix/count", 1);
        if (s.getString(key) != std::to_string(i)) wrong.fetch_add(1);  // reads its own write
      }
      s.setString("mix/done/" + std::to_string(t), "1");
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  for (auto& handle : own) handle->flush();
  store_->flush();
  auto observer = another();
  EXPECT_EQ(observer->add("mix/count", 0), kThreads * kRounds);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_TRUE(observer->check({"mix/done/" + std::to_string(t)})) << t;
    EXPECT_EQ(observer->getString("mix/" + std::to_string(t)), std::to_string(kRounds - 1));
  }
}

TEST_P(StoreConformance, FlushMakesEarlierSetsVisibleToEveryHandle) {
  auto other = another();
  for (int i = 0; i < 100; ++i) store_->setString("f" + std::to_string(i), std::to_string(i));
  store_->flush();
  // check() does not wait: after flush() the sets are applied, not merely sent.
  EXPECT_TRUE(other->check({"f0", "f50", "f99"}));
  EXPECT_EQ(other->getString("f99"), "99");
}

TEST_P(StoreConformance, CompareSetFollowsC10dSemantics) {
  // Absent key, empty expected: set.
  EXPECT_EQ(toString(store_->compareSet("k", {}, toBytes("v1"))), "v1");
  // Wrong expected: unchanged, current value returned.
  EXPECT_EQ(toString(store_->compareSet("k", toBytes("nope"), toBytes("v2"))), "v1");
  // Right expected: swapped.
  EXPECT_EQ(toString(store_->compareSet("k", toBytes("v1"), toBytes("v2"))), "v2");
  EXPECT_EQ(store_->getString("k"), "v2");
  // Absent key, non-empty expected: expected returned, nothing set.
  EXPECT_EQ(toString(store_->compareSet("absent", toBytes("e"), toBytes("d"))), "e");
  EXPECT_FALSE(store_->check({"absent"}));
}

TEST_P(StoreConformance, WaitAndCheck) {
  EXPECT_FALSE(store_->check({"w1"}));
  store_->set("w1", toBytes("1"));
  EXPECT_TRUE(store_->check({"w1"}));
  EXPECT_FALSE(store_->check({"w1", "w2"}));
  try {
    store_->wait({"w1", "w2"}, Millis(100));
    FAIL() << "wait returned without w2";
  } catch (const TimeoutError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("w2\""), std::string::npos) << what;
    EXPECT_EQ(what.find("w1\""), std::string::npos) << "names a key that exists: " << what;
  }
  store_->set("w2", toBytes("2"));
  store_->wait({"w1", "w2"}, Millis(1000));
}

TEST_P(StoreConformance, ZeroTimeoutIsTheStoresDefaultDeadline) {
  // Note [Zero timeouts]: wait(keys, 0) waits the store's timeout(), as Work::wait(0) waits the
  // collective's: neither "check now" nor "for ever". check() is how to look without waiting.
  store_->setTimeout(Millis(400));
  auto other = another();
  std::thread setter([&] {
    std::this_thread::sleep_for(Millis(50));
    other->set("zero/late", toBytes("x"));
  });
  EXPECT_NO_THROW(store_->wait({"zero/late"}, Millis(0))) << "a zero wait did not wait";
  setter.join();
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(store_->wait({"zero/never"}, Millis(0)), TimeoutError);
  EXPECT_GE(std::chrono::steady_clock::now() - start, Millis(350));
  EXPECT_THROW(store_->wait({"zero/never"}, Millis(-1)), InvalidArgument);
  EXPECT_THROW(store_->setTimeout(Millis(-5)), InvalidArgument);
  store_->setTimeout(Millis(0));
  EXPECT_EQ(store_->timeout(), kDefaultStoreTimeout) << "setTimeout(0) restores the default";
}

TEST_P(StoreConformance, WaitTimeoutLeavesTheStoreUsable) {
  EXPECT_THROW(store_->wait({"nothing"}, Millis(50)), TimeoutError);
  store_->set("after", toBytes("ok"));
  EXPECT_EQ(store_->getString("after"), "ok");
}

TEST_P(StoreConformance, DeleteAndNumKeys) {
  int64_t before = store_->numKeys();
  store_->set("d1", toBytes("1"));
  store_->set("d2", toBytes("2"));
  EXPECT_EQ(store_->numKeys(), before + 2);
  EXPECT_TRUE(store_->deleteKey("d1"));
  EXPECT_FALSE(store_->deleteKey("d1"));
  EXPECT_EQ(store_->numKeys(), before + 1);
  EXPECT_FALSE(store_->check({"d1"}));
}

TEST_P(StoreConformance, AddOnANonCounterIsRefused) {
  store_->set("text", toBytes("hello"));
  EXPECT_THROW(store_->add("text", 1), Error);
  // The store still answers afterwards.
  EXPECT_EQ(store_->getString("text"), "hello");
}

TEST_P(StoreConformance, PrefixStoresAreDisjoint) {
  auto inner = store_;
  PrefixStore r0(roundPrefix(0), inner);
  PrefixStore r1(roundPrefix(1), inner);
  r0.set("k", toBytes("zero"));
  r1.set("k", toBytes("one"));
  EXPECT_EQ(r0.getString("k"), "zero");
  EXPECT_EQ(r1.getString("k"), "one");
  EXPECT_EQ(inner->getString("round0/k"), "zero");
  EXPECT_FALSE(r1.check({"only0"}));
  r0.set("only0", {});
  EXPECT_FALSE(r1.check({"only0"}));
  EXPECT_TRUE(r0.check({"only0"}));
}

TEST_P(StoreConformance, TryMultiGetReadsWhatIsThereNowInOrder) {
  store_->setString("m/a", "1");
  store_->set("m/empty", {});
  store_->add("m/c", 3);
  auto other = another();
  other->flush();
  auto values = other->tryMultiGet({"m/c", "m/missing", "m/a", "m/empty", "m/a"});
  ASSERT_EQ(values.size(), 5u);
  EXPECT_EQ(toString(*values[0]), "3");
  EXPECT_FALSE(values[1].has_value());
  EXPECT_EQ(toString(*values[2]), "1");
  ASSERT_TRUE(values[3].has_value()) << "an empty value exists";
  EXPECT_TRUE(values[3]->empty());
  EXPECT_EQ(toString(*values[4]), "1");
  EXPECT_TRUE(other->tryMultiGet({}).empty());
  // Never waits, whatever the store's timeout.
  store_->setTimeout(Millis(60000));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(store_->tryMultiGet({"m/never"})[0].has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST_P(StoreConformance, WaitChangedWakesOnTheNextWriteOfACounter) {
  EXPECT_EQ(store_->add("w/count", 1), 1);
  // Already other than seen: at once.
  EXPECT_EQ(toString(store_->waitChanged("w/count", toBytes("0"), Millis(100))), "1");
  auto other = another();
  std::thread adder([&] {
    std::this_thread::sleep_for(Millis(50));
    other->add("w/count", 1);
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(toString(store_->waitChanged("w/count", toBytes("1"), Millis(10000))), "2");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  adder.join();
  // A key that does not exist yet: its first value is a change.
  std::thread setter([&] {
    std::this_thread::sleep_for(Millis(50));
    other->setString("w/state", "3 run");
    other->flush();
  });
  EXPECT_EQ(toString(store_->waitChanged("w/state", {}, Millis(10000))), "3 run");
  setter.join();
}

TEST_P(StoreConformance, WaitChangedIgnoresAWriteOfTheSameValueAndTimesOutNamingTheKey) {
  store_->setString("w/same", "x");
  auto other = another();
  std::thread setter([&] {
    std::this_thread::sleep_for(Millis(20));
    other->setString("w/same", "x");  // written again, not changed
    other->flush();
  });
  const auto start = std::chrono::steady_clock::now();
  try {
    store_->waitChanged("w/same", toBytes("x"), Millis(300));
    FAIL() << "waitChanged returned for a value that did not change";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("w/same\""), std::string::npos) << e.what();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, Millis(290));
  setter.join();
  // The store stays usable after the timeout.
  other->setString("w/same", "y");
  other->flush();
  EXPECT_EQ(toString(store_->waitChanged("w/same", toBytes("x"), Millis(1000))), "y");
  EXPECT_THROW(store_->waitChanged("w/same", toBytes("y"), Millis(-1)), InvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreConformance,
                         ::testing::ValuesIn(testing::allStoreFactories()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace dtrain::store::store_conformance_test
