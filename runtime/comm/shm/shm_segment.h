#pragma once
// Segment: the memory the ranks of one shared-memory communicator all map. One memfd per
// communicator, created by rank 0 and handed to the others over a short-lived abstract Unix socket
// (see Note [Segment lifetime]; shm_handover.h), so no name exists in /dev/shm or anywhere else
// that a crash could leave behind. The same socket hands every rank a pidfd of every other rank's
// process (Note [Watching peers] in shm_wait.h).
//
// Layout (offsets in the header, every part page-aligned):
//   header | control block per rank | staging: 2 slots per rank | arena per rank (allocate())
// Control blocks are the only places ranks write to signal each other; each sits on its own cache
// lines. Staging carries buffers the communicator does not own; arenas hold the ones it does, and
// peers read those in place.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collective.h"
#include "dtrain/base/store.h"

namespace dtrain::comm::shm {

constexpr uint64_t kSegmentMagic = 0x6d68732d6e696172ull;  // "rain-shm"
constexpr uint32_t kSegmentVersion = 4;  // 4: the header names the first rank that failed
constexpr int kDescriptorRing = 4;
constexpr size_t kReasonBytes = 768;
// Most ranks one segment serves (one node).
constexpr int kMaxShmRanks = 256;

// One collective as a rank announces it on entry: what it calls (compared by every peer before
// any data moves) and where its buffers are when the communicator owns them.
struct Descriptor {
  Fingerprint what;
  uint64_t inputOffset;  // segment offset of the rank's input when `owned`
  uint32_t owned;        // 1: the input lies in the rank's arena, peers read it in place
  uint32_t pad;
};

// Every value that decides where things lie in the segment or which path a collective takes.
// The segment's are rank 0's; a rank whose own differ refuses to join, naming the option, both
// values and both ranks (Note [One tuning per segment] in shm_segment.cpp).
struct Tuning {
  uint64_t slotBytes = 0;
  uint64_t arenaBytes = 0;
  uint64_t smallBytes = 0;
  uint64_t ownedChunkBytes = 0;
};

// "" when `theirs` (rank `theirRank`'s) equals `ours` (rank `ourRank`'s); otherwise the first
// difference: "ShmOptions::smallBytes is 65536 on rank 0 and 131072 on rank 1".
std::string tuningMismatch(const Tuning& ours, int ourRank, const Tuning& theirs, int theirRank);

struct alignas(64) RankControl {
  // Written by the rank only: phases completed (wraps around; compared as a signed difference).
  std::atomic<uint32_t> progress;
  // Peers sleeping on `progress` (futex); the rank wakes them after each step when non-zero.
  std::atomic<uint32_t> sleepers;
  // The CPU the rank last advanced on: a waiter on the same one yields it (Note [Waiting]).
  std::atomic<int32_t> cpu;
  char pad0[52];
  // Set once: 1 when this rank's communicator failed (`reason` holds its error, NUL-terminated),
  // 2 when it was shut down, 3 when it was aborted because the job's membership changed.
  std::atomic<uint32_t> aborted;
  std::atomic<int32_t> pid;
  std::atomic<uint64_t> seq;     // the collective it is in, or the last one it finished
  std::atomic<uint32_t> inside;  // 1 while inside a collective
  char pad1[44];
  Descriptor ring[kDescriptorRing];  // by seq % kDescriptorRing
  char reason[kReasonBytes];
  // Published when the rank joins, before `joined` counts it.
  uint64_t pidNamespace;  // inode of the rank's PID namespace; 0: unknown
  Tuning tuning;          // the rank's own options
};

struct SegmentHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t ranks;
  uint64_t bytes;
  uint64_t controlOffset;
  uint64_t stagingOffset;
  uint64_t arenaOffset;
  Tuning tuning;                 // rank 0's: what every rank runs by
  std::atomic<uint32_t> joined;  // ranks that mapped the segment and published their pid
  // Set once, by the first rank marked failed or aborted (not shut down): its rank and state
  // (RankControl::aborted), packed by Engine; 0 while none is. Every collective entry reads it
  // (Note [A failure is final for the segment] in shm_engine.cpp).
  std::atomic<uint32_t> firstFailed;
};

struct SegmentOptions {
  int rank = 0;
  int size = 1;
  std::shared_ptr<store::Store> store;
  std::string name;  // store keys go under "<name>/shm/"
  Tuning tuning;
  std::chrono::milliseconds connectTimeout{300000};
  // What messages call each rank (the communicator's numbers when the segment holds one node of
  // several); empty: the segment's own numbers. `who` starts this rank's messages ("rank 3/4
  // (local rank 1/2)"); empty: "rank <rank>/<size>".
  std::vector<int> rankNames;
  std::string who;
};

class Segment {
 public:
  // Collective over the ranks: rank 0 creates and shares the memfd, everybody maps it and
  // publishes its pid and options; returns when all have. Throws TimeoutError naming the ranks
  // that did not join, InvalidArgument when a rank's options differ from rank 0's (every rank
  // throws it), Error when the kernel refuses (memfd, mmap, socket).
  static std::shared_ptr<Segment> join(const SegmentOptions& options);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  char* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  SegmentHeader& header() const { return *reinterpret_cast<SegmentHeader*>(base_); }
  RankControl& control(int rank) const {
    return reinterpret_cast<RankControl*>(base_ + header().controlOffset)[rank];
  }
  const Tuning& tuning() const { return header().tuning; }
  size_t slotBytes() const { return tuning().slotBytes; }
  char* slot(int rank, int slot) const {
    return base_ + header().stagingOffset + (static_cast<size_t>(rank) * 2 + slot) * slotBytes();
  }
  size_t arenaBytes() const { return tuning().arenaBytes; }
  char* arena(int rank) const {
    return base_ + header().arenaOffset + static_cast<size_t>(rank) * arenaBytes();
  }
  // Segment offset of [p, p + bytes) when it lies inside this rank's arena; -1 otherwise.
  int64_t ownOffset(const void* p, size_t bytes) const;
  // Whether shared memory may use transparent huge pages here (shmem_enabled is not "never").
  bool hugePages() const { return hugePages_; }
  // A pidfd of rank `rank`'s process, owned by the segment; -1 where that rank's kernel has none.
  int pidfd(int rank) const { return pidfds_[static_cast<size_t>(rank)]; }
  // Whether rank `rank` runs in this process's PID namespace (its published pid means the same
  // process here); false when either is unknown.
  bool samePidNamespace(int rank) const;

 private:
  Segment() = default;
  // The steps of join(): map the file fd_ refers to; rank 0 fills in the header; publish this
  // rank's pid and options, wait until every rank has, and compare every rank's options with the
  // segment's.
  void map(const std::string& who);
  void writeHeader(const SegmentOptions& options);
  void waitForRanks(std::chrono::steady_clock::time_point deadline, const std::string& who);
  void checkTuning(const std::vector<int>& rankNames, const std::string& who) const;

  int rank_ = 0;
  int size_ = 1;
  int fd_ = -1;
  char* base_ = nullptr;
  size_t bytes_ = 0;
  bool hugePages_ = false;
  std::vector<int> pidfds_;  // by rank
};

// Sizes of the parts for `ranks` ranks (all page-aligned; arenas 2 MiB-aligned).
struct SegmentLayout {
  uint64_t controlOffset, stagingOffset, arenaOffset, bytes;
  static SegmentLayout of(int ranks, size_t slotBytes, size_t arenaBytes);
};

}  // namespace dtrain::comm::shm
