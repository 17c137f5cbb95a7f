// TcpStore, the client: connect with backoff, the handshake, and one request at a time.
#include <poll.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "dtrain/error.h"
#include "dtrain/logging.h"
#include "net/socket.h"
#include "store/auth.h"
#include "store/wire.h"

namespace dtrain::store {

namespace {

using net::Clock;
using net::IoStatus;
using wire::Op;
using wire::Status;

constexpr Millis kFirstBackoff{10};
constexpr Millis kMaxBackoff{1000};
// The server answers a Get/Wait at its deadline; we give its answer this long to arrive before
// calling the connection dead.
constexpr Millis kServerGrace{5000};

// Note [Stale connections]
// A server with an idle timeout, or one that restarted, may have closed a connection we still
// hold. Sending on it would fail only after the request is out -- too late to know whether the
// server ran it, so not safe to retry an add(). Before using a connection idle for a while we
// therefore ask the kernel whether the peer has closed it, and reconnect first if so. Requests
// sent back to back skip the check (one poll() each would cost ~1 us on a ~25 us round trip).
constexpr Millis kStaleAfter{10};
constexpr size_t kReceiveBufferBytes = 16 * 1024;

std::string quoted(const std::vector<std::string>& keys, size_t max = 8) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < max; ++i) {
    if (!out.empty()) out += ", ";
    out += '"' + keys[i] + '"';
  }
  if (keys.size() > max) out += fmt::format(" and {} more", keys.size() - max);
  return out;
}

long long msSince(Clock::time_point start) {
  return std::chrono::duration_cast<Millis>(Clock::now() - start).count();
}

// A protocol or token problem: retrying will not help.
class HandshakeRefused : public Error {
 public:
  using Error::Error;
};

}  // namespace

class TcpStore::Impl {
 public:
  Impl(const TcpStoreOptions& options, Store* self) : options_(options), self_(self) {
    where_ = net::hostPort(options.host, options.port);
    token_ = options.token;
    if (token_.empty()) {
      const char* env = std::getenv("DTRAIN_STORE_TOKEN");
      if (env != nullptr) token_ = env;
    }
    DTRAIN_CHECK_ARG(options.port != 0, "store client: port 0 is not a store's port ({}). HINT: "
                     "use the port the server reports", where_);
  }

  const std::string& where() const { return where_; }

  void connect() {
    auto start = Clock::now();
    auto deadline = start + options_.connectTimeout;
    Millis backoff = kFirstBackoff;
    std::minstd_rand jitter(std::random_device{}());
    int attempts = 0;
    std::string why;
    for (;;) {
      ++attempts;
      net::Socket s = net::connectOnce(options_.host, options_.port, deadline, &why);
      if (s.valid()) {
        try {
          handshake(s.fd());
          socket_ = std::move(s);
          DTRAIN_LOG(Debug, "store client connected to {} after {} attempt(s)", where_, attempts);
          return;
        } catch (const HandshakeRefused&) {
          throw;
        } catch (const Error& e) {
          // The server went away mid-handshake (stopping, or at its fd limit): retry.
          why = e.what();
        }
      }
      auto now = Clock::now();
      if (now + Millis(1) >= deadline) break;
      auto sleep = std::min<Clock::duration>(
          Millis(backoff.count() / 2 + jitter() % (backoff.count() / 2 + 1)), deadline - now);
      std::this_thread::sleep_for(sleep);
      backoff = std::min(backoff * 2, kMaxBackoff);
    }
    DTRAIN_THROW(NetworkError,
                 "could not connect to store {} within {} ms ({} attempts); last error: {}. HINT: "
                 "is the launcher (which hosts the store) running, and is {} reachable from this "
                 "host (firewall, --rdzv-endpoint)?",
                 where_, msSince(start), attempts, why, where_);
  }

