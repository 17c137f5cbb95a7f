#pragma once
// The file side of a checkpoint save, torch-free: every open/write/fsync/rename goes through
// FileOps, which counts them for DTRAIN_IO_FAULT (fault injection: a chosen call fails with a
// chosen errno, or the process is SIGKILLed after the K-th call), and the directory rules of
// Note [Checkpoint directory].
//
// Note [Checkpoint directory]
// Each node writes into its own directory (created with every new component's parent fsynced, so
// that the directory itself survives a power loss). A checkpoint is one file, committed in this
// order:
//   1. write `step-<N>.tmp` (data, manifest, then the header), fsync it;
//   2. rename it to `step-<N>`, fsync the directory;
//   3. write `LATEST.tmp` holding "step-<N>\n", fsync, rename to `LATEST`, fsync the directory;
//   4. only then delete committed checkpoints beyond the newest keepLast (never below 2).
// A crash at any point leaves the newest complete checkpoint and at most one temporary: `step-N`
// exists only once its bytes are durable, and `LATEST` never names a file that is not. A save
// that fails removes what it wrote: the temporary, and `step-N` when the rename created it; a
// `step-N` that the rename replaced (a step saved again, which `LATEST` may name) is complete and
// fsynced, and stays. Readers
// do not trust `LATEST` alone: restore scans every `step-<N>` newest first and takes the first
// that verifies. A failed fsync is a failed save (the page cache may have dropped the data; it is
// never retried and trusted). Temporaries are removed on the next save or restore only when they
// are ours: named exactly `step-<digits>.tmp` or `LATEST.tmp`, regular files, owned by this user,
// and either shorter than the magic (a save that crashed right after creating it) or starting
// with the checkpoint magic. Anything else in the directory is left alone.

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/format.h"
#include "fault.h"

namespace dtrain::checkpoint {

// How far a running save got: read by a waiter to say where a stuck save is. It also decides,
// once, between the save's writer and its waiter, whether the save may still commit
// (Note [Abandoned saves] in save_thread.cpp).
struct SaveProgress {
  std::atomic<uint64_t> bytesWritten{0};
  std::atomic<uint64_t> bytesTotal{0};
  std::atomic<const char*> phase{"idle"};

  // The writer, right before the rename that commits: true when it may go on (the save can no
  // longer be abandoned), false when its waiter abandoned it first.
  bool beginCommit();
  // The waiter, when it gives up on the save: true when the save will never commit (abandoned
  // now or before), false when its writer had begun committing.
  bool abandon();

 private:
  enum class Commit { Open, Committing, Abandoned };
  std::atomic<Commit> commit_{Commit::Open};
};

class FileOps {
 public:
  explicit FileOps(fault::IoFaultInjector injector = fault::IoFaultInjector::fromEnv())
      : injector_(std::move(injector)) {}

  // Each throws CheckpointError naming the path, the operation and errno (EIO, ENOSPC, ...).
  int open(const std::string& path, int flags, mode_t mode = 0644);
  // pwrite() until all is written, in calls of at most kMaxWriteBytes (each counted).
  void writeAt(int fd, const void* data, size_t size, uint64_t offset, const std::string& path,
               SaveProgress* progress = nullptr);
  // Note [Direct writes]: writes `size` bytes at `offset` of `path` through a second descriptor
  // opened with O_DIRECT (`data`, `size` and `offset` multiples of kDirectAlignment), in calls of
  // at most kMaxWriteBytes; the open and each call are counted as open() and writeAt()'s are.
  // `fd` is the file's ordinary descriptor. Returns the bytes written: fewer than `size`, down to
  // 0, where the filesystem refuses O_DIRECT (EINVAL), and the caller writes the rest through
  // `fd`. Any other error throws as writeAt() does.
  uint64_t writeDirectAt(int fd, const void* data, size_t size, uint64_t offset,
                         const std::string& path, SaveProgress* progress = nullptr);
  void fsync(int fd, const std::string& path);
  void rename(const std::string& from, const std::string& to);
  void fsyncDirectory(const std::string& dir);
  // Not counted: closing cannot lose data that fsync has made durable.
  static void close(int fd);

  static constexpr size_t kMaxWriteBytes = size_t{64} << 20;
  // I/O calls so far (what DTRAIN_IO_FAULT=crash@io=K counts).
  int64_t calls() const { return injector_.calls(); }

  struct DirectStats {
    uint64_t bytes = 0;    // written with O_DIRECT
    int64_t refusals = 0;  // opens or writes a filesystem refused (each filesystem once)
  };
  const DirectStats& directStats() const { return direct_; }

