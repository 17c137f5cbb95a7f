#pragma once
// Engine: the shared-memory collectives themselves, run on the calling thread (the
// communicator's executor) over a Segment. Torch-free and queue-free: ShmCommunicator wraps it in
// Work handles and a permanent error, HierarchicalCommunicator drives it with a Gloo step between
// its reduce-scatter and allgather halves. See Note [Shared-memory collectives].
//
// Failures throw: MembershipChanged when a rank of the segment was aborted, NetworkError when a
// peer died or failed (naming it; once a rank was marked failed or aborted, at every rank's next
// collective entry, Note [A failure is final for the segment]), TimeoutError at the deadline
// (naming the rank waited for and where it is), InvalidArgument when the ranks call different
// collectives, Error when one is ahead or behind (a skipped collective).

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collective.h"
#include "shm_segment.h"
#include "shm_wait.h"

namespace dtrain::comm::shm {

using Clock = std::chrono::steady_clock;

// How this rank waits. What decides the path of a collective is the segment's (Segment::tuning(),
// the same on every rank).
struct EngineOptions {
  std::chrono::microseconds spin{50};
  // Spin with sched_yield() instead of a pause: when the node's ranks outnumber its cores, the
  // peer being waited for may need this very core.
  bool yield = false;
  // Longest single futex sleep: how often a waiting rank looks whether its peers still live.
  std::chrono::microseconds sleepSlice{100000};
  // What messages call each rank of the segment (the communicator's rank numbers when the
  // segment holds one node of several); empty: the segment's own numbers.
  std::vector<int> rankNames;
};

class Engine {
 public:
  Engine(std::shared_ptr<Segment> segment, const EngineOptions& options);
  ~Engine();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::shared_ptr<Segment>& segment() const { return segment_; }

  // Called by the rank that holds this slice of a reduce-scatter, before the others may read it:
  // the hierarchical communicator's cross-node allreduce of the slice, in place.
  using SliceHook = std::function<void(void* slice, size_t count)>;

  // `info` carries the sequence number, kind, type, count, op and root every peer must match.
  // `data` may lie in this rank's arena (communicator-owned): peers then read it in place.
  void allreduce(const CollectiveInfo& info, void* data, Clock::time_point deadline,
                 const SliceHook& hook = nullptr);
  void broadcast(const CollectiveInfo& info, void* data, Clock::time_point deadline);
  void allgather(const CollectiveInfo& info, const void* send, void* recv,
                 Clock::time_point deadline);
  void reduceScatter(const CollectiveInfo& info, const void* send, void* recv,
                     Clock::time_point deadline);
  void barrier(const CollectiveInfo& info, Clock::time_point deadline);

  // The longest spin of the next collectives' waits before they sleep (Note [Waiting]).
  void setSpin(std::chrono::microseconds spin);

  // Marks this rank failed in the segment (peers then fail at once, quoting `reason`) and wakes
  // every sleeping rank. Idempotent; callable from any thread: a collective this rank runs
  // meanwhile fails at its next wait, within a futex wake-up (Note [Aborting from outside] in
  // communicator_base.cpp).
  void abort(const std::string& reason);
  // abort() for Communicator::abort(): the node's ranks then fail with MembershipChanged, since
  // they re-form together (Note [Aborting from outside] in communicator_base.cpp).
  void abortForMembership(const std::string& reason);
  // Marks this rank as gone (its communicator shut down): a peer still waiting for it fails at
  // once instead of at its deadline. Idempotent; a failure marked before stays.
  void close();
  // "rank 1 (pid 4242)", with the rank as messages name it.
  std::string describePeer(int rank) const;
  int nameOf(int rank) const {
    return options_.rankNames.empty() ? rank : options_.rankNames[rank];
  }

 private:
  struct Source;  // where a rank's input of this collective lies

