// TcpStore::Impl, one round trip: opening and reusing the connection, sending a request on a
// quiet connection and reading its answer, and what a failure of either says.
#include <poll.h>

#include <algorithm>
#include <cstdlib>
#include <optional>

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "store/client_connect.h"
#include "store/tcp_store_impl.h"

namespace dtrain::store {

using net::Clock;
using net::IoStatus;
using wire::Status;

std::string quoted(const std::vector<std::string>& keys, size_t max) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < max; ++i) {
    if (!out.empty()) out += ", ";
    out += '"' + keys[i] + '"';
  }
  if (keys.size() > max) out += fmt::format(" and {} more", keys.size() - max);
  return out;
}

std::string errorMessage(const uint8_t* payload, size_t size) {
  wire::Reader in(payload, size);
  std::string message;
  if (!in.string(wire::kMaxErrorBytes, &message)) message = "(unreadable error message)";
  return message;
}

bool usableAnswerHeader(const wire::FrameHeader& h, uint64_t maxPayload) {
  return h.version == wire::kVersion && h.type <= static_cast<uint8_t>(Status::Refused) &&
         h.payloadBytes <= maxPayload;
}

TcpStore::Impl::Impl(const TcpStoreOptions& options, Store* self) : options_(options), self_(self) {
  where_ = net::hostPort(options.host, options.port);
  options_.connectTimeout = timeoutOrDefault(options.connectTimeout, kDefaultConnectTimeout,
                                             "TcpStoreOptions::connectTimeout");
  options_.handshakeTimeout = timeoutOrDefault(options.handshakeTimeout, kDefaultHandshakeTimeout,
                                               "TcpStoreOptions::handshakeTimeout");
  token_ = options.token;
  if (token_.empty()) {
    const char* env = std::getenv("DTRAIN_STORE_TOKEN");
    if (env != nullptr) token_ = env;
  }
  DTRAIN_CHECK_ARG(options.port != 0,
                   "store client: port 0 is not a store's port ({}). HINT: "
                   "use the port the server reports",
                   where_);
}

namespace {
thread_local std::optional<Clock::time_point> tDeadline;
}  // namespace

ScopedStoreDeadline::ScopedStoreDeadline(Clock::time_point deadline) : previous_(tDeadline) {
  tDeadline = previous_ ? std::min(*previous_, deadline) : deadline;
}

ScopedStoreDeadline::~ScopedStoreDeadline() { tDeadline = previous_; }

std::optional<Clock::time_point> ScopedStoreDeadline::current() { return tDeadline; }

// Before the client is shared, or with mutex_ held (and nothing unacknowledged). Within a
// ScopedStoreDeadline, connecting gives up at its deadline (Note [Store calls with a deadline]).
void TcpStore::Impl::connect() {
  TcpStoreOptions options = options_;
  if (tDeadline) {
    const auto left = std::chrono::duration_cast<Millis>(*tDeadline - Clock::now());
    options.connectTimeout = std::clamp(left, Millis(1), options_.connectTimeout);
  }
  socket_ = connectToStore(options, token_, where_);
  rbegin_ = rend_ = 0;
}

// Note [Stale connections]
// A server with an idle timeout, or one that restarted, may have closed a connection we still
// hold. Sending on it would fail only after the request is out -- too late to know whether the
// server ran it, so not safe to retry an add(). Before using a connection idle for a while we
// therefore take every acknowledgement still due (Note [Pipelined sets]), then ask the kernel
// whether the peer has closed it, and reconnect first if so. Requests sent back to back skip the
// check (one poll() each would cost ~1 us on a ~25 us round trip).

// A live connection. Called on a quiet one (nothing unacknowledged), or right after using it.
void TcpStore::Impl::open() {
  if (socket_.valid() && unacked_.empty() && Clock::now() - lastUse_ > kStaleAfter &&
      peerClosed()) {
    // See Note [Stale connections].
    DTRAIN_LOG(Info, "store {} closed our idle connection", where_);
    closeConnection();
  }
  if (!socket_.valid()) {
    DTRAIN_LOG(Info, "store client reconnecting to {}", where_);
    connect();
  }
}

// Every way out of a connection: whatever was unacknowledged on it is accounted for first.
void TcpStore::Impl::closeConnection() {
  socket_.close();
  rbegin_ = rend_ = 0;
}

// Sends `frame` (the encoding of `request`) on a quiet connection and returns the answer's
// status and payload; a server Error or Refused is thrown here. `waitMs`: how long the server
// may legitimately hold the request (Get/Wait), added to the network deadline.
std::pair<Status, Bytes> TcpStore::Impl::exchange(const wire::Request& request, const Bytes& frame,
                                                  Millis waitMs) {
  settle(true);
  open();
  auto start = Clock::now();
  lastUse_ = start;
  // A parked Get/Wait is answered by the server at waitMs; anything else promptly.
  auto deadline = start + (waitMs.count() > 0 ? waitMs + kServerGrace : timeout());
  if (tDeadline) deadline = std::min(deadline, *tDeadline);  // Note [Store calls with a deadline]
  net::IoResult w = net::sendAll(socket_.fd(), frame.data(), frame.size(), deadline);
  if (w.status != IoStatus::Ok) fail(request, w, start, "sending");

  Frame answer;
  std::string malformed;
  net::IoResult r = readFrame(wire::maxResponsePayload(options_.limits), deadline, &answer,
                              &malformed);
  if (!malformed.empty()) {
    closeConnection();
    DTRAIN_THROW(NetworkError,
                 "store {} answered {} {} with a malformed frame ({}). HINT: is {} a dtrain "
                 "store of the same version?",
                 where_, wire::opName(request.op), quoted(request.keys), malformed, where_);
  }
  if (r.status != IoStatus::Ok) {
    fail(request, r, start, answer.headerDone ? "reading the answer" : "waiting for the answer");
  }
  if (buffered() > 0) {
    // Nothing else was outstanding: bytes past this answer mean the stream is out of step.
    size_t extra = buffered();
    closeConnection();
    DTRAIN_THROW(NetworkError, "store {} sent {} bytes more than its answer to {} {}", where_,
                 extra, wire::opName(request.op), quoted(request.keys));
  }
  if (answer.status == Status::Refused) {
    closeConnection();  // the server closes it too
    DTRAIN_THROW(InvalidArgument,
                 "store {} refused {} {} and closed the connection: {}. HINT: client and server "
                 "limits (StoreLimits) differ?",
                 where_, wire::opName(request.op), quoted(request.keys),
                 errorMessage(answer.payload.data(), answer.payload.size()));
  }
  if (answer.status == Status::Error) {
    DTRAIN_THROW(InvalidArgument, "store {} refused {} {}: {}", where_, wire::opName(request.op),
                 quoted(request.keys), errorMessage(answer.payload.data(), answer.payload.size()));
  }
  return {answer.status, std::move(answer.payload)};
}

