#pragma once
// freePortOn: a TCP port that was free on an address a moment ago (bound to port 0, read back,
// released), for a test or benchmark that must name the port before the program listening on it
// starts. Header-only and gtest-free, so that benchmarks use it without the test support library.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace dtrain::testing {

// 0 when `address` (IPv4, e.g. "127.0.0.1") cannot be bound.
inline int freePortOn(const std::string& address) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  int port = 0;
  socklen_t len = sizeof sa;
  if (::inet_pton(AF_INET, address.c_str(), &sa.sin_addr) == 1 &&
      ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0) {
    port = ntohs(sa.sin_port);
  }
  ::close(fd);
  return port;
}

}  // namespace dtrain::testing
