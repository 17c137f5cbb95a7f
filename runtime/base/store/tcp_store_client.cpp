// TcpStore, the client: pipelined sets and their acknowledgements, and the Store operations over
// TcpStore::Impl's round trips (client_round_trip.cpp; the connection is opened by
// client_connect.cpp).
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "store/tcp_store_impl.h"

namespace dtrain::store {

namespace {

using net::Clock;
using net::IoStatus;
using wire::Op;
using wire::Status;

// Decoders of Ok answers; false when the answer does not have that shape.
bool readValue(Status status, const Bytes& payload, Bytes* out) {
  wire::Reader in(payload.data(), payload.size());
  return status == Status::Ok && in.bytes(payload.size(), out) && in.left() == 0;
}
bool readI64(Status status, const Bytes& payload, int64_t* out) {
  wire::Reader in(payload.data(), payload.size());
  return status == Status::Ok && in.i64(out) && in.left() == 0;
}
bool readFlag(Status status, const Bytes& payload, bool* out) {
  if (status != Status::Ok || payload.size() != 1 || payload[0] > 1) return false;
  *out = payload[0] == 1;
  return true;
}

}  // namespace

// Note [Pipelined sets]
// set() sends its frame and returns, as c10d's does: one system call instead of a round trip. The
// server still answers every Set, in order (the wire format is unchanged, Note [Store wire
// format]); the client keeps the key of each set not yet acknowledged (unacked_) and reads the
// acknowledgements later:
//   - after every kAckPollInterval-th send it takes those that have already arrived, without
//     waiting, so its receive buffer never fills during a long run of sets. Not after every send:
//     that extra recv() made a lone client's set() up to twice as slow (p50 3 us, c10d's 1.7 us);
//   - set() blocks on the oldest ones while more than kMaxUnackedSets sets or kMaxUnackedBytes
//     bytes of them are outstanding. The server reads whatever arrives and we read its answers
//     before they could fill any buffer, so a run of sets cannot deadlock; and what is
//     outstanding (keys kept here, acknowledgements queued there, work left for flush()) stays
//     bounded. Values of megabytes thus go one at a time -- a round trip is nothing beside
//     sending them;
//   - every other request first waits for every outstanding acknowledgement, so it goes out on a
//     quiet connection (its answer is the next frame) and only after the sets before it were
//     applied. flush() does just that; the destructor does it with a deadline (kCloseDrain, or
//     the operation timeout when shorter) before closing: a socket closed with unread bytes --
//     acknowledgements -- makes the kernel reset the connection instead of closing it in order,
//     and a reset may discard data the server has not read yet, i.e. the last sets.
// Whatever goes wrong with a set already sent -- the server answers Error, or Refused (then it
// closes the connection, and the sets sent after that one are not applied), or the connection is
// lost or times out with sets unacknowledged -- is kept (the first such error, setError_) and
// thrown by the next call on this client before it does anything, naming the keys. set() itself
// throws only when its own frame could not be sent.
//
// The bounds (kMaxUnackedSets, kAckPollInterval, kMaxUnackedBytes, kCloseDrain) are in
// tcp_store_impl.h.

// See Note [Pipelined sets].
void TcpStore::Impl::set(const std::string& key, const Bytes& value) {
  Bytes frame = wire::encodeSet(key, value);
  std::lock_guard<std::mutex> lock(mutex_);
  if (options_.acknowledgedSets) {
    wire::Request r;
    r.op = Op::Set;
    r.keys = {key};
    auto [status, payload] = exchange(r, frame, Millis(0));
    if (status != Status::Ok || !payload.empty()) throwMalformed(r);
    return;
  }
  settle(Clock::now() - lastUse_ > kStaleAfter);  // Note [Stale connections]
  open();
  auto start = Clock::now();
  lastUse_ = start;
  unacked_.push_back({key, frame.size()});
  unackedBytes_ += frame.size();
  net::IoResult w = net::sendAll(socket_.fd(), frame.data(), frame.size(), start + timeout());
  if (w.status != IoStatus::Ok) {
    // A server that refused an earlier set closes the connection: its answer says why.
    takeAcks(false, 0, 0, start);
    if (socket_.valid()) loseConnection(w, start, fmt::format("sending SET \"{}\"", key));
    throwSetError();
  }
  if (unacked_.size() % kAckPollInterval == 0) takeAcks(false, 0, 0, start);
  takeAcks(true, kMaxUnackedSets, kMaxUnackedBytes, Clock::now() + timeout());
}

void TcpStore::Impl::flush() {
  std::lock_guard<std::mutex> lock(mutex_);
  settle(true);
}

// Takes the acknowledgements still due, within kCloseDrain (or the operation timeout, when
// shorter), then closes. Never throws: what it cannot report to a caller it logs.
void TcpStore::Impl::close() noexcept {
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    takeAcks(true, 0, 0, Clock::now() + std::min<Millis>(kCloseDrain, timeout()));
    if (setError_) {
      try {
        std::rethrow_exception(setError_);
      } catch (const std::exception& e) {
        DTRAIN_LOG(Warn,
                   "store client {} closing: a set() failed and no later call reported "
                   "it: {}. HINT: call flush() before dropping a TcpStore whose sets matter",
                   where_, e.what());
      }
    }
    closeConnection();
  } catch (...) {
  }
}

