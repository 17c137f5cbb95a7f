#pragma once
// Internals of TcpStoreServer: the libuv server and its per-client connections. Everything here
// runs on the server's one event-loop thread ("...OnLoop" in a name says so), except start(),
// stop() and the const getters of UvStoreServer.

#include <uv.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "dtrain/base/tcp_store.h"
#include "store/kv_table.h"
#include "store/wire.h"

namespace dtrain::store {

class UvStoreServer;

// One client: reads bytes as they come, runs the handshake, parses frames incrementally and
// answers them; parks Get/Wait on missing keys (Note [Parked requests]). Owns three libuv handles
// and deletes itself once all are closed.
class Connection final : public KvTable::Waiter {
 public:
  explicit Connection(UvStoreServer* server);
  // On failure the connection closes itself (see closing()).
  void acceptOnLoop(uv_stream_t* listener);
  // Processes buffered bytes until it needs more, is parked, or is blocked on a slow reader.
  void resumeOnLoop();
  // Closes without a word (the peer left, or the server stops). Idempotent.
  void closeOnLoop();
  // Logs `why` with the peer's address, then closes.
  void dropOnLoop(const std::string& why);
  bool closing() const { return closing_; }
  const std::string& peer() const { return peer_; }
  bool inResumeList = false;  // owned by UvStoreServer::drainResumesOnLoop

  void onKeysReady() override;

 private:
  enum class Phase { Hello, Proof, Ready };
  enum class Deadline { None, Handshake, Frame, Idle };

  uv_stream_t* stream() { return reinterpret_cast<uv_stream_t*>(&tcp_); }
  size_t buffered() const { return in_.size() - inStart_; }
  bool blocked();
  void startOnLoop();
  void resumeUnguarded();
  // Each returns false when the connection is done (closing) or needs more bytes.
  bool stepHello();
  bool stepProof();
  bool stepFrame();
  void consume(size_t n);
  void send(Bytes frame);
  // Best effort, for the last words before closing: never queues.
  void sendNow(const uint8_t* data, size_t size);
  void armDeadline();
  // Runs `f`; an exception (an allocation failing, OpenSSL failing) drops this client only,
  // never the loop thread and with it the process.
  template <typename F>
  void guarded(F&& f);
  void onRead(ssize_t n, const uv_buf_t* buf);
  void onDeadline();
  void onWaitTimeout();
  void onWritten(int status);

  static void allocCb(uv_handle_t* h, size_t suggested, uv_buf_t* buf);
  static void readCb(uv_stream_t* s, ssize_t n, const uv_buf_t* buf);
  static void closeCb(uv_handle_t* h);

  UvStoreServer* server_;
  uv_tcp_t tcp_;
  uv_timer_t deadlineTimer_;
  uv_timer_t waitTimer_;
  int openHandles_ = 0;
  bool closing_ = false;
  std::string peer_ = "unknown peer";
  Phase phase_ = Phase::Hello;
  Deadline deadline_ = Deadline::None;
  wire::Nonce clientNonce_{};
  wire::Nonce serverNonce_{};
  Bytes in_;
  size_t inStart_ = 0;
  wire::Request request_;  // the request being answered; stays put while parked
  bool parked_ = false;
  friend struct WriteReq;
};

class UvStoreServer final : public TcpStoreServer {
 public:
  // Binds and listens on the caller's thread (so a bind failure throws here), then starts the
  // loop thread.
  explicit UvStoreServer(const TcpStoreServerOptions& options);
  ~UvStoreServer() override;

  uint16_t port() const override { return port_; }
  std::string host() const override { return options_.host; }
  size_t numConnections() const override { return connections_.load(); }
  size_t numWaiting() const override { return waiting_.load(); }
  std::vector<uint64_t> requestCounts() const override;
  void stop() override;

  // --- loop thread -----------------------------------------------------------------------------
  uv_loop_t* loop() { return &loop_; }
  const TcpStoreServerOptions& options() const { return options_; }
  KvTable& table() { return table_; }
  uv_buf_t readBufferOnLoop() { return uv_buf_init(readBuffer_.data(), readBuffer_.size()); }
  void scheduleResumeOnLoop(Connection* c);
  // Runs every scheduled resume; each libuv callback that may answer a request ends with it.
  void drainResumesOnLoop();
  void connectionClosingOnLoop(Connection* c);
  // A request was parked (+1) or answered / cancelled (-1).
  void countWaitingOnLoop(int delta) { waiting_.fetch_add(static_cast<size_t>(delta)); }
  // One more request of the class its first key belongs to (TcpStoreServerOptions::classify).
  void countRequestOnLoop(const wire::Request& request);
  // Rate-limited, so a flood of bad clients cannot flood the log. See Note [Drop log].
  void logDropOnLoop(const std::string& peer, const std::string& why);
  const std::string& where() const { return where_; }

 private:
  void bindOrThrow();
  void onConnection(int status);
  void stopOnLoop();
  // Ends the drop log's window: prints how many drops it left out, if any.
  void closeDropWindowOnLoop();

  TcpStoreServerOptions options_;
  std::string where_;  // "host:port" for messages
  uint16_t port_ = 0;
  uv_loop_t loop_;
  uv_tcp_t listener_;
  uv_async_t stopAsync_;
  std::thread thread_;
  std::mutex stopMutex_;
  bool stopped_ = false;  // guarded by stopMutex_
  std::atomic<size_t> connections_{0};
  std::atomic<size_t> waiting_{0};
  std::vector<std::atomic<uint64_t>> requestCounts_;  // by class; written on the loop thread only

  // Loop thread only.
  KvTable table_;
  std::unordered_set<Connection*> live_;
  std::vector<Connection*> resumes_;
  std::vector<char> readBuffer_;
  uv_timer_t dropWindowTimer_;  // fires when a window with drops left out ends
  std::chrono::steady_clock::time_point logWindow_{};  // start of the open window
  int loggedInWindow_ = 0;                             // 0: no window is open
  int suppressed_ = 0;
};

}  // namespace dtrain::store
