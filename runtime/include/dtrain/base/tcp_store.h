#pragma once
// The job's rendezvous store over TCP.
//
// TcpStoreServer: one libuv event-loop thread serving every client; waiting clients cost no
// thread; length-prefixed binary frames with limits checked before any allocation; optional
// HMAC-SHA256 challenge-response with the job token before any operation. Bad clients are dropped
// and logged with their address; everyone else keeps being served.
//
// TcpStore: the client, a Store. Connects with retry and backoff until connectTimeout; every
// operation has a deadline. Safe to share between threads (one request in flight at a time).
// set() is pipelined, as c10d's: see TcpStore below.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/base/store.h"

namespace dtrain::store {

constexpr Millis kDefaultConnectTimeout{60000};
constexpr Millis kDefaultHandshakeTimeout{10000};
// The default idle timeout is none: idle clients are kept (workers stay silent for hours).
constexpr Millis kDefaultIdleTimeout{0};
constexpr Millis kDefaultFrameTimeout{30000};
constexpr uint16_t kDefaultStorePort = 29400;

// Wire limits, checked before allocating.
struct StoreLimits {
  size_t maxKeyBytes = 8 * 1024;
  size_t maxValueBytes = 64 * 1024 * 1024;
  size_t maxKeysPerRequest = 4096;
};

// Every timeout below: zero means its default (Note [Zero timeouts] in dtrain/base/timeout.h).
struct TcpStoreServerOptions {
  std::string host = "127.0.0.1";  // the address to bind; "0.0.0.0" for every interface
  uint16_t port = 0;               // 0: a free port, see TcpStoreServer::port()
  std::string token;               // empty: no authentication
  // Without a token the server binds only loopback addresses: on any other address anyone who
  // can reach the port could read and write the job's keys (docs/reliability.md S17). Set this to
  // serve a network without a token anyway.
  bool allowNoTokenOffLoopback = false;
  StoreLimits limits;
  Millis handshakeTimeout = kDefaultHandshakeTimeout;  // a connection must authenticate / send
                                                       // its first frame within this
  Millis idleTimeout = kDefaultIdleTimeout;            // default: none (idle clients are kept)
  Millis frameTimeout = kDefaultFrameTimeout;  // a frame whose first byte came must be complete
                                               // within this (half a frame then silence)
  int backlog = 1024;
  // Requests are counted by class (TcpStoreServer::requestCounts()): `classify` maps a request's
  // first key to a class below `requestClasses` (larger values count in the last class); without
  // it every request is class 0. Runs on the server's thread for every request: keep it cheap.
  size_t requestClasses = 1;
  std::function<size_t(const std::string& key)> classify;
};

class TcpStoreServer {
 public:
  // Binds and starts serving; throws NetworkError naming address and port when it cannot bind
  // (never falls back to being a client).
  static std::unique_ptr<TcpStoreServer> start(const TcpStoreServerOptions& options);
  virtual ~TcpStoreServer() = default;

  virtual uint16_t port() const = 0;
  virtual std::string host() const = 0;
  // Number of connected clients right now.
  virtual size_t numConnections() const = 0;
  // Get/Wait requests parked on missing keys right now (each costs no thread).
  virtual size_t numWaiting() const = 0;
  // Requests served so far (every frame after the handshake, pipelined sets too), by the classes
  // of TcpStoreServerOptions::classify. Thread-safe.
  virtual std::vector<uint64_t> requestCounts() const = 0;
  // Stops serving and closes every connection; clients waiting get NetworkError. Idempotent.
  virtual void stop() = 0;
};

// Every timeout below: zero means its default (Note [Zero timeouts] in dtrain/base/timeout.h).
struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  uint16_t port = kDefaultStorePort;
  std::string token;  // empty: take DTRAIN_STORE_TOKEN from the environment when set
  Millis connectTimeout = kDefaultConnectTimeout;
  Millis timeout = kDefaultStoreTimeout;               // every operation
  Millis handshakeTimeout = kDefaultHandshakeTimeout;  // per connection attempt, after connect
  StoreLimits limits;  // checked here too, so an oversize key fails before it is sent
  // false: set() returns once its request is sent (see TcpStore). true: set() waits for the
  // server's acknowledgement, a round trip each (many sets take several times as long as pipelined
  // ones: benchmarks/README.md, store_bench).
  bool acknowledgedSets = false;
};

// The job's store, seen from a worker. Every operation but set() is one round trip.
//
// set() is pipelined (docs/design.md "Pipelined sets"): when it returns, the value has been sent,
// not necessarily applied. The next call on the same client (any operation, in any thread),
// flush(), or the destructor guarantees that it was applied, or reports why not: an error of a set
// that already returned -- the server refused it, or the connection was lost
// or timed out before it was acknowledged -- is thrown by the next call on this client, before
// that call does anything itself, and names the set's key (and any later ones it took along).
// set() throws by itself only when its own request could not be sent. The destructor waits for
// outstanding sets (at most a few seconds) and logs what it cannot report; call flush() where an
// error must reach the caller, and before ending a process without destructors (_exit, exec).
// Other clients see a set in the order it was sent, once the server applied it -- as with
// c10d::TCPStore, whose set() is one-way too: a get()/wait() elsewhere waits for it, a check()
// elsewhere right after set() returns may not see it yet. TcpStoreOptions::acknowledgedSets
// makes set() wait for the server instead.
class TcpStore : public Store {
 public:
  // Connects and authenticates; throws NetworkError / TimeoutError naming host:port, or Error
  // when the server refuses the token.
  explicit TcpStore(const TcpStoreOptions& options);
  ~TcpStore() override;

  void set(const std::string& key, const Bytes& value) override;
  // Returns once the server has applied every set() sent before; throws the first error among
  // them (then the error is reported, and later calls go on).
  void flush() override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  using Store::wait;
  bool check(const std::vector<std::string>& keys) override;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  std::vector<std::optional<Bytes>> tryMultiGet(const std::vector<std::string>& keys) override;
  Bytes waitChanged(const std::string& key, const Bytes& seen, Millis timeout) override;
  std::string describe() const override;  // "host:port"

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::store
