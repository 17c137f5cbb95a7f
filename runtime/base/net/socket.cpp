#include "net/socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace dtrain::net {

std::string hostPort(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

std::string errnoText(int err) {
  const char* name = strerrorname_np(err);
  const char* desc = strerrordesc_np(err);
  return fmt::format("{} ({})", desc ? desc : "unknown error", name ? name : std::to_string(err));
}

long long msSince(TimePoint start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

std::string hostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.release();
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

namespace {

// Waits for `events` until `deadline`. 1: ready; 0: deadline passed; -1: poll failed (errno).
// A signal (EINTR) only recomputes the time left.
int waitFor(int fd, short events, TimePoint deadline) {
  for (bool last = false; !last;) {
    auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) {
      // One last look without waiting: what is already there (a refusal, an answer) counts.
      left = Clock::duration::zero();
      last = true;
    }
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    pollfd p{fd, events, 0};
    int rc = ::ppoll(&p, 1, &ts, nullptr);
    if (rc > 0) return 1;
    if (rc == 0) continue;  // re-check the clock: ppoll may wake a little early
    if (errno == EINTR) continue;
    return -1;
  }
  return 0;
}

Socket connectAddress(const addrinfo* ai, TimePoint deadline, int* err) {
  Socket s(
      ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
  if (!s.valid()) {
    *err = errno;
    return s;
  }
  int one = 1;
  ::setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (::connect(s.fd(), ai->ai_addr, ai->ai_addrlen) == 0) return s;
  if (errno != EINPROGRESS && errno != EINTR) {
    *err = errno;
    return Socket();
  }
  int rc = waitFor(s.fd(), POLLOUT, deadline);
  if (rc <= 0) {
    *err = rc == 0 ? ETIMEDOUT : errno;
    return Socket();
  }
  int soError = 0;
  socklen_t len = sizeof(soError);
  if (::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &soError, &len) != 0) soError = errno;
  if (soError != 0) {
    *err = soError;
    return Socket();
  }
  return s;
}

}  // namespace

Socket connectOnce(const std::string& host, uint16_t port, TimePoint deadline, std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* list = nullptr;
  std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &list);
  if (rc != 0) {
    *why = fmt::format("cannot resolve \"{}\": {}", host,
                       rc == EAI_SYSTEM ? errnoText(errno) : ::gai_strerror(rc));
    return Socket();
  }
  Socket s;
  int err = 0;
  for (addrinfo* ai = list; ai != nullptr && !s.valid(); ai = ai->ai_next) {
    s = connectAddress(ai, deadline, &err);
  }
  ::freeaddrinfo(list);
  if (!s.valid()) *why = errnoText(err);
  return s;
}

IoResult sendAll(int fd, const uint8_t* data, size_t size, TimePoint deadline) {
  IoResult r;
  while (r.done < size) {
    ssize_t n = ::send(fd, data + r.done, size - r.done, MSG_NOSIGNAL);
    if (n > 0) {
      r.done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int w = waitFor(fd, POLLOUT, deadline);
      if (w == 1) continue;
      r.status = w == 0 ? IoStatus::Timeout : IoStatus::Error;
      r.err = w == 0 ? 0 : errno;
      return r;
    }
    r.err = n == 0 ? EIO : errno;
    r.status = (r.err == EPIPE || r.err == ECONNRESET) ? IoStatus::Closed : IoStatus::Error;
    return r;
  }
  return r;
}

IoResult recvAtLeast(int fd, uint8_t* data, size_t min, size_t max, TimePoint deadline) {
  IoResult r;
  while (r.done < min) {
    ssize_t n = ::recv(fd, data + r.done, max - r.done, 0);
    if (n > 0) {
      r.done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      r.status = IoStatus::Closed;
      return r;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      int w = waitFor(fd, POLLIN, deadline);
      if (w == 1) continue;
      r.status = w == 0 ? IoStatus::Timeout : IoStatus::Error;
      r.err = w == 0 ? 0 : errno;
      return r;
    }
    r.err = errno;
    r.status = r.err == ECONNRESET ? IoStatus::Closed : IoStatus::Error;
    return r;
  }
  return r;
}

IoResult recvAvailable(int fd, uint8_t* data, size_t max) {
  IoResult r;
  if (max == 0) return r;
  for (;;) {
    // One call: it returns everything queued up to `max`, and a second would mostly say EAGAIN.
    ssize_t n = ::recv(fd, data, max, MSG_DONTWAIT);
    if (n > 0) {
      r.done = static_cast<size_t>(n);
      return r;
    }
    if (n == 0) {
      r.status = IoStatus::Closed;
      return r;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return r;
    r.err = errno;
    r.status = r.err == ECONNRESET ? IoStatus::Closed : IoStatus::Error;
    return r;
  }
}

}  // namespace dtrain::net
