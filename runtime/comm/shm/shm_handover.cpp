#include "shm_handover.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"

namespace dtrain::comm::shm {

namespace {

using Clock = HandoverClock;

// Descriptors per message: SCM_RIGHTS takes at most 253.
constexpr uint32_t kBatch = 64;

// What travels (SOCK_SEQPACKET: one recvmsg, one message, its descriptors with it).
struct Hello {  // rank -> rank 0, with the rank's pidfd when it has one
  int32_t rank;
  uint32_t hasPidfd;
};
struct Pidfds {  // rank 0 -> rank, after the memfd: `count` ranks from `first`, their pidfds
  uint32_t first;
  uint32_t count;
  uint8_t has[kBatch];
};

void closeAll(const std::vector<int>& fds) {
  for (int fd : fds) {
    if (fd >= 0) ::close(fd);
  }
}

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

// One message with `fds` attached (none: plain data).
bool sendMessage(int sock, const void* data, size_t bytes, const int* fds, size_t n) {
  iovec iov{const_cast<void*>(data), bytes};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kBatch)] = {};
  if (n > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * n);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * n);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
  }
  return ::sendmsg(sock, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(bytes);
}

// One message of exactly `bytes` bytes by the deadline; its descriptors are appended to `fds`
// (close-on-exec). False on a short or missing message.
bool receiveMessage(int sock, void* data, size_t bytes, std::vector<int>* fds,
                    Clock::time_point deadline) {
  pollfd p{sock, POLLIN, 0};
  int ready = 0;
  do {
    ready = ::poll(&p, 1, std::max(1, msLeft(deadline)));
  } while (ready < 0 && errno == EINTR);
  if (ready != 1) return false;
  iovec iov{data, bytes};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kBatch)] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds->push_back(fd);
    }
  }
  return n == static_cast<ssize_t>(bytes) && (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) == 0;
}

// Rank 0 to one rank: the memfd, then every rank's pidfd in batches.
bool sendHandover(int conn, int memfd, const std::vector<int>& pidfds) {
  const char tag = 'm';
  if (!sendMessage(conn, &tag, 1, &memfd, 1)) return false;
  const uint32_t size = static_cast<uint32_t>(pidfds.size());
  for (uint32_t first = 0; first < size; first += kBatch) {
    Pidfds batch{};
    batch.first = first;
    batch.count = std::min(kBatch, size - first);
    int fds[kBatch];
    size_t n = 0;
    for (uint32_t i = 0; i < batch.count; ++i) {
      const int fd = pidfds[first + i];
      batch.has[i] = fd >= 0 ? 1 : 0;
      if (fd >= 0) fds[n++] = fd;
    }
    if (!sendMessage(conn, &batch, sizeof(batch), fds, n)) return false;
  }
  return true;
}

}  // namespace

std::string errnoText(int e) { return std::strerror(e); }

int msLeft(HandoverClock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                    HandoverClock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

int openOwnPidfd() { return static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0)); }

int listenForRanks(store::Store& store, const std::string& key, int size, const std::string& who) {
  const std::string name = randomSocketName();
  socklen_t len = 0;
  sockaddr_un addr = abstractAddress(name, &len);
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(fd, size) != 0) {
    const int e = errno;
    if (fd >= 0) ::close(fd);
    DTRAIN_THROW(Error, "{}: shared memory: cannot listen on an abstract socket: {}", who,
                 errnoText(e));
  }
  store.setString(key, name);
  store.flush();
  return fd;
}

