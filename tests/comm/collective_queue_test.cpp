// CollectiveQueue: order, inline execution, wait deadlines, errors.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

#include "collective_queue.h"
#include "dtrain/base/error.h"

namespace dtrain::comm {
namespace {

// The default deadline of a wait(0) on the items below, far beyond what they take.
constexpr Millis kBudget{60000};

// Queues a task, described as `description`, that runs until `release` is set, and returns once
// the comm thread has started it, so that a wait() cannot run it inline.
std::shared_ptr<QueuedWork> startHeldTask(CollectiveQueue& queue, std::atomic<bool>& release,
                                          const std::string& description, Millis budget) {
  std::atomic<bool> started{false};
  auto work = queue.enqueue(
      [&started, &release] {
        started = true;
        while (!release) std::this_thread::sleep_for(Millis(1));
      },
      [description] { return description; }, budget);
  while (!started) std::this_thread::sleep_for(Millis(1));
  return work;
}

TEST(CollectiveQueue, RunsInIssueOrderOneAtATime) {
  auto queue = CollectiveQueue::start("test-queue");
  std::vector<int> order;
  std::atomic<int> running{0};
  std::vector<std::shared_ptr<QueuedWork>> works;
  for (int i = 0; i < 50; ++i) {
    works.push_back(queue->enqueue(
        [&, i] {
          EXPECT_EQ(running.fetch_add(1), 0) << "two collectives ran at once";
          order.push_back(i);
          running.fetch_sub(1);
        },
        {}, kBudget));
  }
  // Waiters on several threads, in reverse: inline execution must still keep the order.
  std::vector<std::thread> waiters;
  for (int i = 49; i >= 0; i -= 7) waiters.emplace_back([&, i] { works[i]->wait(); });
  for (auto& t : waiters) t.join();
  queue->drain();
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[i], i);
}

TEST(CollectiveQueue, WaitRunsUnstartedWorkOnTheCallingThread) {
  auto queue = CollectiveQueue::start("test-queue");
  // Keep the comm thread busy so the next item is certainly not started by it.
  std::atomic<bool> release{false};
  auto blocker = queue->enqueue(
      [&] {
        while (!release) std::this_thread::yield();
      },
      {}, kBudget);
  std::thread::id ranOn;
  auto work = queue->enqueue(
      [&] {
        ranOn = std::this_thread::get_id();
        EXPECT_TRUE(queue->onCommThread());
      },
      {}, kBudget);
  EXPECT_FALSE(queue->tryRunInline(work.get())) << "not next in line while the blocker runs";
  release = true;
  blocker->wait();
  work->wait();
  EXPECT_TRUE(work->isCompleted());
  // Either thread may have run it, but never two at once; when the waiter won, it ran here.
  EXPECT_TRUE(ranOn == std::this_thread::get_id() || ranOn != std::thread::id());
}

TEST(CollectiveQueue, ErrorsReachTheWaiter) {
  auto queue = CollectiveQueue::start("test-queue");
  auto work = queue->enqueue([] { DTRAIN_THROW(NetworkError, "peer gone"); }, {}, kBudget);
  EXPECT_THROW(work->wait(), NetworkError);
  EXPECT_TRUE(work->isCompleted());
  EXPECT_THROW(work->wait(), NetworkError) << "waiting again rethrows";
}

TEST(CollectiveQueue, WaitWithATimeoutThrowsAndLeavesTheWorkRunning) {
  auto queue = CollectiveQueue::start("test-queue");
  std::atomic<bool> release{false};
  auto work = startHeldTask(*queue, release, "rank 0/2: seq 3 barrier()", kBudget);
  auto start = std::chrono::steady_clock::now();
  try {
    work->wait(Millis(100));
    ADD_FAILURE() << "wait returned";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0/2: seq 3 barrier(): not completed after 100 ms"),
              std::string::npos)
        << e.what();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, Millis(95));
  release = true;
  work->wait();
}

