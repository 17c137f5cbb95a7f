#include "shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "byte_layout.h"
#include "dtrain/base/error.h"
#include "shm_handover.h"
#include "shm_wait.h"

namespace dtrain::comm::shm {

// Note [Segment lifetime]
// A segment must never outlive its job, even when every process of the job is SIGKILLed at once,
// and must not depend on /dev/shm (containers often mount a 64 MiB one). So it has no name: rank 0
// creates a memfd, and the others receive its file descriptor over an abstract Unix socket whose
// random name rank 0 posts to the job's store (shm_handover.h). Abstract sockets vanish with their
// last descriptor, and rank 0 closes it as soon as every peer has its copy; from then on the
// segment exists only as the mappings and descriptors of the ranks, and the kernel frees it when
// the last of them exits, however it exits. Nothing is left in the file system for a launcher to
// clean up.
//
// The socket accepts only processes of this user (SO_PEERCRED) and each rank only once; its name
// carries 64 random bits, and it exists only while the communicator is being created. Each rank
// sends a pidfd of its own process with its request, and rank 0 hands every rank all of them with
// the memfd (Note [Watching peers] in shm_wait.h).

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kPage = 4096;
constexpr size_t kHuge = size_t{2} << 20;

bool shmemHugePagesAllowed() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return !text.empty() && text.find("[never]") == std::string::npos &&
         text.find("[deny]") == std::string::npos;
}

// Touches `bytes` at `p` now, so no collective pays first-touch page faults.
void prefault(char* p, size_t bytes) {
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
  if (bytes == 0) return;
  if (madvise(p, bytes, MADV_POPULATE_WRITE) == 0) return;
  for (size_t i = 0; i < bytes; i += kPage) p[i] = 0;  // older kernels
}

// Rank 0: the segment's memory, a memfd of `bytes` bytes.
int createSegmentFile(uint64_t bytes, const std::string& who) {
  const int fd = static_cast<int>(::syscall(SYS_memfd_create, "dtrain-shm", MFD_CLOEXEC));
  DTRAIN_CHECK(fd >= 0, "{}: shared memory: memfd_create: {}", who, errnoText(errno));
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int e = errno;
    ::close(fd);
    DTRAIN_THROW(Error, "{}: shared memory: cannot size the segment to {} bytes: {}", who, bytes,
                 errnoText(e));
  }
  return fd;
}

// Inode of this process's PID namespace: two ranks with the same one see the same pids. 0 when
// /proc cannot tell.
uint64_t pidNamespaceId() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

struct TuningField {
  const char* name;
  uint64_t Tuning::*member;
};
constexpr TuningField kTuningFields[] = {
    {"slotBytes", &Tuning::slotBytes},
    {"arenaBytes", &Tuning::arenaBytes},
    {"smallBytes", &Tuning::smallBytes},
    {"ownedChunkBytes", &Tuning::ownedChunkBytes},
};

}  // namespace

SegmentLayout SegmentLayout::of(int ranks, size_t slotBytes, size_t arenaBytes) {
  SegmentLayout l{};
  l.controlOffset = kPage;
  l.stagingOffset = roundUp(l.controlOffset + sizeof(RankControl) * ranks, kHuge);
  l.arenaOffset = roundUp(l.stagingOffset + 2 * slotBytes * ranks, kHuge);
  l.bytes = l.arenaOffset + arenaBytes * ranks;
  return l;
}

int64_t Segment::ownOffset(const void* p, size_t bytes) const {
  const char* c = static_cast<const char*>(p);
  const char* lo = arena(rank_);
  if (c < lo || c + bytes > lo + arenaBytes() || c + bytes < c) return -1;
  return c - base_;
}