// The next frame: what is buffered first, then from the socket until `deadline`. A header that
// breaks the format or announces more than `maxPayload` is described in *malformed.
net::IoResult TcpStore::Impl::readFrame(uint64_t maxPayload, Clock::time_point deadline, Frame* out,
                                        std::string* malformed) {
  net::IoResult r;
  if (buffered() < wire::kHeaderBytes) {
    // One recv usually brings the whole answer: header and payload land in rbuf_ together.
    if (rbegin_ == rend_) rbegin_ = rend_ = 0;
    r = net::recvAtLeast(socket_.fd(), rbuf_.data() + rend_, wire::kHeaderBytes - buffered(),
                         rbuf_.size() - rend_, deadline);
    rend_ += r.done;
    if (r.status != IoStatus::Ok) return r;
  }
  wire::FrameHeader h = wire::decodeHeader(rbuf_.data() + rbegin_);
  if (!usableAnswerHeader(h, maxPayload)) {
    *malformed = fmt::format("version {}, type {}, {} bytes; limit {}", h.version, h.type,
                             h.payloadBytes, maxPayload);
    return r;
  }
  rbegin_ += wire::kHeaderBytes;
  out->headerDone = true;
  out->status = static_cast<Status>(h.type);
  size_t size = static_cast<size_t>(h.payloadBytes);
  size_t have = std::min(buffered(), size);
  out->payload.assign(rbuf_.begin() + rbegin_, rbuf_.begin() + rbegin_ + have);
  rbegin_ += have;
  if (have < size) {
    out->payload.resize(size);
    r = net::recvAtLeast(socket_.fd(), out->payload.data() + have, size - have, size - have,
                         deadline);
  }
  return r;
}

void TcpStore::Impl::fail(const wire::Request& request, const net::IoResult& r,
                          Clock::time_point start, const char* doing) {
  // The stream is out of step (or gone): the next operation starts a fresh connection.
  closeConnection();
  std::string what = fmt::format("{} {}", wire::opName(request.op), quoted(request.keys));
  switch (r.status) {
    case IoStatus::Timeout:
      DTRAIN_THROW(TimeoutError,
                   "store {} did not answer {} within {} ms ({}). HINT: the store host may be "
                   "overloaded or unreachable",
                   where_, what, net::msSince(start), doing);
    case IoStatus::Closed:
      DTRAIN_THROW(NetworkError,
                   "store {} closed the connection during {} ({}, after {} ms){}. HINT: the "
                   "store's host (the launcher) stopped or crashed; see its log",
                   where_, what, doing, net::msSince(start),
                   r.err ? ": " + net::errnoText(r.err) : std::string());
    default:
      DTRAIN_THROW(NetworkError, "lost the connection to store {} during {} ({}): {}", where_, what,
                   doing, net::errnoText(r.err));
  }
}

void TcpStore::Impl::throwMalformed(const wire::Request& request) {
  closeConnection();
  DTRAIN_THROW(NetworkError, "store {} sent a malformed answer to {} {}", where_,
               wire::opName(request.op), quoted(request.keys));
}

// With nothing outstanding, nothing may arrive, so a readable socket means the server closed
// it (or broke the protocol).
bool TcpStore::Impl::peerClosed() const {
  pollfd p{socket_.fd(), POLLIN | POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0;
}

void TcpStore::Impl::checkKey(const std::string& key) const {
  DTRAIN_CHECK_ARG(key.size() <= options_.limits.maxKeyBytes,
                   "store key of {} bytes (\"{}...\") exceeds the limit of {} bytes "
                   "(StoreLimits::maxKeyBytes) on store {}",
                   key.size(), key.substr(0, 32), options_.limits.maxKeyBytes, where_);
}

void TcpStore::Impl::checkValue(const std::string& key, const Bytes& value) const {
  DTRAIN_CHECK_ARG(value.size() <= options_.limits.maxValueBytes,
                   "store value of {} bytes for key \"{}\" exceeds the limit of {} bytes "
                   "(StoreLimits::maxValueBytes) on store {}",
                   value.size(), key, options_.limits.maxValueBytes, where_);
}

void TcpStore::Impl::checkKeys(const std::vector<std::string>& keys) const {
  DTRAIN_CHECK_ARG(keys.size() <= options_.limits.maxKeysPerRequest,
                   "{} keys in one request exceed the limit of {} (StoreLimits::"
                   "maxKeysPerRequest) on store {}",
                   keys.size(), options_.limits.maxKeysPerRequest, where_);
  for (const auto& k : keys) checkKey(k);
}

}  // namespace dtrain::store