std::vector<int> serveHandover(int listenFd, int memfd, int ownPidfd, int size,
                               Clock::time_point deadline, const std::string& who) {
  std::vector<int> pidfds(static_cast<size_t>(size), -1);
  std::vector<int> conns(static_cast<size_t>(size), -1);
  pidfds[0] = ownPidfd;
  auto fail = [&](auto&& thrower) {
    closeAll(conns);
    for (size_t r = 1; r < pidfds.size(); ++r) {
      if (pidfds[r] >= 0) ::close(pidfds[r]);
    }
    thrower();
  };
  for (int left = size - 1; left > 0;) {
    pollfd p{listenFd, POLLIN, 0};
    const int n = ::poll(&p, 1, std::min(msLeft(deadline), 100));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {
      if (Clock::now() < deadline) continue;
      std::vector<int> missing;
      for (int r = 1; r < size; ++r) {
        if (conns[r] < 0) missing.push_back(r);
      }
      fail([&] {
        DTRAIN_THROW(TimeoutError,
                     "{}: shared memory: rank{} {} did not ask for the segment "
                     "within the connect timeout. HINT: every rank of the node must create the "
                     "communicator; DTRAIN_SHM=0 falls back to Gloo",
                     who, missing.size() > 1 ? "s" : "", fmt::join(missing, ", "));
      });
    }
    const int conn = ::accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    ucred cred{};
    socklen_t len = sizeof(cred);
    Hello hello{-1, 0};
    std::vector<int> fds;
    const bool ok = ::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 &&
                    (cred.uid == ::geteuid() || ::geteuid() == 0) &&
                    receiveMessage(conn, &hello, sizeof(hello), &fds,
                                   std::min(deadline, Clock::now() + std::chrono::seconds(5))) &&
                    hello.rank > 0 && hello.rank < size && conns[hello.rank] < 0 &&
                    fds.size() == (hello.hasPidfd != 0 ? 1u : 0u);
    if (!ok) {
      closeAll(fds);
      ::close(conn);
      // The pid is the peer's as this rank's PID namespace sees it (0: not visible from here).
      DTRAIN_LOG(Warn,
                 "{}: shared memory: refused a connection (pid {}, uid {}) that is not one "
                 "of this job's ranks",
                 who, cred.pid, cred.uid);
      continue;
    }
    conns[hello.rank] = conn;
    pidfds[hello.rank] = fds.empty() ? -1 : fds[0];
    --left;
  }
  for (int r = 1; r < size; ++r) {
    if (!sendHandover(conns[r], memfd, pidfds)) {
      const int e = errno;
      fail([&] {
        DTRAIN_THROW(Error, "{}: shared memory: cannot hand the segment to rank {}: {}", who, r,
                     errnoText(e));
      });
    }
  }
  closeAll(conns);
  return pidfds;
}

Handover receiveHandover(const std::string& socketName, int rank, int size, int ownPidfd,
                         Clock::time_point deadline, const std::string& who) {
  socklen_t len = 0;
  sockaddr_un addr = abstractAddress(socketName, &len);
  const int sock = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  DTRAIN_CHECK(sock >= 0, "{}: shared memory: socket(): {}", who, errnoText(errno));
  if (::connect(sock, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    const int e = errno;
    ::close(sock);
    DTRAIN_THROW(Error,
                 "{}: shared memory: cannot reach rank 0's segment socket: {}. HINT: "
                 "the ranks of one node must share a network namespace to exchange the segment; "
                 "DTRAIN_SHM=0 falls back to Gloo",
                 who, errnoText(e));
  }
  Handover h;
  h.pidfds.assign(static_cast<size_t>(size), -1);
  std::vector<int> received;
  auto cleanup = [&] {
    ::close(sock);
    closeAll(received);
  };
  const Hello hello{rank, ownPidfd >= 0 ? 1u : 0u};
  char tag = 0;
  bool ok = sendMessage(sock, &hello, sizeof(hello), &ownPidfd, ownPidfd >= 0 ? 1 : 0) &&
            receiveMessage(sock, &tag, 1, &received, deadline) && tag == 'm' &&
            received.size() == 1;
  if (ok) h.memfd = received[0];
  for (uint32_t first = 0; ok && first < static_cast<uint32_t>(size); first += kBatch) {
    Pidfds batch{};
    const size_t before = received.size();
    ok = receiveMessage(sock, &batch, sizeof(batch), &received, deadline) && batch.first == first &&
         batch.count == std::min(kBatch, size - first);
    size_t next = before;
    for (uint32_t i = 0; ok && i < batch.count; ++i) {
      if (batch.has[i] == 0) continue;
      ok = next < received.size();
      if (ok) h.pidfds[first + i] = received[next++];
    }
    ok = ok && next == received.size();
  }
  if (!ok) {
    cleanup();
    DTRAIN_THROW(Error,
                 "{}: shared memory: rank 0 did not hand over the segment (it failed, "
                 "or timed out waiting for another rank of this node)",
                 who);
  }
  ::close(sock);
  return h;
}

}  // namespace dtrain::comm::shm
