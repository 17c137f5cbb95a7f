#pragma once
// Blocking-with-deadline TCP helpers for clients (the store client; other clients may reuse
// them). Every call takes an absolute deadline, survives EINTR (a signal without SA_RESTART only
// recomputes the time left), and reports errno instead of throwing, so callers can word the error
// with what they know (which store, which key, how far it got).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace dtrain::net {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

// "host:port", with brackets around an IPv6 literal.
std::string hostPort(const std::string& host, uint16_t port);
// "Connection refused (ECONNREFUSED)".
std::string errnoText(int err);
// Whole milliseconds since `start`, for messages.
long long msSince(TimePoint start);
// This machine's host name; "localhost" when it has none.
std::string hostName();

// An owned socket; closes on destruction.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void close();

 private:
  int fd_ = -1;
};

enum class IoStatus { Ok, Timeout, Closed, Error };

struct IoResult {
  IoStatus status = IoStatus::Ok;
  int err = 0;      // errno, for Error
  size_t done = 0;  // bytes moved before the result
};

// One connection attempt to every address `host` resolves to, until `deadline`. On success the
// socket is non-blocking with TCP_NODELAY; on failure it is invalid and `*why` says what the last
// address failed with ("Connection refused (ECONNREFUSED)", a resolver message, ...).
Socket connectOnce(const std::string& host, uint16_t port, TimePoint deadline, std::string* why);

// Sends all of `data` on a non-blocking socket.
IoResult sendAll(int fd, const uint8_t* data, size_t size, TimePoint deadline);
// Receives at least `min` and at most `max` bytes on a non-blocking socket. Closed when the peer
// closed before `min` bytes came.
IoResult recvAtLeast(int fd, uint8_t* data, size_t min, size_t max, TimePoint deadline);
// Receives what has already arrived, up to `max` bytes, without waiting: Ok with `done` 0 when
// nothing has; Closed when the peer closed (or reset) the connection.
IoResult recvAvailable(int fd, uint8_t* data, size_t max);

}  // namespace dtrain::net