  // Sends `request` and returns the response's status and payload. `waitMs`: how long the server
  // may legitimately hold the request (Get/Wait), added to the network deadline.
  std::pair<Status, Bytes> roundTrip(const wire::Request& request, Millis waitMs) {
    if (socket_.valid() && Clock::now() - lastUse_ > kStaleAfter && peerClosed()) {
      // See Note [Stale connections].
      DTRAIN_LOG(Info, "store {} closed our idle connection", where_);
      socket_.close();
    }
    if (!socket_.valid()) {
      DTRAIN_LOG(Info, "store client reconnecting to {}", where_);
      connect();
    }
    lastUse_ = Clock::now();
    Bytes frame = wire::encodeRequest(request);
    auto start = Clock::now();
    // A parked Get/Wait is answered by the server at waitMs; anything else promptly.
    auto deadline = start + (waitMs.count() > 0 ? waitMs + kServerGrace
                                                : std::max(self_->timeout(), Millis(1)));
    net::IoResult w = net::sendAll(socket_.fd(), frame.data(), frame.size(), deadline);
    if (w.status != IoStatus::Ok) fail(request, w, start, "sending");

    // One recv usually brings the whole answer: header and payload land in rbuf_ together.
    net::IoResult r = net::recvAtLeast(socket_.fd(), rbuf_.data(), wire::kHeaderBytes,
                                       rbuf_.size(), deadline);
    if (r.status != IoStatus::Ok) fail(request, r, start, "waiting for the answer");
    wire::FrameHeader h = wire::decodeHeader(rbuf_.data());
    uint64_t max = wire::maxResponsePayload(options_.limits);
    if (h.version != wire::kVersion || h.type > static_cast<uint8_t>(Status::Refused) ||
        h.payloadBytes > max) {
      socket_.close();
      DTRAIN_THROW(NetworkError,
                   "store {} answered {} {} with a malformed frame (version {}, type {}, {} "
                   "bytes; limit {}). HINT: is {} a dtrain store of the same version?",
                   where_, wire::opName(request.op), quoted(request.keys), h.version, h.type,
                   h.payloadBytes, max, where_);
    }
    size_t have = r.done - wire::kHeaderBytes;
    if (have > h.payloadBytes) {
      // Frames strictly alternate: bytes past this answer mean the stream is out of step.
      socket_.close();
      DTRAIN_THROW(NetworkError, "store {} sent {} bytes more than its answer to {} {}", where_,
                   have - h.payloadBytes, wire::opName(request.op), quoted(request.keys));
    }
    Bytes payload(rbuf_.begin() + wire::kHeaderBytes, rbuf_.begin() + r.done);
    if (have < h.payloadBytes) {
      payload.resize(static_cast<size_t>(h.payloadBytes));
      r = net::recvAtLeast(socket_.fd(), payload.data() + have, payload.size() - have,
                           payload.size() - have, deadline);
      if (r.status != IoStatus::Ok) fail(request, r, start, "reading the answer");
    }
    if (static_cast<Status>(h.type) == Status::Refused) {
      socket_.close();  // the server closes it too
      wire::Reader in(payload.data(), payload.size());
      std::string message;
      if (!in.string(wire::kMaxErrorBytes, &message)) message = "(unreadable message)";
      DTRAIN_THROW(InvalidArgument,
                   "store {} refused {} {} and closed the connection: {}. HINT: client and server "
                   "limits (StoreLimits) differ?",
                   where_, wire::opName(request.op), quoted(request.keys), message);
    }
    return {static_cast<Status>(h.type), std::move(payload)};
  }

  [[noreturn]] void fail(const wire::Request& request, const net::IoResult& r,
                         Clock::time_point start, const char* doing) {
    // The stream is out of step (or gone): the next operation starts a fresh connection.
    socket_.close();
    std::string what = fmt::format("{} {}", wire::opName(request.op), quoted(request.keys));
    switch (r.status) {
      case IoStatus::Timeout:
        DTRAIN_THROW(TimeoutError,
                     "store {} did not answer {} within {} ms ({}). HINT: the store host may be "
                     "overloaded or unreachable",
                     where_, what, msSince(start), doing);
      case IoStatus::Closed:
        DTRAIN_THROW(NetworkError,
                     "store {} closed the connection during {} ({}, after {} ms){}. HINT: the "
                     "store's host (the launcher) stopped or crashed; see its log",
                     where_, what, doing, msSince(start),
                     r.err ? ": " + net::errnoText(r.err) : std::string());
      default:
        DTRAIN_THROW(NetworkError, "lost the connection to store {} during {} ({}): {}", where_,
                     what, doing, net::errnoText(r.err));
    }
  }

