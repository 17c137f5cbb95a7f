#pragma once
// ProgressPublisher: the thread behind dtrain/base/progress.h. One per process (publisher()), built
// from the environment `launch` sets; tests build their own over a HashStore.

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/base/progress.h"
#include "dtrain/base/store.h"

namespace dtrain::progress {

// Note [Progress publisher]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A stall shows itself as a communicator thread that never returns; whatever reports progress
// must not run on it, nor wait for it. So the publisher is a thread of its own that wakes once a
// second, reads the latest step and figures (plain values under a mutex the callers hold for a
// few instructions) and each registered communicator's sequence number and flight-recorder tail
// (the recorder's own short mutex), and writes the report to the store only when something
// advanced (dtrain::progress::advanced) -- an idle or stuck rank writes nothing. It has its own
// store connection: a TcpStore client runs one request at a time, and the rank's main
// connection may sit in a 300-second wait() (a rendezvous, a barrier) exactly when the report
// matters. Any store error ends publishing for this process with one warning; it never
// disturbs training. At exit the thread is stopped with a short bound and otherwise left
// behind (the process is ending anyway). A thread that stops releases its store connection and
// its OpenSSL state, then says it finished, and stop() joins it: a thread still ending while the
// exit handlers ran (OpenSSL's thread-exit handler against OpenSSL's own cleanup, a connection
// freed beside libtorch's destructors) corrupted the heap of one worker in tens of runs.

struct PublisherOptions {
  int rank = 0;
  int nodeRank = -1;  // GROUP_RANK, so that launch can name the node before it sampled the rank
  // Opens the store connection, on the publisher thread (so a slow connect delays nobody).
  std::function<std::shared_ptr<store::Store>()> connect;
  std::chrono::milliseconds interval{1000};
  size_t tailEntries = 8;  // flight-recorder entries per communicator
  // The trainer records a report carries (Note [Trainer records] in dtrain/base/progress.h).
  size_t recentRecords = kRecentRecords;
  double recentRecordSeconds = kRecentRecordSeconds;
};

class ProgressPublisher {
 public:
  explicit ProgressPublisher(PublisherOptions options);
  ~ProgressPublisher();  // stops the thread (waits for it)
  ProgressPublisher(const ProgressPublisher&) = delete;
  ProgressPublisher& operator=(const ProgressPublisher&) = delete;

  void setStep(int64_t step);
  // A trainer record: its step (when it has one) becomes the step unless the step is already
  // later (a checkpoint write is recorded under the step it saved, steps after it); its fields
  // update the latest figures and it joins the recent records. Fields with an invalid or
  // repeated name are dropped.
  void addRecord(metrics::Record record);
  void setFigures(int64_t step, std::vector<std::pair<std::string, double>> fields);
  uint64_t addSource(std::function<CollectiveState()> source);
  void removeSource(uint64_t id);
  // Publishes now if something advanced; false when not done within `timeout` or publishing is
  // off (no store, or it failed).
  bool flush(std::chrono::milliseconds timeout);
  // Asks the thread to end and waits at most `timeout` for it; true when it ended.
  bool stop(std::chrono::milliseconds timeout);

  // What would be published now.
  RankReport gather();

 private:
  void threadMain();

  const PublisherOptions options_;

  std::mutex mutex_;
  std::condition_variable wake_;                         // with mutex_: a flush request or stop
  std::condition_variable ticked_;                       // with mutex_: one more round done
  std::optional<int64_t> step_;                          // guarded by mutex_
  std::vector<std::pair<std::string, double>> figures_;  // guarded by mutex_
  std::optional<int64_t> figuresStep_;                   // guarded by mutex_
  double figuresTime_ = 0;                               // guarded by mutex_
  std::deque<metrics::Record> recent_;                   // guarded by mutex_
  uint64_t recorded_ = 0;                                // guarded by mutex_: records so far
  bool stopping_ = false;                                // guarded by mutex_
  bool finished_ = false;       // guarded by mutex_: the thread has returned
  uint64_t flushRequests_ = 0;  // guarded by mutex_
  uint64_t rounds_ = 0;         // guarded by mutex_: rounds completed

  std::mutex sourcesMutex_;  // held while a source is called, so removeSource waits for it
  std::map<uint64_t, std::function<CollectiveState()>> sources_;  // guarded by sourcesMutex_
  uint64_t nextSourceId_ = 1;                                     // guarded by sourcesMutex_

  std::thread thread_;
};

// The process's publisher, created on first use: null when this process was not started by
// `launch` (no DTRAIN_STORE_ADDR or RANK), in which case nothing is published.
ProgressPublisher* publisher();

}  // namespace dtrain::progress
