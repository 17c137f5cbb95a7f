#pragma once
// Communicator: collectives on raw buffers (pointer, count, dtype, op), torch-free. Backends: Gloo
// (CPU, dtrain/comm/gloo_communicator.h), shared memory inside a node and hierarchical across nodes
// (CPU, dtrain/comm/shm_communicator.h) and NCCL (CUDA, dtrain/comm/nccl_communicator.h);
// dtrain/comm/world.h
// has the table of backends. The torch layer wraps a Communicator in dtrain::ProcessGroup
// (dtrain/torch/process_group.h).
//
// Every collective is asynchronous and returns a Work; the non-virtual synchronous forms are the
// async call plus wait(). Collectives run in the order they are issued, on every rank in the same
// order. Once a collective fails, the communicator is failed: every later call fails fast with the
// first error, which names this rank, the peer and the operation. Every wait has a deadline; a zero
// timeout anywhere here means the default one (Note [Zero timeouts] in dtrain/base/timeout.h).

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/base/store.h"

namespace dtrain::comm {

using Millis = std::chrono::milliseconds;

constexpr Millis kDefaultCollectiveTimeout{300000};
// Deadline for all ranks to join when a communicator is created.
constexpr Millis kDefaultConnectTimeout{300000};

enum class DataType : uint8_t { Float32, Float64, Float16, BFloat16, Int32, Int64, UInt8, Int8 };
enum class ReduceOp : uint8_t { Sum, Avg, Max, Min };

size_t elementSize(DataType dtype);
const char* dataTypeName(DataType dtype);
const char* reduceOpName(ReduceOp op);

// A pending collective. wait() rethrows the collective's error; a Work is waited on at most by one
// thread at a time.
class Work {
 public:
  virtual ~Work() = default;
  // True once finished, successfully or not; never blocks. The way to look without waiting.
  virtual bool isCompleted() = 0;
  // Blocks until finished, at most `timeout`; rethrows its error. A timeout that passes throws
  // TimeoutError and leaves the collective running. Zero (the default) is the default deadline,
  // not "no timeout": as long as the collective may take by its own deadline (CallOptions::timeout,
  // else the communicator's, from when it starts, plus the grace in which the ranks compare notes
  // on a failure), so a zero wait ends with the collective's own error, or with TimeoutError only
  // when the backend is stuck past that deadline. Negative: InvalidArgument.
  // On CUDA: returns when the stream given at issue (CallOptions::stream) is ordered after the
  // collective; the host does not wait for the GPU. See waitOnStream().
  virtual void wait(Millis timeout = Millis::zero()) = 0;
  // wait(), ordering `stream` (a cudaStream_t) after the collective instead of the stream given
  // at issue; null: that one. c10d orders the caller's current stream at wait time, and so does
  // the torch layer, through this: DDP writes gradients back from the end-of-backward callback,
  // whose current stream need not be the one a bucket was issued on. CPU backends have no
  // streams: wait(timeout).
  virtual void waitOnStream(void* stream, Millis timeout = Millis::zero()) {
    (void)stream;
    wait(timeout);
  }
};

// Per-call options. Zero/null members mean "the communicator's default" (a zero timeout: the
// communicator's collective timeout; Note [Zero timeouts]).
struct CallOptions {
  // CUDA only: the cudaStream_t the buffers are produced and consumed on. The collective runs on
  // the communicator's own stream, ordered after this one, and this one after it.
  void* stream = nullptr;
  Millis timeout = Millis::zero();
  // Optional: the shape of the tensor behind the buffer. Compared across ranks by the collective
  // check (DTRAIN_CHECK_COLLECTIVES=1) and printed in mismatch and desync reports.
  std::vector<int64_t> shape;
  // Optional: what the caller calls this collective ("unit 3 forward 12 (layers.2)"; the first
  // kMaxLabelBytes bytes count). Part of the collective's identity in every backend: ranks that
  // give different labels never exchange data (Gloo's tags, the shared-memory descriptors), and
  // every report and error names it.
  std::string label;
  static constexpr size_t kMaxLabelBytes = 47;
  // Compare this call across ranks before it runs even when the collective check
  // (DTRAIN_CHECK_COLLECTIVES) is off, so that ranks calling different collectives fail at once,
  // naming both, instead of timing out: what ZeRO-3 sets on every unit gather. The shared-memory
  // backend compares every call anyway; Gloo exchanges one fingerprint more (a round trip of
  // ~150 bytes); NCCL goes through the store.
  bool check = false;
  // The caller waits on the Work right away (the synchronous forms below set it): a CPU backend
  // then runs the collective on the calling thread without waking its comm thread, one thread
  // wake-up less per call (docs/design.md "Communicator").
  bool synchronous = false;
};

// Memory owned by the communicator (see allocate()).
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() = 0;
  virtual size_t bytes() const = 0;
};