  [[noreturn]] void throwServerError(const wire::Request& request, const Bytes& payload) {
    wire::Reader in(payload.data(), payload.size());
    std::string message;
    if (!in.string(wire::kMaxErrorBytes, &message)) message = "(unreadable error message)";
    DTRAIN_THROW(InvalidArgument, "store {} refused {} {}: {}", where_, wire::opName(request.op),
                 quoted(request.keys), message);
  }

  [[noreturn]] void throwMalformed(const wire::Request& request) {
    socket_.close();
    DTRAIN_THROW(NetworkError, "store {} sent a malformed answer to {} {}", where_,
                 wire::opName(request.op), quoted(request.keys));
  }

  void checkKey(const std::string& key) const {
    DTRAIN_CHECK_ARG(key.size() <= options_.limits.maxKeyBytes,
                     "store key of {} bytes (\"{}...\") exceeds the limit of {} bytes "
                     "(StoreLimits::maxKeyBytes) on store {}",
                     key.size(), key.substr(0, 32), options_.limits.maxKeyBytes, where_);
  }
  void checkValue(const std::string& key, const Bytes& value) const {
    DTRAIN_CHECK_ARG(value.size() <= options_.limits.maxValueBytes,
                     "store value of {} bytes for key \"{}\" exceeds the limit of {} bytes "
                     "(StoreLimits::maxValueBytes) on store {}",
                     value.size(), key, options_.limits.maxValueBytes, where_);
  }
  void checkKeys(const std::vector<std::string>& keys) const {
    DTRAIN_CHECK_ARG(keys.size() <= options_.limits.maxKeysPerRequest,
                     "{} keys in one request exceed the limit of {} (StoreLimits::"
                     "maxKeysPerRequest) on store {}",
                     keys.size(), options_.limits.maxKeysPerRequest, where_);
    for (const auto& k : keys) checkKey(k);
  }

  std::mutex mutex;  // one request in flight at a time

 private:
  void handshake(int fd) {
    auto deadline = Clock::now() + options_.handshakeTimeout;
    wire::Hello hello;
    hello.flags = token_.empty() ? 0 : wire::kFlagToken;
    hello.nonce = auth::randomNonce();
    auto helloBytes = wire::encodeHello(hello);
    expectIo(net::sendAll(fd, helloBytes.data(), helloBytes.size(), deadline), "sending hello");

    uint8_t buf[wire::kChallengeBytes];
    net::IoResult first = net::recvAtLeast(fd, buf, wire::kMagic.size(), sizeof(buf), deadline);
    expectIo(first, "reading its challenge");
    if (!std::equal(wire::kMagic.begin(), wire::kMagic.end(), buf)) {
      throw HandshakeRefused(fmt::format(
          "{} is not a dtrain store (it answered with bytes {:02x} {:02x} {:02x} {:02x}). HINT: "
          "another service uses this port; check --rdzv-endpoint",
          where_, buf[0], buf[1], buf[2], buf[3]));
    }
    // The magic is in; the rest of the fixed-size challenge follows.
    size_t have = first.done;
    if (have < sizeof(buf)) {
      expectIo(net::recvAtLeast(fd, buf + have, sizeof(buf) - have, sizeof(buf) - have, deadline),
               "reading its challenge");
    }
    wire::Challenge challenge;
    wire::decodeChallenge(buf, &challenge);
    if (challenge.version != wire::kVersion) {
      throw HandshakeRefused(fmt::format(
          "store {} speaks wire version {}, this client version {}. HINT: run the same dtrain "
          "build on every node",
          where_, challenge.version, wire::kVersion));
    }
    bool serverWantsToken = (challenge.flags & wire::kFlagToken) != 0;
    if (serverWantsToken && token_.empty()) {
      throw HandshakeRefused(fmt::format(
          "store {} requires a job token, and this client has none. HINT: DTRAIN_STORE_TOKEN "
          "is not set; start the program with `launch`, which sets it",
          where_));
    }
    if (!serverWantsToken && !token_.empty()) {
      throw HandshakeRefused(fmt::format(
          "store {} runs without a job token, but this client has one (DTRAIN_STORE_TOKEN). "
          "HINT: another job's store may be listening on this port; check --rdzv-endpoint",
          where_));
    }
    wire::Mac proof{};
    if (serverWantsToken) {
      wire::Mac expected = auth::serverProof(token_, hello.nonce, challenge.nonce);
      if (!auth::sameMac(challenge.proof, expected)) {
        throw HandshakeRefused(fmt::format(
            "store {} refused the job token: it does not hold the token this client has. HINT: "
            "another job's store on this port, or a stale DTRAIN_STORE_TOKEN; check "
            "--rdzv-endpoint and that every node runs under the same `launch`",
            where_));
      }
      proof = auth::clientProof(token_, challenge.nonce, hello.nonce);
    }
    expectIo(net::sendAll(fd, proof.data(), proof.size(), deadline), "sending its proof");
    uint8_t verdict[wire::kVerdictBytes];
    net::IoResult r = net::recvAtLeast(fd, verdict, sizeof(verdict), sizeof(verdict), deadline);
    if (r.status == IoStatus::Closed || (r.status == IoStatus::Ok && verdict[4] != 0)) {
      throw HandshakeRefused(fmt::format(
          "store {} refused the job token. HINT: every process of a job needs the same "
          "DTRAIN_STORE_TOKEN; start the program with `launch`",
          where_));
    }
    expectIo(r, "reading its verdict");
    if (wire::decodeVerdict(verdict) != wire::kVerdictAccepted) {
      throw HandshakeRefused(fmt::format("store {} sent a malformed handshake verdict", where_));
    }
  }

