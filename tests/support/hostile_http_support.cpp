#include "hostile_http_support.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

namespace dtrain::testing {
namespace {

using Clock = std::chrono::steady_clock;

int connectLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string garbage(const std::string& kind) {
  if (kind == "binary") {
    std::string bytes(4096, '\0');
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 131 + 7) % 256);
    return bytes;
  }
  if (kind == "64 KiB request line") {
    return "GET /" + std::string(64 << 10, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n";
  }
  if (kind == "1 MiB header") {
    return "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(1 << 20, 'b') + "\r\n\r\n";
  }
  return "GET /metrics HTTP/1.1\r\nHost: loc";  // truncated
}

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int msLeft(Clock::time_point deadline) {
  return static_cast<int>(std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count()));
}

}  // namespace

const std::vector<std::string>& HostileHttpClients::garbageKinds() {
  static const std::vector<std::string> kinds = {"binary", "64 KiB request line", "1 MiB header",
                                                 "truncated request"};
  return kinds;
}

HostileHttpClients::HostileHttpClients(int port, int idle, int garbageCount) {
  for (int i = 0; i < idle; ++i) {
    const int fd = connectLoopback(port);
    if (fd >= 0) idle_.push_back(fd);
  }
  for (int i = 0; i < garbageCount; ++i) {
    const int fd = connectLoopback(port);
    if (fd < 0) continue;
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    const std::string bytes = garbage(garbageKinds()[i % garbageKinds().size()]);
    (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);  // what fits; never blocks
    garbage_.push_back(fd);
  }
}

HostileHttpClients::~HostileHttpClients() {
  for (int fd : idle_) ::close(fd);
  for (int fd : garbage_) ::close(fd);
}

std::vector<std::string> HostileHttpClients::garbageAnswers(double seconds) const {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(seconds));
  std::vector<std::string> answers(garbage_.size());
  std::vector<bool> done(garbage_.size(), false);
  size_t left = garbage_.size();
  while (left > 0) {
    std::vector<pollfd> p;
    std::vector<size_t> which;
    for (size_t i = 0; i < garbage_.size(); ++i) {
      if (!done[i]) {
        p.push_back(pollfd{garbage_[i], POLLIN, 0});
        which.push_back(i);
      }
    }
    if (::poll(p.data(), p.size(), msLeft(deadline)) <= 0) break;
    for (size_t k = 0; k < p.size(); ++k) {
      if (p[k].revents == 0) continue;
      const size_t i = which[k];
      char buf[4096];
      const ssize_t n = ::recv(garbage_[i], buf, sizeof buf, 0);
      if (n > 0) answers[i].append(buf, static_cast<size_t>(n));
      if (n <= 0 || answers[i].find("\r\n") != std::string::npos) {
        answers[i] = answers[i].substr(0, answers[i].find("\r\n"));
        done[i] = true;
        --left;
      }
    }
  }
  for (size_t i = 0; i < garbage_.size(); ++i) {
    if (!done[i]) answers[i].clear();
  }
  return answers;
}

bool HostileHttpClients::idleStillOpen() const {
  for (int fd : idle_) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 0) != 0) return false;  // readable: closed (EOF) or reset
  }
  return true;
}

ScrapeResult timedScrape(int port, const std::string& path, double timeoutSeconds) {
  ScrapeResult r;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(timeoutSeconds));
  const int fd = connectLoopback(port);
  if (fd < 0) {
    r.error = std::string("connect: ") + std::strerror(errno);
    return r;
  }
  const std::string request = "GET " + path +
                              " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  std::string answer;
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    r.error = std::string("send: ") + std::strerror(errno);
  }
  while (r.error.empty()) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, msLeft(deadline)) <= 0) {
      r.error = "no answer within the timeout";
      break;
    }
    char buf[16384];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0) r.error = std::string("recv: ") + std::strerror(errno);
    if (n <= 0) break;
    answer.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  r.seconds = secondsSince(start);
  const size_t headEnd = answer.find("\r\n\r\n");
  if (r.error.empty() && answer.compare(0, 9, "HTTP/1.1 ") == 0 && headEnd != std::string::npos) {
    r.status = std::atoi(answer.c_str() + 9);
    r.body = answer.substr(headEnd + 4);
  } else if (r.error.empty()) {
    r.error = "not an HTTP answer: " + answer.substr(0, 80);
  }
  return r;
}

}  // namespace dtrain::testing