// Before a request: with `all`, waits for every acknowledgement due; then throws the first
// error of a set that no call has reported yet.
void TcpStore::Impl::settle(bool all) {
  if (all) takeAcks(true, 0, 0, Clock::now() + timeout());
  throwSetError();
}

void TcpStore::Impl::throwSetError() {
  if (!setError_) return;
  std::exception_ptr e = setError_;
  setError_ = nullptr;
  std::rethrow_exception(e);
}

void TcpStore::Impl::keepSetError(std::exception_ptr e) {
  if (!setError_) {
    setError_ = std::move(e);
    return;
  }
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& later) {
    DTRAIN_LOG(Info,
               "store client {}: another set() failed before the first failure was "
               "reported: {}",
               where_, later.what());
  }
}

std::string TcpStore::Impl::unackedKeys() const {
  std::vector<std::string> keys;
  for (size_t i = 0; i < unacked_.size() && i < 8; ++i) keys.push_back(unacked_[i].key);
  std::string out = quoted(keys);
  if (unacked_.size() > keys.size()) {
    out += fmt::format(" and {} more", unacked_.size() - keys.size());
  }
  return out;
}

// Takes acknowledgements, oldest first. Without `wait`: those that have already arrived (one
// non-blocking receive at most). With it: blocks until no more than `maxCount` sets and
// `maxBytes` bytes stay unacknowledged, or `deadline`. Failures are kept for the next call.
void TcpStore::Impl::takeAcks(bool wait, size_t maxCount, size_t maxBytes,
                              Clock::time_point deadline) {
  auto start = Clock::now();
  bool received = false;
  while (socket_.valid() && !unacked_.empty() &&
         (!wait || unacked_.size() > maxCount || unackedBytes_ > maxBytes)) {
    size_t n = bufferedAck();
    if (n > 0) {
      takeAck(n);
      continue;
    }
    if (!socket_.valid() || (!wait && received)) break;
    received = true;
    if (rbegin_ > 0) {
      std::memmove(rbuf_.data(), rbuf_.data() + rbegin_, buffered());
      rend_ -= rbegin_;
      rbegin_ = 0;
    }
    uint8_t* room = rbuf_.data() + rend_;
    net::IoResult r = wait ? net::recvAtLeast(socket_.fd(), room, 1, rbuf_.size() - rend_, deadline)
                           : net::recvAvailable(socket_.fd(), room, rbuf_.size() - rend_);
    rend_ += r.done;
    if (r.status != IoStatus::Ok) {
      loseConnection(r, start, "reading their acknowledgements");
    } else if (r.done == 0) {
      break;  // nothing has arrived yet
    }
  }
  if (socket_.valid() && unacked_.empty() && buffered() > 0) {
    breakConnection(fmt::format("{} bytes more than the acknowledgements it owed", buffered()));
  }
}

// The size of the acknowledgement at the front of the buffer once all of it is there, else 0.
// A malformed header breaks the connection (then 0 too).
size_t TcpStore::Impl::bufferedAck() {
  if (buffered() < wire::kHeaderBytes) return 0;
  wire::FrameHeader h = wire::decodeHeader(rbuf_.data() + rbegin_);
  if (!usableAnswerHeader(h, kMaxAckPayload)) {
    breakConnection(fmt::format("a malformed frame (version {}, type {}, {} bytes) for the "
                                "acknowledgement of SET \"{}\"",
                                h.version, h.type, h.payloadBytes, unacked_.front().key));
    return 0;
  }
  size_t size = wire::kHeaderBytes + static_cast<size_t>(h.payloadBytes);
  return buffered() >= size ? size : 0;
}