std::shared_ptr<Segment> Segment::join(const SegmentOptions& o) {
  const std::string who = o.who.empty() ? fmt::format("rank {}/{}", o.rank, o.size) : o.who;
  const Tuning& t = o.tuning;
  DTRAIN_CHECK_ARG(t.slotBytes >= kPage && t.slotBytes % kPage == 0,
                   "{}: shared memory: slot size {} must be a multiple of 4096", who, t.slotBytes);
  DTRAIN_CHECK_ARG(t.arenaBytes % kHuge == 0,
                   "{}: shared memory: arena size {} must be a "
                   "multiple of 2 MiB",
                   who, t.arenaBytes);
  const auto deadline = Clock::now() + o.connectTimeout;
  const std::string key = o.name + "/shm/socket";
  std::shared_ptr<Segment> seg(new Segment());
  seg->rank_ = o.rank;
  seg->size_ = o.size;
  seg->pidfds_.assign(static_cast<size_t>(o.size), -1);
  const int ownPidfd = openOwnPidfd();

  int listenFd = -1;
  if (o.rank == 0) {
    seg->pidfds_[0] = ownPidfd;
    seg->fd_ = createSegmentFile(SegmentLayout::of(o.size, t.slotBytes, t.arenaBytes).bytes, who);
    if (o.size > 1) listenFd = listenForRanks(*o.store, key, o.size, who);
  } else {
    Handover h;
    try {
      o.store->wait({key}, o.connectTimeout);
      h = receiveHandover(o.store->getString(key), o.rank, o.size, ownPidfd, deadline, who);
    } catch (...) {
      if (ownPidfd >= 0) ::close(ownPidfd);
      throw;
    }
    if (ownPidfd >= 0) ::close(ownPidfd);  // rank 0 sent back a copy with the others
    seg->fd_ = h.memfd;
    seg->pidfds_ = std::move(h.pidfds);
  }
  seg->map(who);
  if (o.rank == 0) {
    seg->writeHeader(o);  // the memfd travels to the others only after this
    try {
      if (listenFd >= 0) {
        seg->pidfds_ = serveHandover(listenFd, seg->fd_, ownPidfd, o.size, deadline, who);
      }
    } catch (...) {
      ::close(listenFd);
      throw;
    }
    if (listenFd >= 0) ::close(listenFd);  // Note [Segment lifetime]: the name is gone now
  }
  const SegmentHeader& h = seg->header();
  DTRAIN_CHECK(h.magic == kSegmentMagic && h.version == kSegmentVersion &&
                   h.ranks == static_cast<uint32_t>(o.size),
               "{}: shared memory: the segment rank 0 shared is not a dtrain segment for {} "
               "ranks (magic {:#x}, version {}, ranks {})",
               who, o.size, h.magic, h.version, h.ranks);
  if (seg->hugePages_) {
    ::madvise(seg->base_ + h.stagingOffset, seg->bytes_ - h.stagingOffset, MADV_HUGEPAGE);
  }
  prefault(seg->slot(o.rank, 0), 2 * h.tuning.slotBytes);
  RankControl& me = seg->control(o.rank);
  me.pidNamespace = pidNamespaceId();
  me.tuning = t;
  seg->waitForRanks(deadline, who);
  seg->checkTuning(o.rankNames, who);
  return seg;
}

