#include "collective_queue.h"

#include <pthread.h>

#include <algorithm>
#include <optional>

#include "dtrain/base/error.h"
#include "sigpipe_guard.h"

namespace dtrain::comm {

// Note [Inline execution]
// A synchronous collective is an async call followed at once by wait(). Handing it to the comm
// thread costs two thread wake-ups (caller -> comm thread -> caller), tens of microseconds each on
// a busy 2-core machine: more than a 4 KiB allreduce over loopback takes. So wait() first tries to
// run the work itself: when the work is next in line and no collective is running, the waiting
// thread takes the executor role and runs it. Order is preserved (it is the head of the queue,
// everything before it has finished) and at most one collective runs at a time. The comm thread
// still runs everything nobody waits for (DDP's buckets during backward).
//
// A synchronous call (CallOptions::synchronous) does not even wake the comm thread: on a loaded
// 2-core machine that spare wake-up was measured to push whole runs of 64 KiB-1 MiB allreduces
// into 4 ms scheduler-tick steps (the woken thread preempts a rank mid-collective). The comm
// thread, if it is busy with earlier async work, still picks the item up when it gets there.

// Note [The default deadline of a queued collective]
// wait() with a zero timeout waits "the default deadline" (Note [Zero timeouts]): as long as the
// collective may take by its own deadline, its budget (collective timeout + failure report grace,
// defaultWaitBudget()) from the moment it starts. Until it starts, it waits behind earlier
// collectives, each bound by its own budget, so the time in line does not count against it: the
// wait gives up only when the queue stops making progress, i.e. at the later of (wait() called +
// budget) and (the running collective's start + its budget). Every collective ends by itself
// within its budget, so reaching that point means the backend is stuck past its own deadline: the
// wait throws TimeoutError (the collective keeps running) instead of blocking for ever.

QueuedWork::QueuedWork(std::weak_ptr<CollectiveQueue> queue, std::function<std::string()> describe,
                       Millis budget)
    : queue_(std::move(queue)), describe_(std::move(describe)), budget_(budget) {}

void QueuedWork::complete(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = std::move(error);
    completed_.store(true, std::memory_order_release);
  }
  done_.notify_all();
}

void QueuedWork::wait(Millis timeout) {
  DTRAIN_CHECK_ARG(timeout >= Millis::zero(), "Work::wait: negative timeout {} ms",
                   timeout.count());
  if (!isCompleted()) {
    if (auto queue = queue_.lock()) queue->tryRunInline(this);
  }
  const auto done = [&] { return completed_.load(); };
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout > Millis::zero()) {
    if (!done_.wait_for(lock, timeout, done)) {
      lock.unlock();
      DTRAIN_THROW(TimeoutError,
                   "{}: not completed after {} ms of wait() (the collective keeps "
                   "running; it fails by itself at the collective timeout)",
                   describe_ ? describe_() : std::string("collective"), timeout.count());
    }
  } else {
    // See Note [The default deadline of a queued collective].
    auto deadline = [&] {
      auto own = start + budget_;
      auto queue = queue_.lock();
      return queue ? std::max(own, queue->progressDeadline()) : own;
    };
    while (!done_.wait_until(lock, deadline(), done)) {
      if (std::chrono::steady_clock::now() < deadline()) continue;  // the queue moved on
      lock.unlock();
      DTRAIN_THROW(TimeoutError,
                   "{}: not completed within the default deadline of wait() ({} ms "
                   "after it or the collective before it started): the communicator is stuck "
                   "past the collective's own timeout (the collective keeps running). HINT: "
                   "a rank stuck outside the communicator, or a backend bug; DTRAIN_VERBOSE=2 "
                   "shows the collectives",
                   describe_ ? describe_() : std::string("collective"), budget_.count());
    }
  }
  if (error_) std::rethrow_exception(error_);
}

std::shared_ptr<CollectiveQueue> CollectiveQueue::start(const std::string& threadName,
                                                        bool guardSigpipe) {
  std::shared_ptr<CollectiveQueue> queue(new CollectiveQueue());
  queue->threadName_ = threadName.substr(0, 15);
  queue->guardSigpipe_ = guardSigpipe;
  queue->thread_ = std::thread([q = queue.get()] { q->threadMain(); });
  return queue;
}

CollectiveQueue::~CollectiveQueue() {
  try {
    stop();
  } catch (...) {
    // Destructors do not throw; stop() only fails when called from the comm thread itself.
  }
}

std::shared_ptr<QueuedWork> CollectiveQueue::enqueue(Task task,
                                                     std::function<std::string()> describe,
                                                     Millis budget, bool wake) {
  auto work = std::make_shared<QueuedWork>(weak_from_this(), std::move(describe), budget);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    DTRAIN_CHECK(!stopping_, "the communicator's queue is stopped");
    pending_.push_back(Item{work, std::move(task)});
  }
  if (wake) changed_.notify_all();
  return work;
}

void CollectiveQueue::runItem(Item& item) {
  // A collective may write to a socket whose peer died: EPIPE, not death. The comm thread blocks
  // SIGPIPE for good; a caller running the item inline, only meanwhile.
  std::optional<SigpipeGuard> sigpipe;
  if (guardSigpipe_ && !onCommThreadOfItsOwn()) sigpipe.emplace();
  progressDeadline_.store(
      (std::chrono::steady_clock::now() + item.work->budget()).time_since_epoch().count());
  executor_.store(std::this_thread::get_id());
  std::exception_ptr error;
  try {
    item.task();
  } catch (...) {
    error = std::current_exception();
  }
  executor_.store(std::thread::id());
  item.work->complete(std::move(error));
}

bool CollectiveQueue::tryRunInline(const QueuedWork* work) {
  Item item;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (busy_ || pending_.empty() || pending_.front().work.get() != work) return false;
    item = std::move(pending_.front());
    pending_.pop_front();
    busy_ = true;
  }
  runItem(item);
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    busy_ = false;
    // Only someone waiting for the executor role: the comm thread with work behind this item or
    // told to stop, or a drain(). Waking the idle comm thread after every synchronous call would
    // cost a scheduler wake-up per call (Note [Inline execution]).
    wake = !pending_.empty() || stopping_ || draining_ > 0;
  }
  if (wake) changed_.notify_all();
  return true;
}

bool CollectiveQueue::onCommThreadOfItsOwn() const {
  return std::this_thread::get_id() == thread_.get_id();
}

void CollectiveQueue::threadMain() {
  pthread_setname_np(pthread_self(), threadName_.c_str());
  blockSigpipeOnThisThread();
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return (!busy_ && !pending_.empty()) || (stopping_ && !busy_); });
    if (pending_.empty()) return;  // stopping, and everything has run
    Item item = std::move(pending_.front());
    pending_.pop_front();
    busy_ = true;
    lock.unlock();
    runItem(item);
    lock.lock();
    busy_ = false;
    changed_.notify_all();
  }
}

void CollectiveQueue::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  ++draining_;
  changed_.wait(lock, [&] { return pending_.empty() && !busy_; });
  --draining_;
}

void CollectiveQueue::stop() {
  DTRAIN_CHECK(!onCommThread(), "CollectiveQueue::stop() called from its own comm thread");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::chrono::steady_clock::time_point CollectiveQueue::progressDeadline() const {
  return std::chrono::steady_clock::time_point(
      std::chrono::steady_clock::duration(progressDeadline_.load()));
}

size_t CollectiveQueue::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pending_.size() + (busy_ ? 1 : 0);
}

}  // namespace dtrain::comm
