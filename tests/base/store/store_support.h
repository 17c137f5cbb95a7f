#pragma once
// Helpers for the TcpStore tests: servers on port 0 with short test timeouts, a raw-socket client
// that speaks (or breaks) the wire format byte by byte, a hand-driven fake server, and process
// measurements.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "byte_layout.h"
#include "dtrain/base/tcp_store.h"
#include "store/wire.h"

namespace dtrain::store::testing {

using Clock = std::chrono::steady_clock;

TcpStoreServerOptions serverOptions();
TcpStoreOptions clientOptions(const TcpStoreServer& server);

// A frame header made by hand, for frames the encoder would never write: `length` payload bytes,
// then version, type and the two reserved bytes.
inline std::vector<uint8_t> rawHeader(uint64_t length, uint8_t type,
                                      uint8_t version = wire::kVersion, uint16_t reserved = 0) {
  std::vector<uint8_t> h(wire::kHeaderBytes);
  putLE(h.data(), length);
  h[8] = version;
  h[9] = type;
  putLE(h.data() + 10, reserved, 2);
  return h;
}
inline std::vector<uint8_t> rawHeader(uint64_t length, wire::Op op) {
  return rawHeader(length, static_cast<uint8_t>(op));
}
// Appends `v` as a wire u64 (8 bytes, little-endian).
inline void appendU64(std::vector<uint8_t>* b, uint64_t v) {
  b->resize(b->size() + 8);
  putLE(b->data() + b->size() - 8, v);
}

// A blocking TCP socket to 127.0.0.1:port, for hostile and hand-made traffic.
class RawClient {
 public:
  explicit RawClient(uint16_t port);
  ~RawClient();
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  // False when the server has already closed the connection.
  bool send(const std::vector<uint8_t>& bytes);
  bool send(const uint8_t* data, size_t size);
  // Exactly `n` bytes, or fewer when the peer closed or `timeout` passed.
  std::vector<uint8_t> recv(size_t n, std::chrono::milliseconds timeout);
  // Runs the client half of the handshake (with `token`, "" for none); true when accepted.
  bool handshake(const std::string& token = "");
  // True when the server closed the connection (EOF or reset) within `timeout`; bytes it sent
  // first are skipped.
  bool closedByServer(std::chrono::milliseconds timeout);
  // The same, without reading anything: for a client that must not drain its replies.
  bool hungUpByServer(std::chrono::milliseconds timeout);
  // Closes with a reset (SO_LINGER 0), as a crashing peer's kernel may.
  void reset();

 private:
  int fd_ = -1;
};

// A store server driven by hand, for tests of what a client does with answers that come late,
// never, or wrong: listens on 127.0.0.1 (port 0), runs the server half of the handshake for one
// client at a time (no token), then hands the test each request and sends what it is told.
class FakeServer {
 public:
  FakeServer();
  ~FakeServer();
  FakeServer(const FakeServer&) = delete;
  FakeServer& operator=(const FakeServer&) = delete;

  uint16_t port() const { return port_; }
  // A TcpStore connected to this server (test timeouts; `adjust` may change them), the server
  // side of the handshake run meanwhile.
  std::unique_ptr<TcpStore> connect(const std::function<void(TcpStoreOptions&)>& adjust = {});
  // The client's next request; false when it closed, sent garbage, or `timeout` passed.
  bool readRequest(wire::Request* out, std::chrono::milliseconds timeout);
  bool send(const std::vector<uint8_t>& frame);
  bool sendAck() { return send(wire::encodeResponse(wire::Status::Ok, {})); }
  // Closes the client's connection (an orderly close: the client reads what was sent first).
  void closeClient();

 private:
  bool recvExactly(uint8_t* data, size_t n, std::chrono::milliseconds timeout);

  int listener_ = -1;
  int client_ = -1;
  uint16_t port_ = 0;
};

// This process's resident set, in bytes (/proc/self/statm).
size_t residentBytes();
// What AddressSanitizer keeps resident beyond the program's own memory -- freed blocks held in
// quarantine (16 MiB under scripts/sanitize.sh) and per-thread allocator caches -- and 0 in a
// normal build: added to the bounds of memory-growth assertions.
#if defined(__SANITIZE_ADDRESS__)
constexpr size_t kSanitizerResidentSlack = size_t{32} << 20;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr size_t kSanitizerResidentSlack = size_t{32} << 20;
#else
constexpr size_t kSanitizerResidentSlack = 0;
#endif
#else
constexpr size_t kSanitizerResidentSlack = 0;
#endif
// Raises RLIMIT_NOFILE's soft limit to the hard one; returns the new soft limit.
size_t raiseFdLimit();
// Polls `condition` every few ms until it holds or `timeout` passes.
bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout);

}  // namespace dtrain::store::testing