// Takes the acknowledgement of the oldest unacknowledged set: `size` bytes at rbuf_[rbegin_].
void TcpStore::Impl::takeAck(size_t size) {
  const uint8_t* frame = rbuf_.data() + rbegin_;
  rbegin_ += size;
  Unacked set = std::move(unacked_.front());
  unacked_.pop_front();
  unackedBytes_ -= set.bytes;
  auto status = static_cast<Status>(wire::decodeHeader(frame).type);
  const uint8_t* payload = frame + wire::kHeaderBytes;
  size_t payloadBytes = size - wire::kHeaderBytes;
  if (status == Status::Ok && payloadBytes == 0) return;
  if (status == Status::Error) {
    keepSetError(DTRAIN_ERROR_PTR(InvalidArgument, "store {} refused SET \"{}\": {}", where_,
                                  set.key, errorMessage(payload, payloadBytes)));
    return;
  }
  if (status == Status::Refused) {
    std::string message = errorMessage(payload, payloadBytes);
    std::string lost;
    if (!unacked_.empty()) {
      lost = fmt::format("; the {} set(s) sent after it were not applied: {}", unacked_.size(),
                         unackedKeys());
    }
    dropUnacked();
    keepSetError(DTRAIN_ERROR_PTR(InvalidArgument,
                                  "store {} refused SET \"{}\" and closed the connection: {}{}. "
                                  "HINT: client and server limits (StoreLimits) differ?",
                                  where_, set.key, message, lost));
    return;
  }
  unacked_.push_front(std::move(set));  // named among those that may not have been applied
  unackedBytes_ += unacked_.front().bytes;
  breakConnection(fmt::format("a malformed acknowledgement (status {}, {} bytes)",
                              static_cast<int>(status), payloadBytes));
}

// The connection is gone with sets unacknowledged: nobody can tell which were applied.
void TcpStore::Impl::loseConnection(const net::IoResult& r, Clock::time_point start,
                                    const std::string& doing) {
  std::string sets = unackedKeys();
  size_t count = unacked_.size();
  dropUnacked();
  switch (r.status) {
    case IoStatus::Timeout:
      keepSetError(DTRAIN_ERROR_PTR(
          TimeoutError,
          "store {} did not acknowledge {} set(s) within {} ms ({}): {}; they may not have "
          "been applied, and the connection was closed. HINT: the store host may be "
          "overloaded or unreachable",
          where_, count, net::msSince(start), doing, sets));
      return;
    case IoStatus::Closed:
      keepSetError(DTRAIN_ERROR_PTR(
          NetworkError,
          "store {} closed the connection with {} set(s) unacknowledged ({}): {}; they may "
          "not have been applied{}. HINT: the store's host (the launcher) stopped or crashed; "
          "see its log",
          where_, count, doing, sets, r.err ? " (" + net::errnoText(r.err) + ")" : ""));
      return;
    default:
      keepSetError(DTRAIN_ERROR_PTR(
          NetworkError,
          "lost the connection to store {} ({}: {}) with {} set(s) unacknowledged: {}; they "
          "may not have been applied",
          where_, doing, net::errnoText(r.err), count, sets));
  }
}

// The server broke the protocol: the stream cannot be trusted past this point.
void TcpStore::Impl::breakConnection(const std::string& what) {
  std::string sets = unacked_.empty() ? std::string("none") : unackedKeys();
  dropUnacked();
  keepSetError(DTRAIN_ERROR_PTR(NetworkError,
                                "store {} sent {}; closed the connection. Sets unacknowledged "
                                "(may not have been applied): {}. HINT: is {} a dtrain store of "
                                "the same version?",
                                where_, what, sets, where_));
}

void TcpStore::Impl::dropUnacked() {
  unacked_.clear();
  unackedBytes_ = 0;
  closeConnection();
}

// --- TcpStore ---------------------------------------------------------------------------------

TcpStore::TcpStore(const TcpStoreOptions& options) : impl_(std::make_unique<Impl>(options, this)) {
  timeout_ = timeoutOrDefault(options.timeout, kDefaultStoreTimeout, "TcpStoreOptions::timeout");
  impl_->connect();
}

TcpStore::~TcpStore() { impl_->close(); }

std::string TcpStore::describe() const { return impl_->where(); }

void TcpStore::set(const std::string& key, const Bytes& value) {
  impl_->checkKey(key);
  impl_->checkValue(key, value);
  impl_->set(key, value);
}

void TcpStore::flush() { impl_->flush(); }

