#pragma once
// GlooCommunicator: the Communicator over a GlooMesh. A QueuedCommunicator: callers' threads only
// describe and queue collectives; the executor (the comm thread, see Note [Inline execution])
// runs them in issue order, with the optional collective check first, and turns the first
// failure into the communicator's permanent error after comparing notes with the other ranks
// (failure_report.h, Note [Failing once]).

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collective.h"
#include "dtrain/comm/gloo_communicator.h"
#include "gloo_algorithms.h"
#include "gloo_mesh.h"
#include "host_buffer_pool.h"
#include "queued_communicator.h"

namespace dtrain::comm {

class GlooCommunicator final : public QueuedCommunicator {
 public:
  explicit GlooCommunicator(const GlooOptions& options);
  ~GlooCommunicator() override;

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
  BufferStats bufferStats() const override;
  void resetBufferPeak() override;
  void trimBuffers() override;
  void shutdown() override;
  void abort(const std::string& reason) override;

  std::string describe() const override;

 protected:
  std::optional<GroupContext> groupContext() const override;
  std::shared_ptr<Communicator> createGroup(const GroupSpec& spec) override;
  std::string shutDownMessage() const override;

 private:
  // Runs one collective over `call`; `info` is what runs (a fault may change its count).
  using GlooBody = std::function<void(const GlooCall& call, const CollectiveInfo& info)>;

  // Queues `body`; on the executor it gets its GlooCall, after the collective check if it is on.
  std::shared_ptr<Work> submit(CollectiveInfo info, const CallOptions& options, GlooBody body);
  void checkCollectiveOnCommThread(const CollectiveInfo& info, const GlooCall& call);
  [[noreturn]] void failOnCommThread(const CollectiveInfo& info, Millis timeout,
                                     std::exception_ptr cause) override;
  // What went wrong, in words naming the peer; sets `timedOut`.
  std::string explainOnCommThread(std::exception_ptr cause, Millis timeout, bool& timedOut);

  const GlooOptions options_;  // what the constructor was given: subgroups start from it
  const size_t smallAllreduceBytes_;
  const size_t ringSegmentBytes_;
  const size_t directChunkBytes_;
  const bool twoRankExchange_;
  bool checkCollectives_ = false;  // agreed at construction (rank 0's value)
  std::string address_;            // the address this rank binds

  // Used by the executor; set by the constructor, reset by shutdown() under meshMutex_, which
  // abort() holds to interrupt it from another thread.
  std::unique_ptr<GlooMesh> mesh_;
  std::mutex meshMutex_;
  Scratch scratch_;  // comm thread only
  std::shared_ptr<HostBufferPool> pool_;
};

}  // namespace dtrain::comm
