#pragma once
// CollectiveQueue: runs a CPU backend's collectives one at a time, in issue order, on one comm
// thread, and hands each caller a QueuedWork to wait on. One thread, not a pool: collectives must
// run in the same order on every rank anyway, and on a small machine every extra thread competes
// with the ranks for cores (see Note [Inline execution]).
//
// "On the comm thread" below means "while holding the executor role": the comm thread, or a
// caller that waits on work nobody has started yet (Note [Inline execution]).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "dtrain/comm/communicator.h"

namespace dtrain::comm {

class CollectiveQueue;

// A collective waiting for, or running in, a CollectiveQueue.
class QueuedWork final : public Work {
 public:
  // `describe` is called only for error messages (a wait() that times out). `budget`: how long
  // the collective may run, by its own deadline (defaultWaitBudget() of its timeout).
  QueuedWork(std::weak_ptr<CollectiveQueue> queue, std::function<std::string()> describe,
             Millis budget);

  bool isCompleted() override { return completed_.load(std::memory_order_acquire); }
  // A timeout that passes throws TimeoutError and leaves the collective running. Zero: the
  // default deadline, see Note [The default deadline of a queued collective].
  void wait(Millis timeout = Millis::zero()) override;

  // By the executor: the collective finished (`error` null) or failed.
  void complete(std::exception_ptr error);
  Millis budget() const { return budget_; }

 private:
  std::weak_ptr<CollectiveQueue> queue_;
  std::function<std::string()> describe_;
  const Millis budget_;
  std::atomic<bool> completed_{false};
  std::mutex mutex_;
  std::condition_variable done_;
  std::exception_ptr error_;  // guarded by mutex_; set before completed_
};

class CollectiveQueue : public std::enable_shared_from_this<CollectiveQueue> {
 public:
  using Task = std::function<void()>;  // runs one collective; throws its error

  // Starts the comm thread, named `threadName` (at most 15 characters are kept). `guardSigpipe`:
  // a caller that runs a task inline blocks SIGPIPE meanwhile (sigpipe_guard.h); false for
  // backends that write to no socket, which then save two system calls per collective.
  static std::shared_ptr<CollectiveQueue> start(const std::string& threadName,
                                                bool guardSigpipe = true);
  ~CollectiveQueue();

  // Queues `task`; the returned work completes when it has run. `budget`: how long the task may
  // run by its own deadline (the default deadline of a wait() on it). `wake` false: the caller
  // waits on the work at once and will run it itself (Note [Inline execution]); the comm thread is
  // not woken for it, though it still runs it if it is busy with earlier work anyway.
  std::shared_ptr<QueuedWork> enqueue(Task task, std::function<std::string()> describe,
                                      Millis budget, bool wake = true);

  // Runs `work`'s task on the calling thread when it is next in line and nothing is running.
  // Returns true when it ran it. See Note [Inline execution].
  bool tryRunInline(const QueuedWork* work);

  // Blocks until everything queued so far has run.
  void drain();
  // Runs what is queued, then stops the comm thread. Idempotent; not from the comm thread.
  void stop();

  // True on the thread that currently holds the executor role.
  bool onCommThread() const { return executor_.load() == std::this_thread::get_id(); }
  size_t pending() const;
  // When the task running now (or the last one) must end by its own deadline: its start plus its
  // budget. See Note [The default deadline of a queued collective].
  std::chrono::steady_clock::time_point progressDeadline() const;

 private:
  struct Item {
    std::shared_ptr<QueuedWork> work;
    Task task;
  };

  CollectiveQueue() = default;
  void threadMain();
  // Runs one item as the executor; mutex_ is not held.
  void runItem(Item& item);
  // True on the queue's own thread (which blocks SIGPIPE for its whole life).
  bool onCommThreadOfItsOwn() const;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Item> pending_;  // guarded by mutex_
  bool busy_ = false;         // guarded by mutex_: an item is running
  bool stopping_ = false;     // guarded by mutex_
  int draining_ = 0;          // guarded by mutex_: threads in drain()
  bool guardSigpipe_ = true;
  std::atomic<std::thread::id> executor_{};
  std::atomic<std::chrono::steady_clock::rep> progressDeadline_{0};  // time_since_epoch ticks
  std::thread thread_;
  std::string threadName_;
};

}  // namespace dtrain::comm