TEST(CollectiveQueue, WaitWithoutATimeoutKeepsTheDefaultDeadline) {
  // Note [Zero timeouts]: wait() is wait(0), the default deadline, never "for ever". A collective
  // stuck past its own budget (a backend bug) makes the waiter throw instead of hanging it.
  auto queue = CollectiveQueue::start("test-queue");
  std::atomic<bool> release{false};
  auto work = startHeldTask(*queue, release, "rank 1/2: seq 7 allreduce(float32 x 4, sum)",
                            Millis(300));
  auto start = std::chrono::steady_clock::now();
  auto waited = std::async(std::launch::async, [&] {
    try {
      work->wait();
      return std::string("returned");
    } catch (const TimeoutError& e) {
      return std::string(e.what());
    }
  });
  const bool ended = waited.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  release = true;  // lets a wait that has no deadline end too, so the test can finish
  const std::string what = waited.get();
  ASSERT_TRUE(ended) << "wait() without a timeout was still blocked after 5 s";
  EXPECT_NE(what.find("rank 1/2: seq 7 allreduce(float32 x 4, sum): not completed within the "
                      "default deadline of wait() (300 ms"),
            std::string::npos)
      << what;
  EXPECT_GE(std::chrono::steady_clock::now() - start, Millis(290));
  EXPECT_THROW(work->wait(Millis(-1)), InvalidArgument);
}

TEST(CollectiveQueue, TheDefaultDeadlineDoesNotCountTimeInLine) {
  // Two collectives ahead take 200 ms each, within their own 300 ms budgets: the third, waited on
  // from the start, finishes ~400 ms later, past its own 300 ms budget, and that is not a timeout
  // (the queue kept moving). Note [The default deadline of a queued collective].
  auto queue = CollectiveQueue::start("test-queue");
  auto slow = [] { std::this_thread::sleep_for(Millis(200)); };
  auto a = queue->enqueue(slow, {}, Millis(300));
  auto b = queue->enqueue(slow, {}, Millis(300));
  std::atomic<bool> ran{false};
  auto c = queue->enqueue([&] { ran = true; }, {}, Millis(300));
  auto start = std::chrono::steady_clock::now();
  EXPECT_NO_THROW(c->wait());
  EXPECT_TRUE(ran.load());
  EXPECT_GE(std::chrono::steady_clock::now() - start, Millis(350));
  EXPECT_TRUE(a->isCompleted() && b->isCompleted());
}

}  // namespace
}  // namespace dtrain::comm

namespace dtrain::comm {
namespace {

TEST(CollectiveQueue, UnwokenWorkBehindBusyWorkStillRuns) {
  // A synchronous item (wake = false) queued behind async work its waiter cannot steal: the comm
  // thread, busy anyway, runs it after the earlier one.
  auto queue = CollectiveQueue::start("test-queue");
  std::atomic<bool> release{false};
  auto blocker = queue->enqueue(
      [&] {
        while (!release) std::this_thread::sleep_for(Millis(1));
      },
      {}, kBudget);
  std::atomic<bool> ran{false};
  auto sync = queue->enqueue([&] { ran = true; }, {}, kBudget, /*wake=*/false);
  std::thread waiter([&] { sync->wait(); });
  std::this_thread::sleep_for(Millis(20));
  EXPECT_FALSE(ran.load());
  release = true;
  waiter.join();
  EXPECT_TRUE(ran.load());
  EXPECT_TRUE(blocker->isCompleted());
}

TEST(CollectiveQueue, ConcurrentSynchronousCallersBothFinish) {
  // Two threads each queue an unwoken item and wait: one runs its own inline; the other's item
  // is run when the first finishes (by the comm thread, woken then, or by its waiter).
  auto queue = CollectiveQueue::start("test-queue");
  for (int round = 0; round < 200; ++round) {
    std::atomic<int> done{0};
    auto body = [&] {
      auto w = queue->enqueue([&] { done++; }, {}, kBudget, /*wake=*/false);
      w->wait(Millis(5000));
    };
    std::thread a(body), b(body);
    a.join();
    b.join();
    ASSERT_EQ(done.load(), 2) << "round " << round;
  }
}

}  // namespace
}  // namespace dtrain::comm
