#pragma once
// ShmCommunicator: the Communicator over an Engine. One class for both shapes of dtrain's
// shared-memory path:
//   - one node: every rank in one segment;
//   - several nodes (hierarchical): a segment per node, plus a Gloo communicator across nodes
//     among the ranks with the same local index ("cross"); see Note [Hierarchical collectives].
// A QueuedCommunicator: callers' threads describe and queue collectives; the executor (comm
// thread, or a caller that waits, see Note [Inline execution]) runs them in issue order. The first
// failure marks this rank failed in the segment, so its node's peers fail at once quoting it, and
// becomes the communicator's permanent error.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collective.h"
#include "dtrain/comm/shm_communicator.h"
#include "host_buffer_pool.h"
#include "queued_communicator.h"
#include "shm_arena.h"
#include "shm_engine.h"

namespace dtrain::comm {

// Where the ranks of a communicator sit: `nodes` nodes of `locals` ranks each.
struct ShmTopology {
  int rank = 0;
  int size = 1;
  int node = 0;
  int nodes = 1;
  int local = 0;
  int locals = 1;
  std::vector<int> rankAt;  // node * locals + local -> rank
  NodeMap map;              // node key by rank (subgroups are placed from it)

  // Requires map.uniform().
  static ShmTopology of(const NodeMap& map, int rank);
  int rankOf(int node, int local) const {
    return rankAt[static_cast<size_t>(node * locals + local)];
  }
};

class ShmCommunicator final : public QueuedCommunicator {
 public:
  struct Config {
    ShmOptions shm;                       // the in-node part (rank and size within the node)
    ShmTopology topology;                 // nodes == 1: shared memory only
    std::shared_ptr<Communicator> cross;  // across nodes; null when nodes == 1
    std::string crossName;                // its store prefix
    std::string name;                     // this communicator's store keys (groups)
    std::shared_ptr<store::Store> store;
    std::string storeHost;
    Millis timeout = kDefaultCollectiveTimeout;
    Millis connectTimeout = kDefaultConnectTimeout;
  };
  explicit ShmCommunicator(Config config);
  ~ShmCommunicator() override;

  const char* backendName() const override { return cross_ ? "shm+gloo" : "shm"; }

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
  // The arena's and the private overflow's together; the arena's freed pieces count as cached.
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
  // Runs one collective, which must end by `deadline`.
  using ShmBody = std::function<void(const CollectiveInfo& info, shm::Clock::time_point deadline)>;

  // Queues `body`; on the executor the engine spins as the call asks (Note [Waiting]).
  std::shared_ptr<Work> submit(CollectiveInfo info, const CallOptions& options, ShmBody body);
  [[noreturn]] void failOnCommThread(const CollectiveInfo& info, Millis timeout,
                                     std::exception_ptr cause) override;
  // The next in-node collective: what the node's ranks compare (Note [Hierarchical collectives]).
  CollectiveInfo local(CollectiveInfo info, size_t count, ReduceOp op) {
    info.seq = cross_ ? localSeq_++ : info.seq;
    info.count = count;
    info.op = op;
    info.shape.clear();
    return info;
  }
  // Time left until `deadline`, for a Gloo step inside a collective.
  // The cross-node step of collective `i`: by the deadline, with its label and check.
  static CallOptions crossCall(shm::Clock::time_point deadline, const CollectiveInfo& i);
  // Leaves this rank's error where its cross-node peers look when they lose the connection to it
  // (failure_report.h), so they can name the root cause.
  void reportToCrossGroup(const std::string& where, const std::string& error);
  // Runs a step of the cross-node Gloo group; its error says which ranks of this communicator the
  // group's rank numbers are.
  void across(const std::function<void()>& step);
  // Note [One tuning per segment], across nodes: compares this node's segment tuning with every
  // other node's over the cross group; throws InvalidArgument naming the first difference.
  void checkTuningAcrossNodes();
  // Scratch memory in the arena (owned: the in-node steps read it in place).
  std::shared_ptr<Buffer> scratchOnCommThread(size_t bytes, int which);

  void hierAllreduce(const CollectiveInfo& info, void* data, shm::Clock::time_point deadline);
  void hierBroadcast(const CollectiveInfo& info, void* data, shm::Clock::time_point deadline);
  void hierAllgather(const CollectiveInfo& info, const void* send, void* recv,
                     shm::Clock::time_point deadline);
  void hierReduceScatter(const CollectiveInfo& info, const void* send, void* recv,
                         shm::Clock::time_point deadline);
  void hierBarrier(const CollectiveInfo& info, shm::Clock::time_point deadline);

  ShmTopology topo_;
  ShmOptions shmOptions_;
  const std::string storeHost_;
  const Millis connectTimeout_;
  std::chrono::microseconds spin_{0};       // synchronous calls (Note [Waiting])
  std::chrono::microseconds asyncSpin_{0};  // calls run while the caller goes on

  std::shared_ptr<shm::Segment> segment_;
  std::unique_ptr<shm::Engine> engine_;  // executor only
  std::shared_ptr<shm::Arena> arena_;
  std::shared_ptr<HostBufferPool> spill_;  // allocate() beyond the arena
  std::shared_ptr<Communicator> cross_;
  const std::string crossName_;
  std::shared_ptr<Buffer> scratch_[2];  // executor only
  uint64_t localSeq_ = 0;               // executor only: in-node collectives (hierarchical)
  std::atomic<bool> warnedSpill_{false};
};

// Builds the CPU communicator for ranks placed by `map` (see createCpuCommunicator()).
std::shared_ptr<Communicator> createCpuCommunicatorFor(const CpuWorldOptions& options,
                                                       const NodeMap& map);

}  // namespace dtrain::comm
