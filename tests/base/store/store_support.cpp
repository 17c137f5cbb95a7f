#include "store_support.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "store/auth.h"
#include "store/wire.h"

namespace dtrain::store::testing {

namespace {

// Waits until `fd` reports one of `events` or `deadline` passes (EINTR retried); returns the
// reported events, 0 on timeout or failure.
short pollUntil(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return 0;
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, static_cast<int>(left.count()));
    if (rc < 0 && errno == EINTR) continue;
    return rc > 0 ? p.revents : 0;
  }
}

// Receives until `n` bytes arrived, the peer closed, a failure, or `deadline`; returns how many.
size_t recvUntil(int fd, uint8_t* data, size_t n, Clock::time_point deadline) {
  size_t done = 0;
  while (done < n && pollUntil(fd, POLLIN, deadline) != 0) {
    ssize_t got = ::recv(fd, data + done, n - done, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

}  // namespace

TcpStoreServerOptions serverOptions() {
  TcpStoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.handshakeTimeout = Millis(5000);
  o.frameTimeout = Millis(5000);
  return o;
}

TcpStoreOptions clientOptions(const TcpStoreServer& server) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = server.port();
  o.connectTimeout = Millis(10000);
  o.timeout = Millis(10000);
  return o;
}

RawClient::RawClient(uint16_t port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

RawClient::~RawClient() {
  if (fd_ >= 0) ::close(fd_);
}

bool RawClient::send(const std::vector<uint8_t>& bytes) { return send(bytes.data(), bytes.size()); }

bool RawClient::send(const uint8_t* data, size_t size) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::send(fd_, data + done, size - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

std::vector<uint8_t> RawClient::recv(size_t n, std::chrono::milliseconds timeout) {
  std::vector<uint8_t> out(n);
  out.resize(recvUntil(fd_, out.data(), n, Clock::now() + timeout));
  return out;
}

bool RawClient::handshake(const std::string& token) {
  wire::Hello hello;
  hello.flags = token.empty() ? 0 : wire::kFlagToken;
  hello.nonce = auth::randomNonce();
  auto h = wire::encodeHello(hello);
  if (!send(h.data(), h.size())) return false;
  auto c = recv(wire::kChallengeBytes, std::chrono::milliseconds(5000));
  wire::Challenge challenge;
  if (c.size() != wire::kChallengeBytes || !wire::decodeChallenge(c.data(), &challenge)) {
    return false;
  }
  wire::Mac proof{};
  if (!token.empty()) proof = auth::clientProof(token, challenge.nonce, hello.nonce);
  if (!send(proof.data(), proof.size())) return false;
  auto v = recv(wire::kVerdictBytes, std::chrono::milliseconds(5000));
  return v.size() == wire::kVerdictBytes && wire::decodeVerdict(v.data()) == 0;
}

bool RawClient::closedByServer(std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  uint8_t sink[4096];
  for (;;) {
    if (pollUntil(fd_, POLLIN, deadline) == 0) return false;
    ssize_t n = ::recv(fd_, sink, sizeof(sink), 0);
    if (n == 0) return true;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno == ECONNRESET;
  }
}

bool RawClient::hungUpByServer(std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  for (;;) {
    short revents = pollUntil(fd_, POLLRDHUP, deadline);
    if (revents == 0) return false;
    if (revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
  }
}

void RawClient::reset() {
  if (fd_ < 0) return;
  linger l{1, 0};
  ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  ::close(fd_);
  fd_ = -1;
}

FakeServer::FakeServer() {
  listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listener_ < 0 || ::bind(listener_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(listener_, 8) != 0 ||
      ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("FakeServer: cannot listen on 127.0.0.1");
    std::abort();
  }
  port_ = ntohs(addr.sin_port);
}

FakeServer::~FakeServer() {
  closeClient();
  if (listener_ >= 0) ::close(listener_);
}

std::unique_ptr<TcpStore> FakeServer::connect(const std::function<void(TcpStoreOptions&)>& adjust) {
  closeClient();
  std::thread server([&] {
    pollfd p{listener_, POLLIN, 0};
    if (::poll(&p, 1, 10000) != 1) return;
    client_ = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client_ < 0) return;
    int one = 1;
    ::setsockopt(client_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    uint8_t hello[wire::kHelloBytes];
    wire::Hello h;
    if (!recvExactly(hello, sizeof(hello), std::chrono::milliseconds(10000)) ||
        !wire::decodeHello(hello, &h)) {
      return;
    }
    wire::Challenge challenge;
    challenge.nonce = auth::randomNonce();
    auto c = wire::encodeChallenge(challenge);
    uint8_t proof[wire::kProofBytes];
    auto verdict = wire::encodeVerdict(wire::kVerdictAccepted);
    if (send(Bytes(c.begin(), c.end())) &&
        recvExactly(proof, sizeof(proof), std::chrono::milliseconds(10000))) {
      send(Bytes(verdict.begin(), verdict.end()));
    }
  });
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port_;
  o.connectTimeout = Millis(10000);
  o.timeout = Millis(10000);
  if (adjust) adjust(o);
  std::unique_ptr<TcpStore> store;
  try {
    store = std::make_unique<TcpStore>(o);
  } catch (...) {
    server.join();
    throw;
  }
  server.join();
  return store;
}

bool FakeServer::recvExactly(uint8_t* data, size_t n, std::chrono::milliseconds timeout) {
  return recvUntil(client_, data, n, Clock::now() + timeout) == n;
}

bool FakeServer::readRequest(wire::Request* out, std::chrono::milliseconds timeout) {
  Bytes frame(wire::kHeaderBytes);
  if (client_ < 0 || !recvExactly(frame.data(), frame.size(), timeout)) return false;
  uint64_t payload = wire::decodeHeader(frame.data()).payloadBytes;
  if (payload > wire::maxRequestPayload(wire::Op::Set, StoreLimits{})) return false;
  frame.resize(wire::kHeaderBytes + payload);
  if (!recvExactly(frame.data() + wire::kHeaderBytes, payload, timeout)) return false;
  return wire::parseRequest(frame.data(), frame.size(), StoreLimits{}, out).status ==
         wire::ParseStatus::Ok;
}

bool FakeServer::send(const std::vector<uint8_t>& frame) {
  size_t done = 0;
  while (done < frame.size()) {
    ssize_t n = ::send(client_, frame.data() + done, frame.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

void FakeServer::closeClient() {
  if (client_ >= 0) ::close(client_);
  client_ = -1;
}

size_t residentBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long size = 0, resident = 0;
  int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

size_t raiseFdLimit() {
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &rl);
  ::getrlimit(RLIMIT_NOFILE, &rl);
  return static_cast<size_t>(rl.rlim_cur);
}

bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return condition();
}

}  // namespace dtrain::store::testing
