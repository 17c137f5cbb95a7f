#include "shm_segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "byte_layout.h"
#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "shm_wait.h"

namespace dtrain::comm::shm {

// Note [Segment lifetime]
// A segment must never outlive its job, even when every process of the job is SIGKILLed at once,
// and must not depend on /dev/shm (containers often mount a 64 MiB one). So it has no name: rank 0
// creates a memfd, and the others receive its file descriptor over an abstract Unix socket whose
// random name rank 0 posts to the job's store. Abstract sockets vanish with their last descriptor,
// and rank 0 closes it as soon as every peer has its copy; from then on the segment exists only
// as the mappings and descriptors of the ranks, and the kernel frees it when the last of them
// exits, however it exits. Nothing is left in the file system for a launcher to clean up.
//
// The socket accepts only processes of this user (SO_PEERCRED) and each rank only once; its name
// carries 64 random bits, and it exists only while the communicator is being created.

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kPage = 4096;
constexpr size_t kHuge = size_t{2} << 20;

std::string errnoText(int e) { return std::strerror(e); }

// Unique per communicator: the store prefix differs between groups and restart rounds, the
// random part between two creations under the same prefix (a test reusing a store).
std::string randomSocketName() {
  uint64_t r[2] = {0, 0};
  if (getrandom(r, sizeof(r), 0) != static_cast<ssize_t>(sizeof(r))) {
    r[0] = static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^
           (static_cast<uint64_t>(getpid()) << 32);
    r[1] = reinterpret_cast<uintptr_t>(&r);
  }
  return fmt::format("dtrain-shm-{:016x}{:016x}", r[0], r[1]);
}

sockaddr_un abstractAddress(const std::string& name, socklen_t* len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  DTRAIN_CHECK(name.size() + 1 < sizeof(addr.sun_path), "socket name too long: {}", name);
  addr.sun_path[0] = '\0';  // abstract namespace
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return addr;
}

int msLeft(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

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

// A one-byte message with room for one file descriptor (SCM_RIGHTS): how the memfd travels.
struct FdMessage {
  char byte;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};

  explicit FdMessage(char b) : byte(b) {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
  }
  FdMessage(const FdMessage&) = delete;
  FdMessage& operator=(const FdMessage&) = delete;
};

// Rank 0: accepts one connection from every other rank and sends each the memfd.
void serveDescriptor(int listenFd, int memfd, int size, Clock::time_point deadline,
                     const std::string& who) {
  std::vector<bool> served(static_cast<size_t>(size), false);
  served[0] = true;
  int left = size - 1;
  while (left > 0) {
    pollfd p{listenFd, POLLIN, 0};
    int n = ::poll(&p, 1, std::min(msLeft(deadline), 100));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {
      if (Clock::now() < deadline) continue;
      std::vector<int> missing;
      for (int r = 1; r < size; ++r) {
        if (!served[r]) missing.push_back(r);
      }
      DTRAIN_THROW(TimeoutError, "{}: shared memory: rank{} {} did not ask for the segment "
                   "within the connect timeout. HINT: every rank of the node must create the "
                   "communicator; DTRAIN_SHM=0 falls back to Gloo",
                   who, missing.size() > 1 ? "s" : "", fmt::join(missing, ", "));
    }
    int conn = ::accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    ucred cred{};
    socklen_t len = sizeof(cred);
    int32_t peerRank = -1;
    bool ok = ::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 &&
              (cred.uid == ::geteuid() || ::geteuid() == 0);
    if (ok) {
      pollfd rp{conn, POLLIN, 0};
      ok = ::poll(&rp, 1, std::max(1, std::min(msLeft(deadline), 5000))) == 1 &&
           ::recv(conn, &peerRank, sizeof(peerRank), MSG_WAITALL) ==
               static_cast<ssize_t>(sizeof(peerRank)) &&
           peerRank > 0 && peerRank < size && !served[peerRank];
    }
    if (ok) {
      FdMessage m('m');
      cmsghdr* c = CMSG_FIRSTHDR(&m.msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &memfd, sizeof(int));
      if (::sendmsg(conn, &m.msg, MSG_NOSIGNAL) == 1) {
        served[peerRank] = true;
        --left;
      }
    } else {
      DTRAIN_LOG(Warn, "{}: shared memory: refused a connection (pid {}, uid {}) that is not one "
                 "of this job's ranks", who, cred.pid, cred.uid);
    }
    ::close(conn);
  }
}

// Ranks 1..n-1: receives the memfd from rank 0.
int receiveDescriptor(const std::string& socketName, int rank, Clock::time_point deadline,
                      const std::string& who) {
  socklen_t len = 0;
  sockaddr_un addr = abstractAddress(socketName, &len);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  DTRAIN_CHECK(fd >= 0, "{}: shared memory: socket(): {}", who, errnoText(errno));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    int e = errno;
    ::close(fd);
    DTRAIN_THROW(Error, "{}: shared memory: cannot reach rank 0's segment socket: {}. HINT: "
                 "the ranks of one node must share a network namespace to exchange the segment; "
                 "DTRAIN_SHM=0 falls back to Gloo", who, errnoText(e));
  }
  int32_t r = rank;
  FdMessage m(0);
  pollfd p{fd, POLLIN, 0};
  bool ok = ::send(fd, &r, sizeof(r), MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(r)) &&
            ::poll(&p, 1, std::max(1, msLeft(deadline))) == 1 &&
            ::recvmsg(fd, &m.msg, MSG_CMSG_CLOEXEC) == 1;
  ::close(fd);
  cmsghdr* c = ok ? CMSG_FIRSTHDR(&m.msg) : nullptr;
  DTRAIN_CHECK(c != nullptr && c->cmsg_type == SCM_RIGHTS,
               "{}: shared memory: rank 0 did not hand over the segment", who);
  int memfd = -1;
  std::memcpy(&memfd, CMSG_DATA(c), sizeof(int));
  return memfd;
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

// Rank 0: listens on a fresh abstract socket and posts its name under `key` for the others.
int listenForRanks(store::Store& store, const std::string& key, int size, const std::string& who) {
  const std::string name = randomSocketName();
  socklen_t len = 0;
  sockaddr_un addr = abstractAddress(name, &len);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  DTRAIN_CHECK(fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0 &&
                   ::listen(fd, size) == 0,
               "{}: shared memory: cannot listen on an abstract socket: {}", who,
               errnoText(errno));
  store.setString(key, name);
  store.flush();
  return fd;
}

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
  const std::string who = fmt::format("rank {}/{}", o.rank, o.size);
  DTRAIN_CHECK_ARG(o.slotBytes >= kPage && o.slotBytes % kPage == 0,
                   "{}: shared memory: slot size {} must be a multiple of 4096", who, o.slotBytes);
  DTRAIN_CHECK_ARG(o.arenaBytes % kHuge == 0, "{}: shared memory: arena size {} must be a "
                   "multiple of 2 MiB", who, o.arenaBytes);
  const auto deadline = Clock::now() + o.connectTimeout;
  const std::string key = o.name + "/shm/socket";
  std::shared_ptr<Segment> seg(new Segment());
  seg->rank_ = o.rank;
  seg->size_ = o.size;