Bytes TcpStore::get(const std::string& key) {
  impl_->checkKey(key);
  wire::Request r;
  r.op = Op::Get;
  r.keys = {key};
  Millis wait = timeout();
  r.timeoutMs = static_cast<uint64_t>(wait.count());
  auto start = Clock::now();
  Bytes value;
  bool timedOut = false;
  impl_->call(r, wait, [&](Status status, const Bytes& payload) {
    timedOut = status == Status::Timeout;
    return timedOut || readValue(status, payload, &value);
  });
  if (timedOut) {
    DTRAIN_THROW(TimeoutError,
                 "timed out after {} ms waiting for key(s) \"{}\" on store {} (get, timeout {} ms)",
                 net::msSince(start), key, impl_->where(), wait.count());
  }
  return value;
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  impl_->checkKey(key);
  wire::Request r;
  r.op = Op::Add;
  r.keys = {key};
  r.delta = delta;
  int64_t now = 0;
  impl_->call(r, Millis(0), [&](Status s, const Bytes& p) { return readI64(s, p, &now); });
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
  Bytes value;
  impl_->call(r, Millis(0), [&](Status s, const Bytes& p) { return readValue(s, p, &value); });
  return value;
}

void TcpStore::wait(const std::vector<std::string>& keys, Millis requested) {
  impl_->checkKeys(keys);
  // Never zero on the wire, where zero asks the server to answer at once.
  const Millis timeout = waitTimeout(requested);
  wire::Request r;
  r.op = Op::Wait;
  r.keys = keys;
  r.timeoutMs = static_cast<uint64_t>(timeout.count());
  auto start = Clock::now();
  std::vector<std::string> missing;
  impl_->call(r, timeout, [&](Status status, const Bytes& payload) {
    if (status == Status::Ok) return payload.empty();
    // Timeout: the indices of the keys still missing.
    wire::Reader in(payload.data(), payload.size());
    uint64_t count = 0;
    if (status != Status::Timeout || !in.u64(&count) || count > keys.size() ||
        in.left() != count * 8) {
      return false;
    }
    for (uint64_t i = 0; i < count; ++i) {
      uint64_t index = 0;
      in.u64(&index);
      if (index >= keys.size()) return false;
      missing.push_back(keys[index]);
    }
    return true;
  });
  if (missing.empty()) return;
  DTRAIN_THROW(TimeoutError,
               "timed out after {} ms waiting for key(s) {} on store {} ({} of {} keys missing)",
               net::msSince(start), quoted(missing), impl_->where(), missing.size(), keys.size());
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  impl_->checkKeys(keys);
  wire::Request r;
  r.op = Op::Check;
  r.keys = keys;
  bool all = false;
  impl_->call(r, Millis(0), [&](Status s, const Bytes& p) { return readFlag(s, p, &all); });
  return all;
}

bool TcpStore::deleteKey(const std::string& key) {
  impl_->checkKey(key);
  wire::Request r;
  r.op = Op::Delete;
  r.keys = {key};
  bool existed = false;
  impl_->call(r, Millis(0), [&](Status s, const Bytes& p) { return readFlag(s, p, &existed); });
  return existed;
}

std::vector<std::optional<Bytes>> TcpStore::tryMultiGet(const std::vector<std::string>& keys) {
  impl_->checkKeys(keys);
  if (keys.empty()) return {};
  wire::Request r;
  r.op = Op::MultiGet;
  r.keys = keys;
  std::vector<std::optional<Bytes>> out;
  impl_->call(r, Millis(0), [&](Status s, const Bytes& p) {
    return s == Status::Ok && wire::decodeMultiValues(p, keys.size(), impl_->maxValueBytes(), &out);
  });
  return out;
}

Bytes TcpStore::waitChanged(const std::string& key, const Bytes& seen, Millis requested) {
  impl_->checkKey(key);
  impl_->checkValue(key, seen);
  // Never zero on the wire, where zero asks the server to answer at once.
  const Millis timeout = waitTimeout(requested);
  wire::Request r;
  r.op = Op::WaitChanged;
  r.keys = {key};
  r.expected = seen;
  r.timeoutMs = static_cast<uint64_t>(timeout.count());
  auto start = Clock::now();
  Bytes value;
  bool timedOut = false;
  impl_->call(r, timeout, [&](Status status, const Bytes& payload) {
    timedOut = status == Status::Timeout;
    return timedOut || readValue(status, payload, &value);
  });
  if (timedOut) {
    DTRAIN_THROW(TimeoutError,
                 "timed out after {} ms waiting for key \"{}\" to change from \"{}\" "
                 "on store {} (timeout {} ms)",
                 net::msSince(start), key, toString(seen).substr(0, 64), impl_->where(),
                 timeout.count());
  }
  return value;
}

int64_t TcpStore::numKeys() {
  wire::Request r;
  r.op = Op::NumKeys;
  int64_t n = 0;
  impl_->call(r, Millis(0), [&](Status s, const Bytes& p) { return readI64(s, p, &n); });
  return n;
}

}  // namespace dtrain::store
