#pragma once
// The Gloo backend's algorithms: Gloo's own where they are the best choice (ring allreduce for
// large buffers, broadcast, allgather, barrier) and two of ours built on Gloo's transport where
// latency matters more than the ring's bandwidth (see Note [Direct exchange]). All run on the comm
// thread, one at a time; all take the message tag of the collective (Note [Tags] in
// collective.cpp) and an end-to-end deadline.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include "collective.h"
#include "reduce_kernels.h"

namespace dtrain::comm {

// Reused memory for received data: grown when needed and touched once when grown, so collectives
// never pay first-touch page faults (~14 us per 4 KiB page on a VM).
class Scratch {
 public:
  uint8_t* reserve(size_t bytes);

 private:
  std::unique_ptr<uint8_t[]> data_;
  size_t capacity_ = 0;
};

// Wakes the wait of our algorithms from another thread (abort()): Gloo fails the operations still
// pending on a pair it closes, but not one whose data is moving (Note [Interrupting Gloo]).
class WaitInterrupt {
 public:
  // Registers `buffer` as the one the executor waits on (receive or send) until destroyed; throws
  // GlooInterrupted once interrupt() was called.
  class Waiting {
   public:
    Waiting(WaitInterrupt* owner, gloo::transport::UnboundBuffer& buffer, bool receive);
    ~Waiting();
    Waiting(const Waiting&) = delete;
    Waiting& operator=(const Waiting&) = delete;

   private:
    WaitInterrupt* owner_;
  };
  // Makes the wait registered now return, and every later registration throw. Idempotent.
  void interrupt();

 private:
  std::mutex mutex_;
  gloo::transport::UnboundBuffer* buffer_ = nullptr;  // guarded by mutex_
  bool receive_ = false;                              // guarded by mutex_
  bool interrupted_ = false;                          // guarded by mutex_
};

// Thrown by our algorithms when a wait was interrupted (WaitInterrupt).
class GlooInterrupted : public std::runtime_error {
 public:
  GlooInterrupted() : std::runtime_error("interrupted: the communicator was aborted") {}
};

struct GlooCall {
  std::shared_ptr<gloo::Context> context;
  uint32_t tag = 0;
  std::chrono::milliseconds timeout{0};
  WaitInterrupt* interrupt = nullptr;  // null: waits are not interruptible
};

// Thrown by our algorithms when a wait times out: what was waited for, and from which ranks.
class GlooWaitTimeout : public std::runtime_error {
 public:
  GlooWaitTimeout(std::string action, std::vector<int> ranks)
      : std::runtime_error("timed out " + action),
        action(std::move(action)),
        ranks(std::move(ranks)) {}
  std::string action;  // "waiting for data from", "sending to"
  std::vector<int> ranks;
};

// Every rank sends its whole buffer to every other rank and reduces what it receives in rank
// order: one round trip, identical results on all ranks. Large buffers go in chunks of
// `chunkBytes`, each reduced as soon as it has arrived while the next ones are in flight.
void allreduceDirect(const GlooCall& call, void* data, size_t count, size_t elementSize,
                     ReduceFn reduce, Scratch& scratch, size_t chunkBytes);

// Gloo's ring allreduce (reduce-scatter + allgather, segmented and pipelined).
void allreduceRing(const GlooCall& call, void* data, size_t count, size_t elementSize,
                   ReduceFn reduce, size_t segmentBytes);

// Rank r receives op over every rank's block r: each rank sends block j to rank j and reduces the
// blocks it receives in rank order. Moves (n-1)/n of the input per rank, like a ring.
void reduceScatterDirect(const GlooCall& call, const void* send, void* recv, size_t count,
                         size_t elementSize, ReduceFn reduce, Scratch& scratch);

void broadcastGloo(const GlooCall& call, void* data, size_t bytes, int root);
void allgatherGloo(const GlooCall& call, const void* send, void* recv, size_t bytes);
void barrierGloo(const GlooCall& call);

// Everyone's fingerprint, rank r's at index r (the collective check).
std::vector<Fingerprint> allgatherFingerprints(const GlooCall& call, const Fingerprint& mine);

}  // namespace dtrain::comm