  int listenFd = -1;
  if (o.rank == 0) {
    seg->fd_ = createSegmentFile(SegmentLayout::of(o.size, o.slotBytes, o.arenaBytes).bytes, who);
    if (o.size > 1) listenFd = listenForRanks(*o.store, key, o.size, who);
  } else {
    o.store->wait({key}, o.connectTimeout);
    seg->fd_ = receiveDescriptor(o.store->getString(key), o.rank, deadline, who);
  }
  seg->map(who);
  if (o.rank == 0) {
    seg->writeHeader(o);  // the memfd travels to the others only after this
    try {
      if (listenFd >= 0) serveDescriptor(listenFd, seg->fd_, o.size, deadline, who);
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
  prefault(seg->slot(o.rank, 0), 2 * h.slotBytes);
  seg->waitForRanks(deadline, who);
  return seg;
}

void Segment::map(const std::string& who) {
  struct stat st{};
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
  const SegmentLayout layout = SegmentLayout::of(o.size, o.slotBytes, o.arenaBytes);
  SegmentHeader& h = header();
  h.ranks = static_cast<uint32_t>(o.size);
  h.bytes = layout.bytes;
  h.controlOffset = layout.controlOffset;
  h.stagingOffset = layout.stagingOffset;
  h.slotBytes = o.slotBytes;
  h.arenaOffset = layout.arenaOffset;
  h.arenaBytes = o.arenaBytes;
  h.version = kSegmentVersion;
  std::atomic_thread_fence(std::memory_order_release);
  h.magic = kSegmentMagic;
}

void Segment::waitForRanks(Clock::time_point deadline, const std::string& who) {
  SegmentHeader& h = header();
  RankControl& me = control(rank_);
  me.pid.store(static_cast<int32_t>(::getpid()), std::memory_order_relaxed);
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
      DTRAIN_THROW(TimeoutError, "{}: shared memory: rank{} {} did not map the segment within "
                   "the connect timeout", who, missing.size() > 1 ? "s" : "",
                   fmt::join(missing, ", "));
    }
    futexWait(&h.joined, joined, std::chrono::milliseconds(std::min(msLeft(deadline), 100)));
  }
}

Segment::~Segment() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace dtrain::comm::shm
