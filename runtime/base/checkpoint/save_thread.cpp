// The thread each checkpoint save runs on, waited for with a deadline (Note [Bounded saves]), and
// the one decision between its writer and its waiter (Note [Abandoned saves]); the scheduling
// class background saves write in. Declared in checkpoint/file_io.h.
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "checkpoint/file_io.h"
#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"

// Note [Bounded saves]
// write() and fsync() on a dying disk or a hung network filesystem can block for minutes or for
// ever, in the kernel, where no timeout reaches. So every save runs on a thread of its own and
// the caller waits with a deadline: past it, wait() throws a TimeoutError that says which phase
// the save is in and how many bytes it wrote, and training (or the program's error handling)
// goes on. The stuck thread cannot be cancelled; it owns everything it touches (shared_ptrs), so
// it may outlive the Checkpointer, which detaches it rather than hang in its destructor.

// Note [Abandoned saves]
// A waiter that gives up on a save (SaveThread::wait() past its timeout) reports it failed, and
// its caller goes on: every rank is told the checkpoint of that step failed, and training changes
// the tensors a synchronous save writes straight from. Were the stuck save to commit once the
// disk came back, `step-N` would appear and LATEST move for a save reported failed, from a file
// that may mix the step's bytes with later ones (with checksums that pass, when the stall came
// before the hashing). So the save's fate is decided once, by whichever comes first, with one
// compare-and-swap on its SaveProgress: the writer, right before the rename that commits
// (beginCommit()), or the waiter, at its deadline and before it reports anything (abandon()).
// An abandoned save never renames: when its write ends it fails as abandoned and removes its
// temporary, so `step-N` never appears and LATEST stays where it was. A writer that began
// committing first had written, hashed and fsynced its whole file before the waiter gave up --
// before training could change a byte of it -- so when its rename or LATEST's update is what
// hangs, the step may still appear later, complete and consistent; the waiter's error says so.
// Asynchronous saves write from a snapshot, and are abandoned the same way: a save reported
// failed does not commit. No save starts while an abandoned one still runs (its buffer is not
// free); the one after it finds it ended.

namespace dtrain::checkpoint {

bool lowerThisThreadsPriority(int increment) {
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  errno = 0;
  const int current = ::getpriority(PRIO_PROCESS, tid);
  if (errno != 0) return false;
  return ::setpriority(PRIO_PROCESS, tid, std::min(current + increment, 19)) == 0;
}

bool moveThisThreadToIdleClass() {
  sched_param none{};
  // pid 0: the calling thread, whatever the other threads of the process run at.
  return ::sched_setscheduler(0, SCHED_IDLE, &none) == 0;
}

bool SaveProgress::beginCommit() {
  Commit open = Commit::Open;
  return commit_.compare_exchange_strong(open, Commit::Committing) || open == Commit::Committing;
}

bool SaveProgress::abandon() {
  Commit open = Commit::Open;
  return commit_.compare_exchange_strong(open, Commit::Abandoned) || open == Commit::Abandoned;
}

struct SaveThread::Shared {
  std::mutex mutex;
  std::condition_variable done;
  bool finished = true;   // the job ended (its error is set)
  bool collected = true;  // wait() handed the job's outcome over
  bool exited = true;     // `after` ran too: the thread is about to end
  std::exception_ptr error;
  std::string what;
  SaveProgress progress;
};

SaveThread::~SaveThread() {
  if (!thread_.joinable()) return;
  bool exited = false;
  {
    std::unique_lock<std::mutex> lock(shared_->mutex);
    exited = shared_->done.wait_for(lock, std::chrono::seconds(30),
                                    [&] { return shared_->exited; });
  }
  if (exited) {
    thread_.join();
  } else {
    // See Note [Bounded saves].
    DTRAIN_LOG(Warn, "checkpoint: {} is still running ({}); leaving it behind", shared_->what,
               shared_->progress.phase.load());
    thread_.detach();
  }
}

void SaveThread::start(std::string what, std::function<void(SaveProgress&)> job,
                       std::function<void()> after) {
  if (thread_.joinable()) {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    DTRAIN_CHECK(shared_->finished && shared_->collected,
                 "checkpoint: {} started while {} has not been waited for", what, shared_->what);
  }
  if (thread_.joinable()) thread_.join();
  shared_ = std::make_shared<Shared>();
  shared_->finished = false;
  shared_->collected = false;
  shared_->exited = false;
  shared_->what = std::move(what);
  thread_ = std::thread([shared = shared_, job = std::move(job), after = std::move(after)] {
    std::exception_ptr error;
    try {
      job(shared->progress);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(shared->mutex);
      shared->error = error;
      shared->finished = true;
      shared->progress.phase = "done";
      shared->done.notify_all();
    }
    if (after && !error) after();
    std::lock_guard<std::mutex> lock(shared->mutex);
    shared->exited = true;
    shared->done.notify_all();
  });
}

void SaveThread::wait(std::chrono::milliseconds timeout) {
  if (!shared_) return;
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(shared_->mutex);
    if (shared_->collected) return;
    bool finished = shared_->done.wait_for(lock, timeout, [&] { return shared_->finished; });
    if (!finished) {
      // Decided before anyone is told: see Note [Abandoned saves].
      const bool abandoned = shared_->progress.abandon();
      DTRAIN_THROW(TimeoutError,
                   "checkpoint: {} did not finish within {} ms: still {} ({} of {} bytes "
                   "written); {}. HINT: the disk or filesystem under the checkpoint directory is "
                   "hanging or very slow; training can go on, and no save starts until this one "
                   "has ended",
                   shared_->what, timeout.count(), shared_->progress.phase.load(),
                   shared_->progress.bytesWritten.load(), shared_->progress.bytesTotal.load(),
                   abandoned ? "abandoned: it will not be committed, and the checkpoints before "
                               "it stay as they are"
                             : "its file was complete and fsynced before the deadline, so it may "
                               "still be committed");
    }
    shared_->collected = true;
    error = shared_->error;
  }
  if (error) std::rethrow_exception(error);
}

bool SaveThread::settle(std::chrono::milliseconds timeout) {
  if (!thread_.joinable()) return true;
  {
    std::unique_lock<std::mutex> lock(shared_->mutex);
    if (!shared_->done.wait_for(lock, timeout, [&] { return shared_->exited; })) return false;
  }
  thread_.join();
  return true;
}

bool SaveThread::running() const {
  if (!shared_) return false;
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return !shared_->finished;
}

bool SaveThread::idle() const {
  if (!shared_) return true;
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->collected;
}

}  // namespace dtrain::checkpoint
