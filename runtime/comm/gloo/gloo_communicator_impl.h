#pragma once
// GlooCommunicator: the Communicator over a GlooMesh. Callers' threads only describe and queue
// collectives; the executor (the comm thread, see Note [Inline execution]) runs them in issue
// order, applies injected faults, runs the optional collective check, and turns the first failure
// into the communicator's permanent error after comparing notes with the other ranks
// (failure_report.h).

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collective.h"
#include "collective_queue.h"
#include "dtrain/comm/gloo_communicator.h"
#include "flight_recorder.h"
#include "gloo_algorithms.h"
#include "gloo_mesh.h"
#include "host_buffer_pool.h"

namespace dtrain::comm {

class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(const GlooOptions& options);
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backendName() const override { return "gloo"; }

  std::shared_ptr<Work> allreduceAsync(void* data, size_t count, DataType dtype, ReduceOp op,
                                       const CallOptions& options) override;
  std::shared_ptr<Work> broadcastAsync(void* data, size_t count, DataType dtype, int root,
                                       const CallOptions& options) override;
  std::shared_ptr<Work> allgatherAsync(const void* send, void* recv, size_t count, DataType dtype,
                                       const CallOptions& options) override;
  std::shared_ptr<Work> reduceScatterAsync(const void* send, void* recv, size_t count,
                                           DataType dtype, ReduceOp op,
                                           const CallOptions& options) override;
  std::shared_ptr<Work> barrierAsync(const CallOptions& options) override;
  std::shared_ptr<Buffer> allocate(size_t bytes) override;
  void shutdown() override;

  std::exception_ptr error() const override;
  uint64_t sequenceNumber() const override { return nextSeq_.load(); }
  std::string describe() const override;

 protected:
  std::optional<GroupContext> groupContext() const override;
  std::shared_ptr<Communicator> createGroup(const GroupSpec& spec) override;

 private:
  // Runs one collective; `info` is what the caller asked for (a fault may change its count).
  using Body = std::function<void(const GlooCall& call, const CollectiveInfo& info)>;

  std::shared_ptr<Work> submit(CollectiveInfo info, const CallOptions& options, Body body);
  void runOnCommThread(const CollectiveInfo& info, Millis timeout, const Body& body);
  void checkCollectiveOnCommThread(const CollectiveInfo& info, const GlooCall& call);
  [[noreturn]] void hangOnCommThread(const CollectiveInfo& info, const fault::Fault& fault);
  [[noreturn]] void failOnCommThread(const CollectiveInfo& info, Millis timeout,
                                     std::exception_ptr cause);
  // What went wrong, in words naming the peer; sets `timedOut`.
  std::string explainOnCommThread(std::exception_ptr cause, Millis timeout, bool& timedOut);
  const fault::Fault* faultAt(fault::Kind kind, uint64_t seq) const;
  void throwIfUnusable() const;
  std::string who() const;  // "rank 1/4"

  const GlooOptions options_;  // what the constructor was given: subgroups start from it
  const int rank_;
  const int size_;
  const std::string name_;
  const std::shared_ptr<store::Store> store_;
  const Millis timeout_;
  const size_t smallAllreduceBytes_;
  const size_t ringSegmentBytes_;
  const size_t directChunkBytes_;
  const bool twoRankExchange_;
  bool checkCollectives_ = false;    // agreed at construction (rank 0's value)
  std::vector<fault::Fault> faults_;
  int attempt_ = 0;                  // DTRAIN_RESTART_COUNT, for faults' attempt= condition
  std::string address_;              // the address this rank binds

  std::unique_ptr<GlooMesh> mesh_;  // comm thread only, except abort() in shutdown()
  Scratch scratch_;                 // comm thread only
  FlightRecorder recorder_;
  std::shared_ptr<HostBufferPool> pool_;
  std::shared_ptr<CollectiveQueue> queue_;

  std::mutex issueMutex_;              // makes sequence numbers follow queue order
  std::atomic<uint64_t> nextSeq_{0};   // written under issueMutex_

  mutable std::mutex stateMutex_;
  std::condition_variable stateChanged_;  // with stateMutex_: wakes an injected hang
  std::exception_ptr error_;              // guarded by stateMutex_: the first error
  bool closing_ = false;                  // guarded by stateMutex_: shutdown() has begun

  // Last member, so it is gone before anything the publisher thread reads (dtrain/base/progress.h).
  progress::Registration progress_;
};

}  // namespace dtrain::comm
