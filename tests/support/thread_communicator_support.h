#pragma once
// Ranks as threads of one test process, for the communicator and the torch tests alike (Gloo's
// tests run ranks the same way): runRanks() runs a function on every rank; makeGlooWorld() makes
// real Gloo communicators over one HashStore; ThreadWorld is the fake -- a comm::Communicator whose
// ranks share memory, for tests that need collectives but are not about a backend.
//
// ThreadWorld: each rank's collectives run in order on the rank's own worker thread, so they
// really overlap with what the rank's main thread does (backward). Reductions add the ranks'
// values in rank order, so every rank gets bit-identical results, as with Gloo's and NCCL's
// allreduce. A slow link can be simulated, and a collective made to fail.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/base/store.h"
#include "dtrain/comm/communicator.h"
#include "dtrain/comm/gloo_communicator.h"
#include "fault.h"

namespace dtrain::testing {

struct ThreadWorldOptions {
  comm::Millis timeout{10000};
  // Added to every collective, plus bytes / bytesPerSecond (0: no bandwidth limit).
  std::chrono::microseconds latency{0};
  double bytesPerSecond = 0;
  // The collective with this sequence number (0-based, per rank) fails on every rank.
  int64_t failAtCollective = -1;
};

class ThreadWorld : public std::enable_shared_from_this<ThreadWorld> {
 public:
  static std::shared_ptr<ThreadWorld> create(int size, ThreadWorldOptions options = {});

  int size() const { return size_; }
  const ThreadWorldOptions& options() const { return options_; }
  // Rank `rank`'s communicator (created on first use, then the same one); its payloadBytes()
  // counts what its collectives sent.
  std::shared_ptr<comm::Communicator> communicator(int rank);
  // Collectives rank `rank` has issued so far.
  int64_t issued(int rank);

  // Runs fn(rank) on one thread per rank and waits for all. When a rank throws, the world is
  // aborted (the other ranks' collectives fail at once instead of timing out) and the first
  // exception is rethrown here.
  void run(const std::function<void(int rank)>& fn);
  void abort(const std::string& why);

  // Internal: the rendezvous of the collectives; see thread_communicator_support.cpp.
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  ThreadWorld(int size, ThreadWorldOptions options);
  int size_;
  ThreadWorldOptions options_;
  std::shared_ptr<Impl> impl_;
};

struct WaitCounts;

// Forwards every call to `inner` and counts how the works it hands out are waited on: through
// wait() or through waitOnStream() (what the torch layer must use, so that on CUDA the stream
// current at wait time is the one ordered after the collective).
class WaitRecordingCommunicator : public comm::Communicator {
 public:
  explicit WaitRecordingCommunicator(std::shared_ptr<comm::Communicator> inner);
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* backendName() const override { return inner_->backendName(); }
  std::shared_ptr<comm::Work> allreduceAsync(void* data, size_t count, comm::DataType dtype,
                                             comm::ReduceOp op,
                                             const comm::CallOptions& options) override;
  std::shared_ptr<comm::Work> broadcastAsync(void* data, size_t count, comm::DataType dtype,
                                             int root, const comm::CallOptions& options) override;
  std::shared_ptr<comm::Work> allgatherAsync(const void* send, void* recv, size_t count,
                                             comm::DataType dtype,
                                             const comm::CallOptions& options) override;
  std::shared_ptr<comm::Work> reduceScatterAsync(const void* send, void* recv, size_t count,
                                                 comm::DataType dtype, comm::ReduceOp op,
                                                 const comm::CallOptions& options) override;
  std::shared_ptr<comm::Work> barrierAsync(const comm::CallOptions& options) override;
  std::shared_ptr<comm::Buffer> allocate(size_t bytes) override { return inner_->allocate(bytes); }
  comm::BufferStats bufferStats() const override { return inner_->bufferStats(); }
  void resetBufferPeak() override { inner_->resetBufferPeak(); }
  void trimBuffers() override { inner_->trimBuffers(); }
  void shutdown() override { inner_->shutdown(); }
  void abort(const std::string& reason) override { inner_->abort(reason); }

  struct Counts {
    int wait = 0;          // Work::wait()
    int waitOnStream = 0;  // Work::waitOnStream()
  };
  Counts counts() const;

 private:
  std::shared_ptr<comm::Work> record(std::shared_ptr<comm::Work> work);
  std::shared_ptr<comm::Communicator> inner_;
  std::shared_ptr<WaitCounts> counts_;
};

// Runs fn(rank) on `size` threads and waits for all; an exception on any rank fails the test
// with that rank's message. Communicators that fn creates inject no faults from DTRAIN_FAULT
// (each thread holds a comm::ScopedCollectiveFaults without any; fn may nest its own).
void runRanks(int size, const std::function<void(int rank)>& fn);

// GlooOptions for thread tests: short timeouts, no collective checks from the environment.
comm::GlooOptions glooTestOptions(
    int rank, int size, std::shared_ptr<store::Store> store,
    std::chrono::milliseconds timeout = std::chrono::milliseconds(5000));

// Creates one Gloo communicator per rank concurrently (creation blocks until all have joined),
// each injecting `faults` (collective_faults.h).
std::vector<std::shared_ptr<comm::Communicator>> makeGlooWorld(
    int size, const std::function<void(comm::GlooOptions&)>& tweak = {},
    const std::vector<fault::Fault>& faults = {});

}  // namespace dtrain::testing