// What the memory of Communicator::allocate() holds, for a backend that keeps it: the CPU
// backends keep a released buffer, its pages touched, for the next allocation it fits, until
// trimBuffers() (docs/design.md, "Communication buffers"). Sizes are the buffers' rounded ones.
struct BufferStats {
  size_t inUseBytes = 0;      // handed out and not released yet
  size_t peakInUseBytes = 0;  // the most inUseBytes at once since the last resetBufferPeak()
  size_t cachedBytes = 0;     // released, kept with their pages for reuse: resident, unused
  uint64_t hits = 0;          // allocations served from cached memory
  uint64_t misses = 0;        // allocations that took, and touched, fresh memory
  uint64_t freed = 0;         // cached buffers trimBuffers() gave back to the system
};

// Options of a subgroup (Communicator::split / newGroup). Zero: the parent's value.
struct GroupOptions {
  Millis timeout = Millis::zero();
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backendName() const = 0;  // "gloo", "nccl", ...

  // In place: every rank ends with op over all ranks' `data`. Avg is Sum / size (integer types:
  // truncated).
  virtual std::shared_ptr<Work> allreduceAsync(void* data, size_t count, DataType dtype,
                                               ReduceOp op, const CallOptions& options = {}) = 0;
  // In place: every rank ends with `root`'s `data`.
  virtual std::shared_ptr<Work> broadcastAsync(void* data, size_t count, DataType dtype, int root,
                                               const CallOptions& options = {}) = 0;
  // `recv` holds size() * count elements: rank r's `send` at offset r * count.
  virtual std::shared_ptr<Work> allgatherAsync(const void* send, void* recv, size_t count,
                                               DataType dtype, const CallOptions& options = {}) = 0;
  // `send` holds size() * count elements; rank r receives op over all ranks' block r.
  virtual std::shared_ptr<Work> reduceScatterAsync(const void* send, void* recv, size_t count,
                                                   DataType dtype, ReduceOp op,
                                                   const CallOptions& options = {}) = 0;
  virtual std::shared_ptr<Work> barrierAsync(const CallOptions& options = {}) = 0;

  // Memory for buffers that are communicated again and again (DDP's buckets): reused, and placed
  // where the backend moves it fastest (a segment shared by the ranks of a node, for the
  // shared-memory path). Device memory for a CUDA communicator.
  virtual std::shared_ptr<Buffer> allocate(size_t bytes) = 0;
  // allocate()'s memory now; zeros from a backend that does not count (NCCL's device buffers are
  // freed when released, nothing is cached).
  virtual BufferStats bufferStats() const { return {}; }
  // Starts a new peak: peakInUseBytes := inUseBytes (to measure a step's).
  virtual void resetBufferPeak() {}
  // Gives back to the system the cached buffers released before the previous call and not taken
  // since. For a caller with a cycle (ZeRO calls it once per training step): what every cycle
  // reuses stays touched, what a phase that does not recur left behind goes. The shared-memory
  // arena's pages stay (they are the segment's); its private overflow is trimmed.
  virtual void trimBuffers() {}

  // Finishes pending work and releases connections; later calls fail. Idempotent.
  virtual void shutdown() = 0;

  // Pulls every rank of this communicator that is blocked in it out at once, from outside: what a
  // watcher thread calls when it learns that a node of the job was lost, so that the training
  // thread leaves the collective it can never finish and the survivors form new communicators.
  // Thread-safe: callable from any thread, while other threads wait() or run a synchronous
  // collective and while the comm thread runs one. Every pending collective and every later call
  // fails with MembershipChanged ("<describe()>: membership changed: <reason>"), and error()
  // returns it from then on; it supersedes an earlier failure (whose message it quotes), since
  // the lost node is what the caller acts on. A blocked wait returns within ~100 ms. Idempotent:
  // a second abort keeps the first reason. shutdown() still works afterwards and never hangs;
  // abort never ends the process. It aborts this communicator (for the hierarchical one, both its
  // parts) and nothing else: a subgroup made by split()/newGroup() is a communicator of its own,
  // aborted on its own (abortWithGroups() takes them too). Per backend: docs/design.md
  // "Communicator".
  virtual void abort(const std::string& reason) = 0;
  // abort() of this communicator, then of every group split()/newGroup() made from it that is
  // still referenced, and of theirs, with the same reason: what the membership watcher calls on
  // the world, whose subgroups hold the same ranks -- one of them with a lost peer would
  // otherwise wait out its timeout. Thread-safe as abort().
  void abortWithGroups(const std::string& reason);
  // The first error of this communicator, else of a group made from it (still referenced, theirs
  // too); null while all are healthy. A lost peer may fail a subgroup's collective before anyone
  // aborts the world.
  std::exception_ptr errorWithGroups() const;