 private:
  // Open and write until done, or -- when `refusable` -- until a call fails with EINVAL (then -1
  // and the bytes written so far); throw on any other error.
  int openLoop(const std::string& path, int flags, mode_t mode, bool refusable);
  size_t writeLoop(int fd, const void* data, size_t size, uint64_t offset, const std::string& path,
                   SaveProgress* progress, bool refusable);
  int fail(fault::IoOp op);
  fault::IoFaultInjector injector_;
  DirectStats direct_;
  std::vector<dev_t> refusedDirect_;  // filesystems that refused O_DIRECT: not asked again
};

// Note [Direct writes]: the block size O_DIRECT transfers are aligned to (a multiple of every
// common logical block size, 512 and 4096), and the least a save writes that way.
constexpr uint64_t kDirectAlignment = 4096;
constexpr uint64_t kDirectMinBytes = uint64_t{1} << 20;

// Where a region for writeCheckpointFileFromRegion() should start inside a buffer beginning at
// `buffer`, so that its bulk can be written with O_DIRECT: the first address congruent to the
// file's data offset modulo kDirectAlignment. The buffer needs kDirectAlignment bytes more than
// the region.
uint8_t* directRegionStart(uint8_t* buffer, uint64_t dataOffset);

// The bytes of every entry of `layout`, in host memory, one pointer per entry (nullptr for empty
// entries).
using EntryData = std::vector<const void*>;

// How a write computes the entries' checksums (Note [Hashing beside the write] in file_io.cpp).
enum class Hashing {
  Beside,  // on a second thread while this one writes: the shortest save, for a waiting caller
  Inline,  // first, on this thread: one thread's worth of CPU, for a save in the background
};

// Writes a whole checkpoint file at `path` (created or truncated): the entries' data, then the
// manifest, then the header, and fsyncs it. Fills in the entries' checksums. Small entries are
// gathered into `scratch` (reused between saves) so that the file is written in few large calls.
void writeCheckpointFile(FileOps& ops, const std::string& path, Layout& layout,
                         const EntryData& data, std::vector<uint8_t>& scratch,
                         SaveProgress* progress = nullptr, Hashing hashing = Hashing::Beside);

// Same, when the entries' data lies in one buffer that mirrors the data region: entry i at
// region + (entries[i].offset - header.dataOffset). Written in a few large calls, its bulk with
// O_DIRECT where the region starts at directRegionStart() and the filesystem allows it (Note
// [Direct writes]).
void writeCheckpointFileFromRegion(FileOps& ops, const std::string& path, Layout& layout,
                                   const uint8_t* region, SaveProgress* progress = nullptr,
                                   Hashing hashing = Hashing::Beside);

// "step-00000042".
std::string stepFileName(int64_t step);

struct DirectoryListing {
  std::vector<int64_t> steps;            // committed `step-<N>` files, newest first
  std::vector<std::string> temporaries;  // names of our leftovers (see the Note)
  std::vector<std::string> foreign;      // `*.tmp`-like names that are not ours: left alone
  std::optional<int64_t> latest;         // what LATEST names, when it names a step file
};

// An empty listing when `dir` does not exist; throws CheckpointError when it cannot be read.
DirectoryListing listDirectory(const std::string& dir);

// mkdir -p; each component it creates is made durable by fsyncing its parent (through `ops`).
// Throws CheckpointError naming the component that failed.
void makeDirectories(FileOps& ops, const std::string& dir);

// Commits `step-<N>.tmp` (already written and fsynced) as `step-<N>` and points LATEST at it,
// following the Note's order.
void commitStep(FileOps& ops, const std::string& dir, int64_t step);

// Steps 1-3 of Note [Checkpoint directory]: removes our leftovers, lets `write` create
// `step-<N>.tmp` (complete and fsynced when it returns) and commits it. When anything fails, what
// this save wrote is removed -- the temporary, and `step-<N>` when the rename created it and LATEST
// does not name it yet -- and the error propagates. With `progress`, the save commits only when
// progress->beginCommit() allows it, and otherwise fails as abandoned (Note [Abandoned saves]).
// With `latest` false, LATEST is left alone: a sharded save moves it with pointLatest() only once
// every node holds its shards and their replicas (Note [Sharded checkpoint files]).
void writeAndCommit(FileOps& ops, const std::string& dir, int64_t step,
                    const std::function<void(const std::string& tmpPath)>& write,
                    SaveProgress* progress = nullptr, bool latest = true);

// Step 3 of Note [Checkpoint directory] on its own: LATEST names `step-<N>` (already committed).
void pointLatest(FileOps& ops, const std::string& dir, int64_t step);

// One whole save of Note [Checkpoint directory]: writeAndCommit(), then pruneCheckpoints().
void saveStep(FileOps& ops, const std::string& dir, int64_t step, int keepLast,
              const std::function<void(const std::string& tmpPath)>& write,
              SaveProgress* progress = nullptr);

// Removes our leftovers (Note [Checkpoint directory]); never throws: failures are logged.
void removeTemporaries(const std::string& dir);

// Deletes committed checkpoints older than the newest `keepLast` (at least 2 are kept), never
// `protect`. Never throws: a failed delete is logged and the checkpoint kept.
void pruneCheckpoints(const std::string& dir, int keepLast, int64_t protect);

// Note [Background saves yield]
// An asynchronous save's write runs beside training, which is what it must not slow down. Where
// training keeps the cores busy -- several ranks per node, data loaders, other jobs, or one rank
// whose BLAS calls split each product over every core and wait for the slowest part -- the save
// thread takes its CPU time from the training threads. So that thread moves itself into the idle
// scheduling class (SCHED_IDLE, which needs no privilege): it runs on the CPU time no other
// thread wants (between a step's bursts, while training waits for a collective or for I/O), and a
// training thread that wakes takes the core back at once. Where a core is free it runs as fast as
// before. On a machine that leaves no idle time at all the idle class still gets a sliver (about
// 0.3 % of a core against one busy thread), which could leave a save running until the next one
// waits for it; so once training had to wait for an idle-class save that was still running (the
// next save found it unfinished), that Checkpointer's later asynchronous saves run at nice +10
// instead (a tenth of a default thread's share when they compete), and it says so once. The
// thread is one per save: a class chosen for one save never outlives it. A synchronous save keeps
// the normal priority: training waits for it. Measured in benchmarks/README.md
// (checkpoint_bench --train, "the idle class").
// The hazard of the idle class is a lock it holds while it waits for a core. Its hashing and
// writing take no lock of dtrain's (a log line, on a failure or a fallback, takes the log's); at
// its end it takes two, each for a few instructions: the waiter's flag (a training thread that
// takes it is waiting for this save anyway) and the list finishedWrites() reads. Were it
// preempted inside the latter on a machine without idle time, a training thread asking for
// finishedWrites() at that moment would wait until the idle class got a core again (estimated at
// up to about a second when every core is busy with default-class threads); not seen in any
// measurement, and on such a machine the fallback soon moves later saves to nice +10, whose
// thread gets a core back within a few time slices.
constexpr int kBackgroundNice = 10;

// Raises this thread's nice value by `increment` (at most to 19); Linux threads have their own.
// Returns false (and changes nothing) when the system refuses.
bool lowerThisThreadsPriority(int increment = kBackgroundNice);
// Moves this thread (only) into the idle scheduling class, SCHED_IDLE. Irreversible for an
// unprivileged thread. Returns false (and changes nothing) when the system refuses.
bool moveThisThreadToIdleClass();

// One job at a time on a thread of its own, waited on with a deadline: a checkpoint save must
// never block training for ever (a hung disk or network filesystem). See
// Note [Bounded saves] in save_thread.cpp.
class SaveThread {
 public:
  SaveThread() = default;
  ~SaveThread();
  SaveThread(const SaveThread&) = delete;
  SaveThread& operator=(const SaveThread&) = delete;

  // Starts `job` (the previous one must have been waited for and settled). `what` names it in
  // errors. `after`, when given, runs on the same thread once the job has ended and its waiter
  // has been released: work nobody needs to wait for (pruning old checkpoints). It must not throw.
  void start(std::string what, std::function<void(SaveProgress&)> job,
             std::function<void()> after = nullptr);
  // Waits until the job ends and rethrows its error, or throws TimeoutError after `timeout`,
  // saying how far it got; the job keeps running and a later wait() can collect it. A timeout
  // abandons the job first (SaveProgress::abandon(); Note [Abandoned saves] in save_thread.cpp).
  void wait(std::chrono::milliseconds timeout);
  // Waits up to `timeout` until the thread has finished `after` as well; false when it has not.
  bool settle(std::chrono::milliseconds timeout);
  bool running() const;
  // True when no job was started since the last wait() collected one.
  bool idle() const;

 private:
  struct Shared;
  std::shared_ptr<Shared> shared_;
  std::thread thread_;
};

}  // namespace dtrain::checkpoint
