#include "shm_engine.h"

#include <sched.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "byte_layout.h"
#include "dtrain/base/error.h"
#include "shm_kernels.h"

namespace dtrain::comm::shm {

// Note [Shared-memory collectives]
// The ranks of a node share one segment (shm_segment.h). Each rank owns a control block with a
// progress word that only it writes and everybody reads: a rank "advances" by bumping it, and
// "waits for" a peer by watching the peer's word reach a value. Every rank runs the same phases
// in the same order, so the value a word must reach is known to all without any message.
//
// Allreduce of n bytes among N ranks, chunk by chunk: each rank puts its chunk where the others
// can read it (its staging slot, or nowhere when the buffer is communicator-owned and already in
// its arena) and advances; once all have, rank r reduces slice r of the chunk from every rank's
// copy -- in rank order, one pass over N inputs (shm_kernels.h) -- writes it back in place and
// advances; once all have, every rank copies the other slices into its own buffer. That is a
// reduce-scatter and an allgather, two synchronisations per chunk, and per rank about 2.5x the
// message in memory traffic from owned buffers. A staged rank copies in every slice but its own,
// reduces its own slice from its buffer directly (so it is read once, not copied in and read
// again) into its slot, where the peers copy the result from, and copies it back: about 4.5x the
// message at two ranks instead of 5.5x. Small messages (smallBytes) skip the scatter: every rank
// reduces the whole buffer, one synchronisation.
//
// Before any data moves, each rank compares the descriptor every peer posted for this collective
// (sequence number, kind, type, count, op, root): ranks that disagree fail at once naming both
// sides, a skipped collective shows up as "rank 1 is ahead at seq 42", never as wrong data or a
// timeout.
//
// Note [Steps and slots]
// Every use of a staging slot is a "step", numbered across collectives; step g uses slot g % 2,
// and every rank advances exactly once when it enters a step. A rank that entered step g + 1 is
// done reading step g - 1's slots, so before writing its slot for step g + 1 a rank waits until
// every peer has entered step g: two slots let one chunk be copied in while the previous one is
// still being read, with no extra synchronisation. Buffers the peers read in place (owned ones)
// need one more phase at the end: the owner returns only after everyone has finished reading.
//
// Note [Waiting]
// A waiting rank spins on the peer's word for a while, then sleeps on it with a futex, registering
// in the peer's `sleepers` count so the peer wakes it after its next advance. How long to spin
// decides latency, and depends on the machine more than on anything dtrain controls:
//   - peers that run at the same time see each other's advance within microseconds, while a
//     sleeper costs a scheduler wake-up each time (5-10 us, and two ranks that sleep in turn pay
//     one per call): a 4 KiB allreduce takes ~2 us spinning, ~10 us sleeping;
//   - on a loaded machine (more runnable threads than cores) the peer is often not running, and a
//     spinning waiter holds a core the peer may need: every spin then runs to its end (measured at
//     load 10-16 on 2 cores: a 4 KiB allreduce took the spin's length, 0.1 ms with a 100 us spin
//     and 1 ms with 1 ms, against 11 us sleeping at once).
// So the spin adapts (Engine::spinBudgetUs_): one that sees the peer after t raises the budget to
// 8t; a wait that had to sleep halves it (down to 2 us), unless it was short (under 200 us:
// spinning that long would have caught the peer without a wake-up) in a synchronous call, where
// it raises it to twice the wait; always up to a ceiling: 1 ms in synchronous calls, whose caller
// blocks anyway, 50 us in calls the comm thread runs while the caller computes (DDP's buckets
// during backward).
// Without the raise after a short sleep the budget only ever fell: two ranks that once slept in
// turn kept sleeping, every wait ending in a wake-up (a 4 KiB allreduce stuck at ~11 us where
// ~2 us was possible).
//
// Where the peer runs matters as much: a wake-up tends to put the woken rank on its waker's core
// (the scheduler's wake-affine placement), and two ranks that share a core can only take turns,
// so a spin there holds the very core the peer needs. Each rank therefore records the CPU it
// advanced on (the `cpu` word of its control block), and a spinner that finds its peer last ran
// on its own core yields the core at every turn (measured at load 8 on 2 cores: 4 KiB 9 us
// against 156 us with the same budget and no yield). When the node's ranks outnumber its cores the
// spin yields at every turn anyway. Sleeps last at most sleepSlice (100 ms): between them the rank
// looks whether a peer aborted (its error is quoted) or died (a pidfd per peer,
// Note [Watching peers] in shm_wait.h), and whether the deadline passed. A dead peer is therefore
// noticed within ~0.1 s, a frozen one at the collective timeout.

// Note [Moving off a shared core]
// The wake-affine placement of Note [Waiting] can also keep two ranks on one core of an otherwise
// idle machine: each wakes the other onto its own core, the yield lets the other run, and they
// take turns there for good (a 4 KiB allreduce at 2 ranks on 2 idle cores: 8.6-8.7 us a call in two
// of five runs, 1.0-2.0 us in the others, where the ranks ran apart). The scheduler's balancer does
// not separate them: the core they share is half idle. So when kSharedCoreWaits waits in a row
// find the peer last ran on this rank's core, the higher-ranked of the two (one of them, or both
// would swap cores and meet again) moves: its affinity is set to its allowed CPUs but this one,
// which migrates it at once, and then back to all of them, so that nothing stays pinned. Not when
// the node's ranks outnumber its cores (options_.yield: sharing is then unavoidable), nor when
// this thread may run on one CPU only.

// Note [A failure is final for the segment]
// A rank that fails, or is aborted (Communicator::abort()), marks itself in its control block
// (Engine::mark); its peers blocked in a collective see the mark at their next look
// (Note [Waiting]) and fail too. That alone misses a rank that enters a collective afterwards:
// what the others posted on entry stays in the segment after they have thrown out of the
// collective, so the late rank's waits find every peer's progress already there, never sleep,
// never look at the marks, and the rank then fails the collective check against what its peers
// had called (its barrier against their allreduce) instead of with the abort, or completes the
// collective from the inputs they left behind while they failed it. So the first rank to be
// marked failed or aborted also names itself and its state in the segment header
// (SegmentHeader::firstFailed), and every collective reads that word on entry, before it posts or
// compares anything: from then on each entry on each rank throws what the first failure calls
// for, MembershipChanged for an aborted rank (its node re-forms with it) and NetworkError for a
// failed one, quoting it and its reason. Blocked ranks quote that first rank too rather than a
// peer that failed because of it. The cost is one acquire load per collective (a plain load on
// x86-64) of a cache line no rank writes after joining but for that once. A rank that shuts down
// is not named there: a peer may still read its last broadcast, and a wait for it fails at its
// next look. The header is set before the rank's own mark, so a rank that has seen the mark finds
// it set; what it cannot cover is a rank that entered before the mark was set and then finds every
// input posted: it may finish the collective its peers leave, the race of any abort with a
// collective's last step.

namespace {

bool reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

std::vector<PeerWatch::Peer> peersOf(const Segment& s) {
  std::vector<PeerWatch::Peer> peers(static_cast<size_t>(s.size()));
  for (int r = 0; r < s.size(); ++r) {
    PeerWatch::Peer& p = peers[static_cast<size_t>(r)];
    p.pidfd = s.pidfd(r);
    p.pid = s.control(r).pid.load(std::memory_order_acquire);
    p.samePidNamespace = s.samePidNamespace(r);
    p.self = r == s.rank();
  }
  return peers;
}

// Slice j of a chunk of m elements among n ranks: cache-line aligned, the last ones may be short
// or empty.
struct Slices {
  size_t q;
  size_t m;
  Slices(size_t m, int n, size_t elem)
      : q(roundUp((m + static_cast<size_t>(n) - 1) / static_cast<size_t>(n),
                  std::max<size_t>(1, 64 / elem))),
        m(m) {}
  size_t begin(int j) const { return std::min(m, q * static_cast<size_t>(j)); }
  size_t end(int j) const { return std::min(m, q * static_cast<size_t>(j + 1)); }
};

}  // namespace

struct Engine::Source {
  bool owned = false;
  const char* base = nullptr;  // the rank's input in the segment when owned
};

bool Engine::readSources(const CollectiveInfo& info, Source* src, bool* anyOwned) {
  checkDescriptors(info);
  bool allOwned = true;
  for (int j = 0; j < size_; ++j) {
    const Descriptor& d = descriptorOf(j, info.seq);
    src[j].owned = d.owned != 0;
    src[j].base = segment_->base() + d.inputOffset;
    allOwned = allOwned && src[j].owned;
    *anyOwned = *anyOwned || src[j].owned;
  }
  return allOwned;
}

Engine::Engine(std::shared_ptr<Segment> segment, const EngineOptions& options)
    : segment_(std::move(segment)),
      options_(options),
      rank_(segment_->rank()),
      size_(segment_->size()),
      me_(segment_->control(rank_)),
      firstFailed_(segment_->header().firstFailed),
      peers_(peersOf(*segment_)) {
  phase_ = me_.progress.load(std::memory_order_relaxed);
}

Engine::~Engine() = default;

std::string Engine::describePeer(int rank) const {
  const PeerWatch::Peer& p = peers_.peer(rank);
  return fmt::format("rank {} (pid {}{})", nameOf(rank), p.pid,
                     p.samePidNamespace || p.self ? "" : " in its PID namespace");
}

void Engine::enter(const CollectiveInfo& info, bool owned, int64_t inputOffset) {
  checkNoneFailed();  // Note [A failure is final for the segment]
  Descriptor& d = me_.ring[info.seq % kDescriptorRing];
  d.what = Fingerprint::of(info);
  d.owned = owned ? 1 : 0;
  d.inputOffset = owned ? static_cast<uint64_t>(inputOffset) : 0;
  me_.seq.store(info.seq, std::memory_order_relaxed);
  me_.inside.store(1, std::memory_order_relaxed);
  seq_ = info.seq;
  kindName_ = collectiveKindName(info.kind);
  // Published by the next advance (a sequentially consistent store after these writes).
}

void Engine::leave() { me_.inside.store(0, std::memory_order_relaxed); }

void Engine::advance() {
  ++phase_;
  me_.cpu.store(sched_getcpu(), std::memory_order_relaxed);
  me_.progress.store(phase_, std::memory_order_seq_cst);
  if (me_.sleepers.load(std::memory_order_seq_cst) != 0) futexWakeAll(&me_.progress);
}

char* Engine::claimSlot(Clock::time_point deadline) {
  if (step_ > 0) {
    waitAll(entries_[(step_ - 1) % 2], deadline, "to finish reading this rank's previous chunk");
  }
  return segment_->slot(rank_, static_cast<int>(step_ % 2));
}

void Engine::endStep() { ++step_; }

void Engine::publishInput(Clock::time_point deadline) {
  advance();
  entries_[step_ % 2] = phase_;
  waitAll(phase_, deadline, "to publish its input");
}

void Engine::leaveAfterReaders(bool anyOwned, Clock::time_point deadline) {
  if (anyOwned) {
    advance();
    waitAll(phase_, deadline, "to finish reading this rank's buffer");
  }
  leave();
}

void Engine::waitFor(int peer, uint32_t target, Clock::time_point deadline, const char* what) {
  checkSelf();  // a collective moving data stops at its next step once aborted
  RankControl& c = segment_->control(peer);
  if (reached(c.progress.load(std::memory_order_acquire), target)) return;
  notePeerCore(peer, c.cpu.load(std::memory_order_relaxed) == sched_getcpu());
  // Note [Waiting]: spin for the adaptive budget, then sleep.
  const auto start = Clock::now();
  const auto budget = std::chrono::duration<double, std::micro>(spinBudgetUs_);
  do {
    if (options_.yield) {
      sched_yield();
      if (reached(c.progress.load(std::memory_order_acquire), target)) return spun(start);
      continue;
    }
    for (int i = 0; i < 64; ++i) {
      cpuRelax();
      if (reached(c.progress.load(std::memory_order_acquire), target)) return spun(start);
    }
    // The peer last ran on this very core: it is probably queued behind this spin. Let it run.
    if (c.cpu.load(std::memory_order_relaxed) == sched_getcpu()) sched_yield();
  } while (Clock::now() - start < budget);
  while (true) {
    // The condition first: a peer that did its part and then left (shut down, exited) is fine.
    if (reached(c.progress.load(std::memory_order_acquire), target)) return slept(start);
    checkPeers(peer, what);
    const auto now = Clock::now();
    if (now >= deadline) failWaiting(peer, target, deadline, what);
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now);
    c.sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t v = c.progress.load(std::memory_order_seq_cst);
    if (!reached(v, target)) {
      futexWait(&c.progress, v, std::min(options_.sleepSlice, left + std::chrono::microseconds(1)));
    }
    c.sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

void Engine::notePeerCore(int peer, bool shared) {
  if (!shared) {
    sharedCoreWaits_ = 0;
    return;
  }
  if (options_.yield || rank_ < peer || ++sharedCoreWaits_ < kSharedCoreWaits) return;
  sharedCoreWaits_ = 0;
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  const int here = sched_getcpu();
  if (here < 0 || here >= CPU_SETSIZE || sched_getaffinity(0, sizeof(allowed), &allowed) != 0 ||
      CPU_COUNT(&allowed) < 2 || !CPU_ISSET(here, &allowed)) {
    return;
  }
  cpu_set_t elsewhere = allowed;
  CPU_CLR(here, &elsewhere);
  if (sched_setaffinity(0, sizeof(elsewhere), &elsewhere) == 0) {
    (void)sched_setaffinity(0, sizeof(allowed), &allowed);
  }
}

void Engine::spun(Clock::time_point start) {
  const double waited = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  spinBudgetUs_ = std::min<double>(static_cast<double>(options_.spin.count()),
                                   std::max(spinBudgetUs_, 8 * waited));
}

void Engine::slept(Clock::time_point start) {
  const double waited = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  // Only where the ceiling allows such spins (synchronous calls): the comm thread's spins during
  // backward stay short.
  if (waited <= kRaiseBelowUs && static_cast<double>(options_.spin.count()) >= kRaiseBelowUs) {
    // The peer came soon after all: spinning twice as long would have caught it.
    spinBudgetUs_ = std::min<double>(static_cast<double>(options_.spin.count()),
                                     std::max(spinBudgetUs_, 2 * waited));
  } else {
    spinBudgetUs_ = std::max(kMinSpinUs, spinBudgetUs_ / 2);  // spinning did not pay: less
  }
}

void Engine::setSpin(std::chrono::microseconds spin) {
  options_.spin = spin;
  spinBudgetUs_ = std::min(spinBudgetUs_, static_cast<double>(spin.count()));
}

void Engine::waitAll(uint32_t target, Clock::time_point deadline, const char* what) {
  for (int j = 1; j < size_; ++j) {
    // Start with the next rank: ranks then do not all watch rank 0 first.
    waitFor((rank_ + j) % size_, target, deadline, what);
  }
}

std::string Engine::whereIs(int peer) const {
  const RankControl& c = segment_->control(peer);
  const uint64_t seq = c.seq.load(std::memory_order_acquire);
  if (!reached(c.progress.load(std::memory_order_acquire), 1)) {
    return fmt::format("rank {} has not started a collective yet", nameOf(peer));
  }
  const Descriptor& d = c.ring[seq % kDescriptorRing];
  const std::string what = d.what.toInfo().describeWithSeq();
  return c.inside.load(std::memory_order_acquire) != 0
             ? fmt::format("rank {} is inside {}", nameOf(peer), what)
             : fmt::format("rank {} is outside any collective, its last was {}", nameOf(peer),
                           what);
}

void Engine::throwSelfAborted() const {
  char reason[kReasonBytes];
  std::memcpy(reason, me_.reason, sizeof(reason));
  reason[sizeof(reason) - 1] = '\0';
  DTRAIN_THROW(Error, "this rank's communicator was aborted while it waited ({})", reason);
}

void Engine::throwFailed(uint32_t first, int waitingFor, const char* what) const {
  const int r = failedRank(first);
  if (r == rank_) throwSelfAborted();
  throwMarked(r, failedState(first), waitingFor, what);
}

void Engine::throwMarked(int r, uint32_t state, int waitingFor, const char* what) const {
  const std::string waiting = waitingFor < 0 || r == waitingFor
                                  ? ""
                                  : fmt::format(" (this rank was waiting for rank {} {})",
                                                nameOf(waitingFor), what);
  if (state == kClosed) {
    DTRAIN_THROW(NetworkError, "{} shut down its communicator{}{}", describePeer(r),
                 r == waitingFor ? fmt::format(" while this rank waited for it {}", what) : "",
                 waiting);
  }
  char reason[kReasonBytes];
  std::memcpy(reason, segment_->control(r).reason, sizeof(reason));
  reason[sizeof(reason) - 1] = '\0';
  if (state == kMembership) {
    DTRAIN_THROW(MembershipChanged, "{} was aborted{}: {}", describePeer(r), waiting, reason);
  }
  DTRAIN_THROW(NetworkError, "{} failed{}: {}", describePeer(r), waiting, reason);
}

void Engine::checkPeers(int waitingFor, const char* what) {
  checkSelf();
  // The first rank marked is the one to quote, not a peer that failed because of it.
  const uint32_t first = firstFailed_.load(std::memory_order_acquire);
  if (first != 0) throwFailed(first, waitingFor, what);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const uint32_t state = segment_->control(r).aborted.load(std::memory_order_acquire);
    if (state != 0) throwMarked(r, state, waitingFor, what);
  }
  const int dead = peers_.firstDead();
  if (dead >= 0) {
    DTRAIN_THROW(NetworkError,
                 "{} exited while this rank waited for {} {}: the process died or "
                 "ended without finishing this collective",
                 describePeer(dead),
                 dead == waitingFor ? "it" : fmt::format("rank {}", nameOf(waitingFor)), what);
  }
}

void Engine::failWaiting(int peer, uint32_t target, Clock::time_point deadline, const char* what) {
  (void)target;
  (void)deadline;
  DTRAIN_THROW(TimeoutError,
               "timed out waiting for {} {} ({}; the process is alive: frozen, "
               "stopped, or busy outside the communicator)",
               describePeer(peer), what, whereIs(peer));
}

const Descriptor& Engine::descriptorOf(int peer, uint64_t seq) const {
  return segment_->control(peer).ring[seq % kDescriptorRing];
}

void Engine::checkDescriptors(const CollectiveInfo& info, int onlyPeer) {
  const Fingerprint mine = Fingerprint::of(info);
  for (int j = 0; j < size_; ++j) {
    if (j == rank_ || (onlyPeer >= 0 && j != onlyPeer)) continue;
    const Descriptor& d = descriptorOf(j, info.seq);
    if (d.what.seq == info.seq) {
      if (d.what.sameCollective(mine)) continue;
      DTRAIN_THROW(InvalidArgument,
                   "collective check failed: this rank calls {}; rank {} calls "
                   "{}. HINT: every rank must issue the same collectives, in the same order, "
                   "with the same types and sizes",
                   info.describeWithSeq(), nameOf(j), d.what.toInfo().describeWithSeq());
    }
    const uint64_t theirs = segment_->control(j).seq.load(std::memory_order_acquire);
    const std::string what = descriptorOf(j, theirs).what.toInfo().describe();
    DTRAIN_THROW(Error,
                 "rank {} is {} at seq {} ({}; this rank is at seq {}). HINT: a rank "
                 "skipped a collective or issued one more; every rank must issue the same "
                 "collectives in the same order",
                 nameOf(j), theirs > info.seq ? "ahead" : "behind", theirs, what, info.seq);
  }
}

void Engine::abort(const std::string& reason) { mark(kFailed, reason); }

void Engine::abortForMembership(const std::string& reason) { mark(kMembership, reason); }

void Engine::close() { mark(kClosed, "shut down"); }

void Engine::mark(uint32_t state, const std::string& reason) {
  std::lock_guard<std::mutex> lock(markMutex_);  // one writer of `reason` at a time
  if (me_.aborted.load() == 0) {
    const size_t n = std::min(reason.size(), kReasonBytes - 1);
    std::memcpy(me_.reason, reason.data(), n);
    me_.reason[n] = '\0';
    if (state != kClosed) {
      // Before this rank's own mark: a peer that saw the mark finds the header set too (Note [A
      // failure is final for the segment]).
      uint32_t none = 0;
      firstFailed_.compare_exchange_strong(none, packFailed(rank_, state),
                                           std::memory_order_seq_cst);
    }
    uint32_t expected = 0;
    me_.aborted.compare_exchange_strong(expected, state, std::memory_order_seq_cst);
  }
  for (int r = 0; r < size_; ++r) futexWakeAll(&segment_->control(r).progress);
}

void Engine::allreduceSmall(const CollectiveInfo& info, void* data, Clock::time_point deadline,
                            const SliceHook& hook) {
  const size_t bytes = info.count * elementSize(info.dtype);
  enter(info, /*owned=*/false, 0);
  std::memcpy(claimSlot(deadline), data, bytes);
  publishInput(deadline);
  checkDescriptors(info);
  const void* inputs[kMaxShmRanks];
  for (int j = 0; j < size_; ++j) inputs[j] = segment_->slot(j, static_cast<int>(step_ % 2));
  reduceInputs(data, inputs, size_, info.count, info.dtype, info.op);
  endStep();
  if (hook) hook(data, info.count);
  leave();
}

void Engine::allreduce(const CollectiveInfo& info, void* data, Clock::time_point deadline,
                       const SliceHook& hook) {
  const size_t elem = elementSize(info.dtype);
  const size_t bytes = info.count * elem;
  if (bytes <= segment_->tuning().smallBytes && bytes <= segment_->slotBytes()) {
    return allreduceSmall(info, data, deadline, hook);
  }
  char* const out = static_cast<char*>(data);
  const int64_t offset = segment_->ownOffset(data, bytes);
  const bool owned = offset >= 0;
  enter(info, owned, offset);
  Source src[kMaxShmRanks];
  const void* inputs[kMaxShmRanks];
  bool anyOwned = false;
  // Staged ranks copy their first chunk before they know whether everyone is owned; a mixed
  // collective therefore streams in slot-sized chunks, an all-owned one in owned chunks.
  size_t chunk = segment_->slotBytes() / elem;
  bool first = true;
  for (size_t done = 0; done < info.count;) {
    size_t m = std::min(chunk, info.count - done);
    if (!owned) {
      // Every slice but this rank's own, which it reduces straight from its buffer.
      char* slot = claimSlot(deadline);
      const Slices slices(m, size_, elem);
      const size_t b = slices.begin(rank_), e = slices.end(rank_);
      std::memcpy(slot, out + done * elem, b * elem);
      std::memcpy(slot + e * elem, out + (done + e) * elem, (m - e) * elem);
    }
    publishInput(deadline);
    if (first) {
      first = false;
      const bool allOwned = readSources(info, src, &anyOwned);
      // With a hook (hierarchical), every node must chunk alike: slot-sized chunks always.
      if (allOwned && !hook) {
        chunk = std::max<size_t>(1, segment_->tuning().ownedChunkBytes / elem);
        m = std::min(chunk, info.count - done);
      }
    }
    const int slot = static_cast<int>(step_ % 2);
    auto at = [&](int j, size_t element) -> const char* {
      return src[j].owned ? src[j].base + (done + element) * elem
                          : segment_->slot(j, slot) + element * elem;
    };
    const Slices slices(m, size_, elem);
    const size_t b = slices.begin(rank_), e = slices.end(rank_);
    // The result goes where the peers copy it from: in place (owned) or this rank's slot.
    char* mine = owned ? out + (done + b) * elem : segment_->slot(rank_, slot) + b * elem;
    if (e > b) {
      for (int j = 0; j < size_; ++j) inputs[j] = at(j, b);
      if (!owned) inputs[rank_] = out + (done + b) * elem;
      reduceInputs(mine, inputs, size_, e - b, info.dtype, info.op);
      if (hook) hook(mine, e - b);
    }
    advance();
    if (!owned) std::memcpy(out + (done + b) * elem, mine, (e - b) * elem);
    waitAll(phase_, deadline, "to reduce its slice");
    for (int j = 0; j < size_; ++j) {
      const size_t bj = slices.begin(j), ej = slices.end(j);
      if (ej == bj || j == rank_) continue;
      std::memcpy(out + (done + bj) * elem, at(j, bj), (ej - bj) * elem);
    }
    endStep();
    done += m;
  }
  leaveAfterReaders(anyOwned, deadline);
}

void Engine::broadcast(const CollectiveInfo& info, void* data, Clock::time_point deadline) {
  const size_t elem = elementSize(info.dtype);
  const size_t bytes = info.count * elem;
  const int root = info.root;
  char* const buf = static_cast<char*>(data);
  const int64_t offset = rank_ == root ? segment_->ownOffset(data, bytes) : -1;
  enter(info, offset >= 0, offset);
  if (rank_ == root && offset >= 0) {
    // The peers copy straight out of this rank's arena; wait until all have.
    advance();
    advance();
    waitAll(phase_, deadline, "to read the broadcast buffer");
    checkDescriptors(info);
    return leave();
  }
  const size_t chunk = segment_->slotBytes();
  bool first = true;
  for (size_t done = 0; done < bytes;) {
    const size_t m = std::min(chunk, bytes - done);
    if (rank_ == root) {
      std::memcpy(claimSlot(deadline), buf + done, m);
      advance();
      entries_[step_ % 2] = phase_;
    } else {
      advance();
      entries_[step_ % 2] = phase_;
      waitFor(root, phase_, deadline, "to publish the broadcast data");
      if (first) {
        first = false;
        checkDescriptors(info, root);
        const Descriptor& d = descriptorOf(root, info.seq);
        if (d.owned != 0) {
          std::memcpy(buf, segment_->base() + d.inputOffset, bytes);
          advance();  // done reading the root's buffer
          return leave();
        }
      }
      std::memcpy(buf + done, segment_->slot(root, static_cast<int>(step_ % 2)), m);
    }
    endStep();
    done += m;
  }
  leave();
}

void Engine::allgather(const CollectiveInfo& info, const void* send, void* recv,
                       Clock::time_point deadline) {
  const size_t elem = elementSize(info.dtype);
  const size_t count = info.count;
  const char* const in = static_cast<const char*>(send);
  char* const out = static_cast<char*>(recv);
  const int64_t offset = segment_->ownOffset(send, count * elem);
  const bool owned = offset >= 0;
  enter(info, owned, offset);
  Source src[kMaxShmRanks];
  bool anyOwned = false;
  size_t chunk = segment_->slotBytes() / elem;
  bool first = true;
  for (size_t done = 0; done < count;) {
    size_t m = std::min(chunk, count - done);
    if (!owned) std::memcpy(claimSlot(deadline), in + done * elem, m * elem);
    publishInput(deadline);
    if (first) {
      first = false;
      if (readSources(info, src, &anyOwned)) {  // every input in place: the rest in one chunk
        chunk = count;
        m = count - done;
      }
    }
    const int slot = static_cast<int>(step_ % 2);
    for (int j = 0; j < size_; ++j) {
      char* dst = out + (static_cast<size_t>(j) * count + done) * elem;
      const char* from = j == rank_     ? in + done * elem
                         : src[j].owned ? src[j].base + done * elem
                                        : segment_->slot(j, slot);
      if (dst != from) std::memcpy(dst, from, m * elem);
    }
    endStep();
    done += m;
  }
  leaveAfterReaders(anyOwned, deadline);
}

void Engine::reduceScatter(const CollectiveInfo& info, const void* send, void* recv,
                           Clock::time_point deadline) {
  const size_t elem = elementSize(info.dtype);
  const size_t count = info.count;
  const size_t n = static_cast<size_t>(size_);
  const char* const in = static_cast<const char*>(send);
  char* const out = static_cast<char*>(recv);
  const int64_t offset = segment_->ownOffset(send, n * count * elem);
  const bool owned = offset >= 0;
  enter(info, owned, offset);
  Source src[kMaxShmRanks];
  const void* inputs[kMaxShmRanks];
  bool anyOwned = false;
  // Staged: each slot holds one piece of every block, `stride` elements apart.
  const size_t stride = std::max<size_t>(1, segment_->slotBytes() / (n * elem));
  size_t chunk = stride;
  bool first = true;
  for (size_t done = 0; done < count;) {
    size_t m = std::min(chunk, count - done);
    if (!owned) {
      char* slot = claimSlot(deadline);
      for (size_t b = 0; b < n; ++b) {
        std::memcpy(slot + b * stride * elem, in + (b * count + done) * elem, m * elem);
      }
    }
    publishInput(deadline);
    if (first) {
      first = false;
      if (readSources(info, src, &anyOwned)) {  // every input in place: the rest in one chunk
        chunk = count;
        m = count - done;
      }
    }
    const int slot = static_cast<int>(step_ % 2);
    const size_t me = static_cast<size_t>(rank_);
    for (int j = 0; j < size_; ++j) {
      inputs[j] = src[j].owned ? src[j].base + (me * count + done) * elem
                               : segment_->slot(j, slot) + me * stride * elem;
    }
    reduceInputs(out + done * elem, inputs, size_, m, info.dtype, info.op);
    endStep();
    done += m;
  }
  leaveAfterReaders(anyOwned, deadline);
}

void Engine::barrier(const CollectiveInfo& info, Clock::time_point deadline) {
  enter(info, false, 0);
  advance();
  waitAll(phase_, deadline, "to reach the barrier");
  checkDescriptors(info);
  leave();
}

}  // namespace dtrain::comm::shm