  // The first error once the communicator has failed (every later call rethrows it); null while
  // healthy.
  virtual std::exception_ptr error() const { return nullptr; }
  // Collectives issued so far on this rank; the next one gets this sequence number.
  virtual uint64_t sequenceNumber() const { return 0; }
  // Payload bytes this rank has sent in the collectives issued here so far, counted as a
  // bandwidth-optimal algorithm sends them whatever the backend does (nccl-tests' bus bytes):
  // allreduce 2(n-1)/n of its buffer, reduceScatter and allgather (n-1)/n of the whole n x count
  // buffer, broadcast its buffer, barrier nothing. So a reduce-scatter plus an allgather count as
  // much as an allreduce of the same buffer, which is what ZeRO's step is measured against. 0 for
  // a communicator that does not count (docs/design.md "Communicator").
  virtual uint64_t payloadBytes() const { return 0; }
  // The backend's own stream (cudaStream_t) for a CUDA communicator; null for CPU backends.
  virtual void* deviceStream() const { return nullptr; }
  // "gloo rank 1/4 (10.0.0.2)": for logs and messages.
  virtual std::string describe() const;

  void allreduce(void* data, size_t count, DataType dtype, ReduceOp op,
                 const CallOptions& options = {}) {
    allreduceAsync(data, count, dtype, op, synchronous(options))->wait(options.timeout);
  }
  void broadcast(void* data, size_t count, DataType dtype, int root,
                 const CallOptions& options = {}) {
    broadcastAsync(data, count, dtype, root, synchronous(options))->wait(options.timeout);
  }
  void allgather(const void* send, void* recv, size_t count, DataType dtype,
                 const CallOptions& options = {}) {
    allgatherAsync(send, recv, count, dtype, synchronous(options))->wait(options.timeout);
  }
  void reduceScatter(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                     const CallOptions& options = {}) {
    reduceScatterAsync(send, recv, count, dtype, op, synchronous(options))->wait(options.timeout);
  }
  void barrier(const CallOptions& options = {}) {
    barrierAsync(synchronous(options))->wait(options.timeout);
  }

  // Subgroups, as PyTorch's new_group and MPI_Comm_split. Both are collective over this
  // communicator: every rank calls them, in the same order (and in the same order relative to
  // other subgroup creations). The group has the same kind of backend -- a split of a
  // hierarchical communicator is shared memory when its ranks share a node -- and its
  // collectives are independent of this communicator's: they may run at the same time.
  //
  // split(): the ranks that pass the same color >= 0 form one group, ranked by `key` (ties, and
  // key -1, by rank here); a negative color joins no group and gets nullptr.
  std::shared_ptr<Communicator> split(int color, int key = -1, const GroupOptions& options = {});
  // newGroup(): the listed ranks form a group, ranked in ascending order of their rank here;
  // every rank passes the same list (checked: a rank with another list fails on every rank,
  // naming both), and ranks not in it get nullptr.
  std::shared_ptr<Communicator> newGroup(std::vector<int> ranks, const GroupOptions& options = {});

 protected:
  static CallOptions synchronous(const CallOptions& options) {
    CallOptions o = options;
    o.synchronous = true;
    return o;
  }

  // How this communicator's ranks agree on a subgroup; nullopt: the backend has no subgroups.
  struct GroupContext {
    std::shared_ptr<store::Store> store;
    std::string prefix;  // this communicator's store keys; groups go under "<prefix>/group<k>"
    Millis timeout;      // default collective timeout
    Millis connectTimeout;
  };
  virtual std::optional<GroupContext> groupContext() const { return std::nullopt; }

  // One group, after the ranks agreed on it.
  struct GroupSpec {
    std::vector<int> members;  // ranks of this communicator, in the group's rank order
    int rank = 0;              // this rank's place in `members`
    std::string name;          // unique within the job: the group's store keys go under it
    Millis timeout;
    Millis connectTimeout;
  };
  virtual std::shared_ptr<Communicator> createGroup(const GroupSpec& spec);
  // Made by split()/newGroup() of another communicator: a group is not re-formed with its world
  // (an aborted one says so).
  bool isGroup() const { return isGroup_; }

 private:
  std::shared_ptr<Communicator> keepGroup(std::shared_ptr<Communicator> group);
  std::vector<std::shared_ptr<Communicator>> liveGroups() const;

  std::atomic<uint64_t> groupsCreated_{0};
  std::atomic<bool> isGroup_{false};
  mutable std::mutex groupsMutex_;
  std::vector<std::weak_ptr<Communicator>> groups_;  // made by split()/newGroup(), guarded
};

}  // namespace dtrain::comm
