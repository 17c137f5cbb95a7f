#pragma once
// TcpStore::Impl: a TcpStore client's one connection. Round trips on a quiet connection
// (client_round_trip.cpp) and pipelined sets with their acknowledgements (tcp_store_client.cpp,
// Note [Pipelined sets]). Internal to dtrain_base.

#include <chrono>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/base/tcp_store.h"
#include "net/socket.h"
#include "store/wire.h"

namespace dtrain::store {

// The server answers a Get/Wait at its deadline; we give its answer this long to arrive before
// calling the connection dead.
constexpr Millis kServerGrace{5000};
// A connection idle this long is checked for a peer close before reuse (Note [Stale connections]
// in client_round_trip.cpp).
constexpr Millis kStaleAfter{10};
// Bounds of the pipelined sets (Note [Pipelined sets] in tcp_store_client.cpp).
constexpr size_t kMaxUnackedSets = 1024;
constexpr size_t kAckPollInterval = 32;
constexpr size_t kMaxUnackedBytes = 4 << 20;
constexpr Millis kCloseDrain{5000};
// An acknowledgement is an empty Ok, or an Error/Refused carrying a message.
constexpr size_t kMaxAckPayload = 8 + wire::kMaxErrorBytes;
// Holds the largest acknowledgement whole; answers to other requests usually fit as well.
constexpr size_t kReceiveBufferBytes = 16 * 1024;
static_assert(kReceiveBufferBytes >= 2 * (wire::kHeaderBytes + kMaxAckPayload));

// For messages: "\"a\", \"b\"", at most `max` keys, then "and N more".
std::string quoted(const std::vector<std::string>& keys, size_t max = 8);
// The message of an Error or Refused answer.
std::string errorMessage(const uint8_t* payload, size_t size);
// Whether an answer with this header can be read: this version, a known status, a payload
// within `maxPayload`.
bool usableAnswerHeader(const wire::FrameHeader& h, uint64_t maxPayload);

class TcpStore::Impl {
 public:
  Impl(const TcpStoreOptions& options, Store* self);

  const std::string& where() const { return where_; }

  // Before the client is shared, or with mutex_ held (and nothing unacknowledged).
  void connect();

  // --- the operations; each holds mutex_ -------------------------------------------------------

  // See Note [Pipelined sets].
  void set(const std::string& key, const Bytes& value);

  // Runs one request on a quiet connection and hands its answer to `decode` (under the lock: an
  // answer it cannot read closes the connection). A server Error is thrown here.
  template <typename Decode>
  void call(const wire::Request& request, Millis waitMs, Decode&& decode) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto [status, payload] = exchange(request, wire::encodeRequest(request), waitMs);
    if (!decode(status, payload)) throwMalformed(request);
  }

  void flush();

  // Takes the acknowledgements still due, within kCloseDrain (or the operation timeout, when
  // shorter), then closes. Never throws: what it cannot report to a caller it logs.
  void close() noexcept;

  // --- argument checks, before anything is sent ------------------------------------------------

  void checkKey(const std::string& key) const;
  void checkValue(const std::string& key, const Bytes& value) const;
  void checkKeys(const std::vector<std::string>& keys) const;
  size_t maxValueBytes() const { return options_.limits.maxValueBytes; }

 private:
  struct Unacked {
    std::string key;
    size_t bytes;  // of its frame
  };

  struct Frame {
    wire::Status status = wire::Status::Ok;
    Bytes payload;
    bool headerDone = false;
  };

  Millis timeout() const { return self_->timeout(); }  // never zero (Note [Zero timeouts])
  size_t buffered() const { return rend_ - rbegin_; }

  // Before a request: with `all`, waits for every acknowledgement due; then throws the first
  // error of a set that no call has reported yet.
  void settle(bool all);

  void throwSetError();

  void keepSetError(std::exception_ptr e);

  // A live connection. Called on a quiet one (nothing unacknowledged), or right after using it.
  void open();

  // Every way out of a connection: whatever was unacknowledged on it is accounted for first.
  void closeConnection();

  std::string unackedKeys() const;

  // --- acknowledgements of pipelined sets (Note [Pipelined sets]) ------------------------------

  // Takes acknowledgements, oldest first. Without `wait`: those that have already arrived (one
  // non-blocking receive at most). With it: blocks until no more than `maxCount` sets and
  // `maxBytes` bytes stay unacknowledged, or `deadline`. Failures are kept for the next call.
  void takeAcks(bool wait, size_t maxCount, size_t maxBytes, net::Clock::time_point deadline);

  // The size of the acknowledgement at the front of the buffer once all of it is there, else 0.
  // A malformed header breaks the connection (then 0 too).
  size_t bufferedAck();

  // Takes the acknowledgement of the oldest unacknowledged set: `size` bytes at rbuf_[rbegin_].
  void takeAck(size_t size);

  // The connection is gone with sets unacknowledged: nobody can tell which were applied.
  void loseConnection(const net::IoResult& r, net::Clock::time_point start,
                      const std::string& doing);

  // The server broke the protocol: the stream cannot be trusted past this point.
  void breakConnection(const std::string& what);

  void dropUnacked();

  // --- one round trip --------------------------------------------------------------------------

  // Sends `frame` (the encoding of `request`) on a quiet connection and returns the answer's
  // status and payload; a server Error or Refused is thrown here. `waitMs`: how long the server
  // may legitimately hold the request (Get/Wait), added to the network deadline.
  std::pair<wire::Status, Bytes> exchange(const wire::Request& request, const Bytes& frame,
                                          Millis waitMs);

  // The next frame: what is buffered first, then from the socket until `deadline`. A header that
  // breaks the format or announces more than `maxPayload` is described in *malformed.
  net::IoResult readFrame(uint64_t maxPayload, net::Clock::time_point deadline, Frame* out,
                          std::string* malformed);

  [[noreturn]] void fail(const wire::Request& request, const net::IoResult& r,
                         net::Clock::time_point start, const char* doing);

  [[noreturn]] void throwMalformed(const wire::Request& request);

  // With nothing outstanding, nothing may arrive, so a readable socket means the server closed
  // it (or broke the protocol).
  bool peerClosed() const;

  TcpStoreOptions options_;
  Store* self_;
  std::string where_;
  std::string token_;  // never logged
  std::mutex mutex_;   // one request in flight at a time; guards everything below
  net::Socket socket_;
  net::Clock::time_point lastUse_{};
  // Received, not yet taken: rbuf_[rbegin_, rend_).
  std::vector<uint8_t> rbuf_ = std::vector<uint8_t>(kReceiveBufferBytes);
  size_t rbegin_ = 0;
  size_t rend_ = 0;
  // Sets sent, oldest first, whose acknowledgement has not been read; empty whenever socket_ is
  // closed. See Note [Pipelined sets].
  std::deque<Unacked> unacked_;
  size_t unackedBytes_ = 0;
  std::exception_ptr setError_;  // the first failure of a set, for the next call
};

}  // namespace dtrain::store