void Segment::map(const std::string& who) {
  struct stat st {};
  DTRAIN_CHECK(::fstat(fd_, &st) == 0 && st.st_size > 0, "{}: shared memory: fstat: {}", who,
               errnoText(errno));
  bytes_ = static_cast<size_t>(st.st_size);
  // At a 2 MiB-aligned address: the layout puts the arena (and so every buffer of 2 MiB or more)
  // at huge-page offsets, which only become huge pages when the mapping itself is aligned; mmap
  // alone promises 4 KiB. Reserve 2 MiB more, map the segment over its aligned part, return the
  // rest.
  void* reserved = ::mmap(nullptr, bytes_ + kHuge, PROT_NONE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  DTRAIN_CHECK(reserved != MAP_FAILED,
               "{}: shared memory: cannot reserve {} bytes of addresses: {}", who, bytes_ + kHuge,
               errnoText(errno));
  char* const start = static_cast<char*>(reserved);
  char* const aligned = reinterpret_cast<char*>(roundUp(reinterpret_cast<uintptr_t>(start), kHuge));
  void* p = ::mmap(aligned, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE | MAP_FIXED,
                   fd_, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    ::munmap(reserved, bytes_ + kHuge);
    DTRAIN_CHECK(false, "{}: shared memory: cannot map {} bytes: {}", who, bytes_, errnoText(e));
  }
  if (aligned > start) ::munmap(start, static_cast<size_t>(aligned - start));
  char* const end = aligned + bytes_;
  char* const reservedEnd = start + bytes_ + kHuge;
  if (reservedEnd > end) ::munmap(end, static_cast<size_t>(reservedEnd - end));
  base_ = aligned;
  hugePages_ = shmemHugePagesAllowed();
}

void Segment::writeHeader(const SegmentOptions& o) {
  const SegmentLayout layout = SegmentLayout::of(o.size, o.tuning.slotBytes, o.tuning.arenaBytes);
  SegmentHeader& h = header();
  h.ranks = static_cast<uint32_t>(o.size);
  h.bytes = layout.bytes;
  h.controlOffset = layout.controlOffset;
  h.stagingOffset = layout.stagingOffset;
  h.arenaOffset = layout.arenaOffset;
  h.tuning = o.tuning;
  h.version = kSegmentVersion;
  std::atomic_thread_fence(std::memory_order_release);
  h.magic = kSegmentMagic;
}

void Segment::waitForRanks(Clock::time_point deadline, const std::string& who) {
  SegmentHeader& h = header();
  RankControl& me = control(rank_);
  me.pid.store(static_cast<int32_t>(::getpid()), std::memory_order_relaxed);
  // Publishes this rank's pid, namespace and options (written before) to whoever counts it.
  h.joined.fetch_add(1, std::memory_order_seq_cst);
  futexWakeAll(&h.joined);
  while (true) {
    uint32_t joined = h.joined.load(std::memory_order_seq_cst);
    if (joined >= static_cast<uint32_t>(size_)) break;
    if (Clock::now() >= deadline) {
      std::vector<int> missing;
      for (int r = 0; r < size_; ++r) {
        if (control(r).pid.load() == 0) missing.push_back(r);
      }
      DTRAIN_THROW(TimeoutError,
                   "{}: shared memory: rank{} {} did not map the segment within "
                   "the connect timeout",
                   who, missing.size() > 1 ? "s" : "", fmt::join(missing, ", "));
    }
    futexWait(&h.joined, joined, std::chrono::milliseconds(std::min(msLeft(deadline), 100)));
  }
}

// Note [One tuning per segment]
// Ranks that chose different paths for one collective (one reduces the whole buffer at once,
// its peer a slice in chunks) wait for phases the other never runs: a deadlock until the
// collective timeout, and then an error that says nothing of why. So every value that picks a
// path or a place (Tuning) is rank 0's, published in the header, and the engine runs by the
// header's values only; every rank also publishes its own, and once all have joined each rank
// compares them all with the header. A difference fails every rank at once, all with the same
// message: the option, both values, both ranks. Across nodes (hierarchical) the ranks with the
// same local index compare their segments' values over their Gloo group the same way.
void Segment::checkTuning(const std::vector<int>& rankNames, const std::string& who) const {
  auto name = [&](int r) { return rankNames.empty() ? r : rankNames[static_cast<size_t>(r)]; };
  for (int r = 1; r < size_; ++r) {
    const std::string diff = tuningMismatch(tuning(), name(0), control(r).tuning, name(r));
    DTRAIN_CHECK_ARG(diff.empty(),
                     "{}: shared memory: the ranks of this node were given "
                     "different options: {}. HINT: every rank must pass the same ShmOptions "
                     "(slotBytes, arenaBytes, smallBytes, ownedChunkBytes): ranks that pick "
                     "different paths for one collective would wait for each other forever",
                     who, diff);
  }
}

std::string tuningMismatch(const Tuning& ours, int ourRank, const Tuning& theirs, int theirRank) {
  for (const TuningField& f : kTuningFields) {
    if (ours.*f.member == theirs.*f.member) continue;
    return fmt::format("ShmOptions::{} is {} on rank {} and {} on rank {}", f.name, ours.*f.member,
                       ourRank, theirs.*f.member, theirRank);
  }
  return "";
}

bool Segment::samePidNamespace(int rank) const {
  const uint64_t mine = control(rank_).pidNamespace;
  return mine != 0 && control(rank).pidNamespace == mine;
}

Segment::~Segment() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
  if (fd_ >= 0) ::close(fd_);
  for (int fd : pidfds_) {
    if (fd >= 0) ::close(fd);
  }
}

}  // namespace dtrain::comm::shm