  void expectIo(const net::IoResult& r, const char* doing) const {
    switch (r.status) {
      case IoStatus::Ok: return;
      case IoStatus::Timeout:
        DTRAIN_THROW(TimeoutError, "store {}: handshake timed out after {} ms {}", where_,
                     options_.handshakeTimeout.count(), doing);
      case IoStatus::Closed:
        DTRAIN_THROW(NetworkError, "store {} closed the connection during the handshake ({})",
                     where_, doing);
      default:
        DTRAIN_THROW(NetworkError, "store {}: handshake failed {}: {}", where_, doing,
                     net::errnoText(r.err));
    }
  }

  // Between requests nothing may arrive (frames strictly alternate), so a readable socket means
  // the server closed it (or broke the protocol).
  bool peerClosed() const {
    pollfd p{socket_.fd(), POLLIN | POLLRDHUP, 0};
    return ::poll(&p, 1, 0) > 0;
  }

  TcpStoreOptions options_;
  Store* self_;
  Clock::time_point lastUse_{};  // guarded by mutex
  std::vector<uint8_t> rbuf_ = std::vector<uint8_t>(kReceiveBufferBytes);  // guarded by mutex
  std::string where_;
  std::string token_;   // never logged
  net::Socket socket_;  // guarded by mutex
};

// --- TcpStore ---------------------------------------------------------------------------------

TcpStore::TcpStore(const TcpStoreOptions& options) : impl_(std::make_unique<Impl>(options, this)) {
  DTRAIN_CHECK_ARG(options.timeout.count() >= 0, "store {}: negative timeout {} ms",
                   impl_->where(), options.timeout.count());
  timeout_ = options.timeout;
  impl_->connect();
}

TcpStore::~TcpStore() = default;

std::string TcpStore::describe() const { return impl_->where(); }

void TcpStore::set(const std::string& key, const Bytes& value) {
  impl_->checkKey(key);
  impl_->checkValue(key, value);
  wire::Request r;
  r.op = Op::Set;
  r.keys = {key};
  r.value = value;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto [status, payload] = impl_->roundTrip(r, Millis(0));
  if (status == Status::Error) impl_->throwServerError(r, payload);
  if (status != Status::Ok || !payload.empty()) impl_->throwMalformed(r);
}

