#include "collective_queue.h"

#include <pthread.h>

#include "dtrain/error.h"
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

QueuedWork::QueuedWork(std::weak_ptr<CollectiveQueue> queue, std::function<std::string()> describe)
    : queue_(std::move(queue)), describe_(std::move(describe)) {}

void QueuedWork::complete(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = std::move(error);
    completed_.store(true, std::memory_order_release);
  }
  done_.notify_all();
}

void QueuedWork::wait(Millis timeout) {
  if (!isCompleted()) {
    if (auto queue = queue_.lock()) queue->tryRunInline(this);
  }
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout > Millis::zero()) {
    if (!done_.wait_for(lock, timeout, [&] { return completed_.load(); })) {
      lock.unlock();
      DTRAIN_THROW(TimeoutError, "{}: not completed after {} ms of wait() (the collective keeps "
                   "running; it fails by itself at the collective timeout)",
                   describe_ ? describe_() : std::string("collective"), timeout.count());
    }
  } else {
    done_.wait(lock, [&] { return completed_.load(); });
  }
  if (error_) std::rethrow_exception(error_);
}

std::shared_ptr<CollectiveQueue> CollectiveQueue::start(const std::string& threadName) {
  std::shared_ptr<CollectiveQueue> queue(new CollectiveQueue());
  queue->threadName_ = threadName.substr(0, 15);
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
                                                     bool wake) {
  auto work = std::make_shared<QueuedWork>(weak_from_this(), std::move(describe));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    DTRAIN_CHECK(!stopping_, "the communicator's queue is stopped");
    pending_.push_back(Item{work, std::move(task)});
  }
  if (wake) changed_.notify_all();
  return work;
}

void CollectiveQueue::runItem(Item& item) {
  SigpipeGuard sigpipe;  // a collective may write to a socket whose peer died: EPIPE, not death
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
  {
    std::lock_guard<std::mutex> lock(mutex_);
    busy_ = false;
  }
  changed_.notify_all();
  return true;
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
  changed_.wait(lock, [&] { return pending_.empty() && !busy_; });
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

size_t CollectiveQueue::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pending_.size() + (busy_ ? 1 : 0);
}

}  // namespace dtrain::comm