  static constexpr uint32_t kFailed = 1;
  static constexpr uint32_t kClosed = 2;
  static constexpr uint32_t kMembership = 3;
  void mark(uint32_t state, const std::string& reason);
  // SegmentHeader::firstFailed: the rank and state packed in one word, 0 for none.
  static uint32_t packFailed(int rank, uint32_t state) {
    return state << 16 | static_cast<uint32_t>(rank + 1);
  }
  static int failedRank(uint32_t first) { return static_cast<int>(first & 0xffff) - 1; }
  static uint32_t failedState(uint32_t first) { return first >> 16; }
  // On entry, before anything is posted or compared: throws once a rank of the segment was
  // marked failed or aborted (Note [A failure is final for the segment]).
  void checkNoneFailed() const {
    const uint32_t first = firstFailed_.load(std::memory_order_acquire);
    if (first != 0) throwFailed(first);
  }
  // `waitingFor` < 0: on entry, waiting for nobody.
  [[noreturn]] void throwFailed(uint32_t first, int waitingFor = -1, const char* what = "") const;
  void enter(const CollectiveInfo& info, bool owned, int64_t inputOffset);
  void leave();
  void advance();
  // Before writing this rank's staging slot of the current step: every peer is done with the
  // step that last used it (Note [Steps and slots]).
  char* claimSlot(Clock::time_point deadline);
  // This rank's input of the current step is in place (its slot or its arena): announces it and
  // waits until every peer's is.
  void publishInput(Clock::time_point deadline);
  void endStep();
  // leave(), but when some rank's input was read in place (`anyOwned`), only once every peer is
  // done reading: the buffers are the callers' again after this.
  void leaveAfterReaders(bool anyOwned, Clock::time_point deadline);
  void waitFor(int peer, uint32_t target, Clock::time_point deadline, const char* what);
  void waitAll(uint32_t target, Clock::time_point deadline, const char* what);
  // After the first wait of a collective: every peer announced the same collective.
  void checkDescriptors(const CollectiveInfo& info, int onlyPeer = -1);
  const Descriptor& descriptorOf(int peer, uint64_t seq) const;
  // After the first wait of a collective that reads its peers' inputs: checkDescriptors(), then
  // where each rank's input lies (`src`, size_ entries); true when every one is in its rank's
  // arena. Sets *anyOwned when one is.
  bool readSources(const CollectiveInfo& info, Source* src, bool* anyOwned);
  [[noreturn]] void failWaiting(int peer, uint32_t target, Clock::time_point deadline,
                                const char* what);
  void checkPeers(int waitingFor, const char* what);
  // Rank `peer` is marked `state`: the error its peers throw.
  [[noreturn]] void throwMarked(int peer, uint32_t state, int waitingFor, const char* what) const;
  // Throws once this rank is marked failed or gone: abort() from another thread.
  void checkSelf() const {
    if (me_.aborted.load(std::memory_order_acquire) != 0) throwSelfAborted();
  }
  [[noreturn]] void throwSelfAborted() const;
  std::string whereIs(int peer) const;
  // A wait ended while spinning, or after sleeping; `start` being when it began: adapt the budget.
  void spun(Clock::time_point start);
  void slept(Clock::time_point start);
  static constexpr double kMinSpinUs = 2;
  static constexpr double kRaiseBelowUs = 200;
  // Note [Moving off a shared core]: waits in a row that found `peer` on this rank's own core.
  void notePeerCore(int peer, bool shared);
  static constexpr int kSharedCoreWaits = 16;

  void allreduceSmall(const CollectiveInfo& info, void* data, Clock::time_point deadline,
                      const SliceHook& hook);

  std::shared_ptr<Segment> segment_;
  EngineOptions options_;
  int rank_;
  int size_;
  RankControl& me_;
  std::atomic<uint32_t>& firstFailed_;  // the segment's (SegmentHeader::firstFailed)
  PeerWatch peers_;
  std::mutex markMutex_;          // mark() from the executor and from abort() on another thread
  uint32_t phase_ = 0;            // this rank's progress word, mirrored
  uint64_t step_ = 0;             // steps that used a staging slot, over all collectives
  uint32_t entries_[2] = {0, 0};  // progress after the entry of the last two steps, by step % 2
  uint64_t seq_ = 0;              // the collective being run (for messages)
  double spinBudgetUs_ = 50;      // Note [Waiting]: adapted between kMinSpinUs and options_.spin
  int sharedCoreWaits_ = 0;       // Note [Moving off a shared core]
  const char* kindName_ = "";
};

}  // namespace dtrain::comm::shm