Bytes TcpStore::get(const std::string& key) {
  impl_->checkKey(key);
  wire::Request r;
  r.op = Op::Get;
  r.keys = {key};
  Millis wait = timeout();
  r.timeoutMs = static_cast<uint64_t>(wait.count());
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto start = Clock::now();
  auto [status, payload] = impl_->roundTrip(r, wait);
  if (status == Status::Timeout) {
    DTRAIN_THROW(TimeoutError,
                 "timed out after {} ms waiting for key(s) \"{}\" on store {} (get, timeout {} ms)",
                 msSince(start), key, impl_->where(), wait.count());
  }
  if (status == Status::Error) impl_->throwServerError(r, payload);
  wire::Reader in(payload.data(), payload.size());
  Bytes value;
  if (status != Status::Ok || !in.bytes(payload.size(), &value) || in.left() != 0) {
    impl_->throwMalformed(r);
  }
  return value;
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  impl_->checkKey(key);
  wire::Request r;
  r.op = Op::Add;
  r.keys = {key};
  r.delta = delta;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto [status, payload] = impl_->roundTrip(r, Millis(0));
  if (status == Status::Error) impl_->throwServerError(r, payload);
  wire::Reader in(payload.data(), payload.size());
  int64_t now = 0;
  if (status != Status::Ok || !in.i64(&now) || in.left() != 0) impl_->throwMalformed(r);
  return now;
}

Bytes TcpStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  impl_->checkKey(key);
  impl_->checkValue(key, expected);
  impl_->checkValue(key, desired);
  wire::Request r;
  r.op = Op::CompareSet;
  r.keys = {key};
  r.expected = expected;
  r.value = desired;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto [status, payload] = impl_->roundTrip(r, Millis(0));
  if (status == Status::Error) impl_->throwServerError(r, payload);
  wire::Reader in(payload.data(), payload.size());
  Bytes value;
  if (status != Status::Ok || !in.bytes(payload.size(), &value) || in.left() != 0) {
    impl_->throwMalformed(r);
  }
  return value;
}

void TcpStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  impl_->checkKeys(keys);
  DTRAIN_CHECK_ARG(timeout.count() >= 0, "store {}: wait with a negative timeout ({} ms)",
                   impl_->where(), timeout.count());
  wire::Request r;
  r.op = Op::Wait;
  r.keys = keys;
  r.timeoutMs = static_cast<uint64_t>(timeout.count());
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto start = Clock::now();
  auto [status, payload] = impl_->roundTrip(r, timeout);
  if (status == Status::Ok && payload.empty()) return;
  if (status == Status::Error) impl_->throwServerError(r, payload);
  wire::Reader in(payload.data(), payload.size());
  uint64_t count = 0;
  if (status != Status::Timeout || !in.u64(&count) || count > keys.size() ||
      in.left() != count * 8) {
    impl_->throwMalformed(r);
  }
  std::vector<std::string> missing;
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t index = 0;
    in.u64(&index);
    if (index >= keys.size()) impl_->throwMalformed(r);
    missing.push_back(keys[index]);
  }
  DTRAIN_THROW(TimeoutError,
               "timed out after {} ms waiting for key(s) {} on store {} ({} of {} keys missing)",
               msSince(start), quoted(missing), impl_->where(), missing.size(), keys.size());
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  impl_->checkKeys(keys);
  wire::Request r;
  r.op = Op::Check;
  r.keys = keys;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto [status, payload] = impl_->roundTrip(r, Millis(0));
  if (status == Status::Error) impl_->throwServerError(r, payload);
  if (status != Status::Ok || payload.size() != 1 || payload[0] > 1) impl_->throwMalformed(r);
  return payload[0] == 1;
}

bool TcpStore::deleteKey(const std::string& key) {
  impl_->checkKey(key);
  wire::Request r;
  r.op = Op::Delete;
  r.keys = {key};
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto [status, payload] = impl_->roundTrip(r, Millis(0));
  if (status == Status::Error) impl_->throwServerError(r, payload);
  if (status != Status::Ok || payload.size() != 1 || payload[0] > 1) impl_->throwMalformed(r);
  return payload[0] == 1;
}

int64_t TcpStore::numKeys() {
  wire::Request r;
  r.op = Op::NumKeys;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto [status, payload] = impl_->roundTrip(r, Millis(0));
  if (status == Status::Error) impl_->throwServerError(r, payload);
  wire::Reader in(payload.data(), payload.size());
  int64_t n = 0;
  if (status != Status::Ok || !in.i64(&n) || in.left() != 0) impl_->throwMalformed(r);
  return n;
}

}  // namespace dtrain::store
