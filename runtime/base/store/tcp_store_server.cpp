// TcpStoreServer on libuv: binding, the loop thread, accepting, stopping. The per-client work
// is in server_connection.cpp.
#include <netdb.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "net/socket.h"
#include "store/server.h"

namespace dtrain::store {

namespace {

constexpr size_t kReadBufferBytes = 64 * 1024;
constexpr int kLoggedDropsPerWindow = 10;
constexpr std::chrono::milliseconds kDropLogWindow{1000};

// The socket address to bind: numeric addresses directly, names through the resolver.
sockaddr_storage resolveBindAddress(const std::string& host, uint16_t port) {
  sockaddr_storage addr{};
  if (uv_ip4_addr(host.c_str(), port, reinterpret_cast<sockaddr_in*>(&addr)) == 0) return addr;
  if (uv_ip6_addr(host.c_str(), port, reinterpret_cast<sockaddr_in6*>(&addr)) == 0) return addr;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* list = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list);
  if (rc != 0) {
    DTRAIN_THROW(NetworkError,
                 "store server cannot listen on {}: cannot resolve \"{}\": {}. HINT: give an IP "
                 "address of this host (or 0.0.0.0 for all interfaces)",
                 net::hostPort(host, port), host, ::gai_strerror(rc));
  }
  std::memcpy(&addr, list->ai_addr, list->ai_addrlen);
  ::freeaddrinfo(list);
  return addr;
}

bool isLoopback(const sockaddr_storage& addr) {
  if (addr.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
  }
  if (addr.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    return IN6_IS_ADDR_LOOPBACK(&a->sin6_addr) ||
           (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr) && a->sin6_addr.s6_addr[12] == 127);
  }
  return false;
}

const char* bindHint(int rc) {
  switch (rc) {
    case UV_EADDRINUSE: return "another job uses this port? pick --rdzv-endpoint / a free port";
    case UV_EADDRNOTAVAIL: return "the address is not one of this host's; pick one it has";
    case UV_EACCES: return "ports below 1024 need privileges; pick a port above 1024";
    default: return "check the address and port";
  }
}

}  // namespace

std::unique_ptr<TcpStoreServer> TcpStoreServer::start(const TcpStoreServerOptions& options) {
  return std::make_unique<UvStoreServer>(options);
}

UvStoreServer::UvStoreServer(const TcpStoreServerOptions& options)
    : options_(options),
      where_(net::hostPort(options.host, options.port)),
      requestCounts_(std::max<size_t>(options.requestClasses, 1)),
      table_(options.limits.maxValueBytes),
      readBuffer_(kReadBufferBytes) {
  // Zero: the default (Note [Zero timeouts]); the default idle timeout is none.
  options_.handshakeTimeout = timeoutOrDefault(options.handshakeTimeout, kDefaultHandshakeTimeout,
                                               "TcpStoreServerOptions::handshakeTimeout");
  options_.frameTimeout = timeoutOrDefault(options.frameTimeout, kDefaultFrameTimeout,
                                           "TcpStoreServerOptions::frameTimeout");
  options_.idleTimeout = timeoutOrDefault(options.idleTimeout, kDefaultIdleTimeout,
                                          "TcpStoreServerOptions::idleTimeout");
  int rc = uv_loop_init(&loop_);
  DTRAIN_CHECK_T(NetworkError, rc == 0, "store server {}: uv_loop_init failed: {}", where_,
                 uv_strerror(rc));
  uv_tcp_init(&loop_, &listener_);
  listener_.data = this;
  uv_async_init(&loop_, &stopAsync_,
                [](uv_async_t* a) { static_cast<UvStoreServer*>(a->data)->stopOnLoop(); });
  stopAsync_.data = this;
  uv_timer_init(&loop_, &dropWindowTimer_);
  dropWindowTimer_.data = this;
  try {
    bindOrThrow();
  } catch (...) {
    // Close what was opened; the loop runs only to deliver the close callbacks.
    uv_close(reinterpret_cast<uv_handle_t*>(&listener_), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&stopAsync_), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&dropWindowTimer_), nullptr);
    uv_run(&loop_, UV_RUN_DEFAULT);
    uv_loop_close(&loop_);
    throw;
  }
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "dtrain-store");
    // libuv writes with write(2): on a connection the peer has reset, that raises SIGPIPE, whose
    // default action would end the whole process hosting the store (the launcher). Blocked in
    // this thread, the signal stays pending on it and the write fails with EPIPE instead, which
    // closes just that connection. Other threads of the process keep their own mask.
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    uv_run(&loop_, UV_RUN_DEFAULT);
  });
  DTRAIN_LOG(Info, "store server listening on {}{}", where_,
             options_.token.empty() ? " (no job token)" : " (job token required)");
}

void UvStoreServer::bindOrThrow() {
  sockaddr_storage addr = resolveBindAddress(options_.host, options_.port);
  DTRAIN_CHECK_ARG(!options_.token.empty() || options_.allowNoTokenOffLoopback || isLoopback(addr),
                   "store server {}: refusing to serve a non-loopback address without a job "
                   "token: anyone who can reach it could read and write the job's keys. HINT: "
                   "set a token (`launch` does), bind 127.0.0.1, or set "
                   "TcpStoreServerOptions::allowNoTokenOffLoopback",
                   where_);
  // libuv may report a bind failure at bind() or only at listen(); both end here.
  int rc = uv_tcp_bind(&listener_, reinterpret_cast<const sockaddr*>(&addr), 0);
  if (rc == 0) {
    rc = uv_listen(reinterpret_cast<uv_stream_t*>(&listener_), options_.backlog,
                   [](uv_stream_t* s, int status) {
                     static_cast<UvStoreServer*>(s->data)->onConnection(status);
                   });
  }
  if (rc != 0) {
    DTRAIN_THROW(
        NetworkError, "store server cannot listen on {} (address {}, port {}): {} ({}). HINT: {}",
        where_, options_.host, options_.port, uv_strerror(rc), uv_err_name(rc), bindHint(rc));
  }
  sockaddr_storage bound{};
  int len = sizeof(bound);
  uv_tcp_getsockname(&listener_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  where_ = net::hostPort(options_.host, port_);
}

std::vector<uint64_t> UvStoreServer::requestCounts() const {
  std::vector<uint64_t> out;
  for (const auto& c : requestCounts_) out.push_back(c.load(std::memory_order_relaxed));
  return out;
}

void UvStoreServer::countRequestOnLoop(const wire::Request& request) {
  size_t cls = 0;
  if (options_.classify && !request.keys.empty()) {
    cls = std::min(options_.classify(request.keys[0]), requestCounts_.size() - 1);
  }
  requestCounts_[cls].fetch_add(1, std::memory_order_relaxed);
}

UvStoreServer::~UvStoreServer() { stop(); }

void UvStoreServer::stop() {
  DTRAIN_CHECK(std::this_thread::get_id() != thread_.get_id(),
               "store server {}: stop() called from its own event-loop thread", where_);
  std::lock_guard<std::mutex> lock(stopMutex_);
  if (stopped_) return;
  stopped_ = true;
  uv_async_send(&stopAsync_);
  if (thread_.joinable()) thread_.join();
  int rc = uv_loop_close(&loop_);
  if (rc != 0) {
    DTRAIN_LOG(Warn, "store server {}: loop did not close cleanly: {}", where_, uv_strerror(rc));
  }
  DTRAIN_LOG(Info, "store server {} stopped", where_);
}

void UvStoreServer::stopOnLoop() {
  std::vector<Connection*> all(live_.begin(), live_.end());
  for (Connection* c : all) c->closeOnLoop();
  closeDropWindowOnLoop();  // after the connections: closing them drops none, but be sure
  uv_close(reinterpret_cast<uv_handle_t*>(&listener_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&stopAsync_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&dropWindowTimer_), nullptr);
}

void UvStoreServer::onConnection(int status) {
  if (status < 0) {
    logDropOnLoop("a new client", fmt::format("accept failed: {}", uv_strerror(status)));
    return;
  }
  auto* c = new Connection(this);
  live_.insert(c);
  connections_.fetch_add(1);
  // acceptOnLoop() closes the connection itself on failure (an exception included).
  c->acceptOnLoop(reinterpret_cast<uv_stream_t*>(&listener_));
}

void UvStoreServer::connectionClosingOnLoop(Connection* c) {
  if (live_.erase(c) > 0) connections_.fetch_sub(1);
}

void UvStoreServer::scheduleResumeOnLoop(Connection* c) {
  if (c->inResumeList) return;
  c->inResumeList = true;
  resumes_.push_back(c);
}

void UvStoreServer::drainResumesOnLoop() {
  // Connections are deleted only by close callbacks, which libuv runs in a later phase of the
  // loop, so every pointer here is still valid (closing ones just return).
  while (!resumes_.empty()) {
    std::vector<Connection*> batch;
    batch.swap(resumes_);
    for (Connection* c : batch) {
      c->inResumeList = false;
      c->resumeOnLoop();
    }
  }
}

// Note [Drop log]
// ~~~~~~~~~~~~~~~
// A flood of bad clients must not flood the log, and must not vanish from it either. The first
// drop opens a window of kDropLogWindow; its first kLoggedDropsPerWindow drops are logged one
// line each and the rest only counted. When the window ends -- a timer, so the count comes out
// even when no later drop does -- or the server stops, one line says how many were left out.
// Every dropped client is thus in the log, as a line of its own or in a count.
void UvStoreServer::logDropOnLoop(const std::string& peer, const std::string& why) {
  auto now = std::chrono::steady_clock::now();
  // The timer may not have run yet (a busy loop turn): the window is over all the same.
  if (loggedInWindow_ > 0 && now - logWindow_ >= kDropLogWindow) closeDropWindowOnLoop();
  if (loggedInWindow_ == 0) logWindow_ = now;
  if (loggedInWindow_ < kLoggedDropsPerWindow) {
    ++loggedInWindow_;
    DTRAIN_LOG(Warn, "store {}: dropped client {}: {}", where_, peer, why);
    return;
  }
  if (suppressed_++ == 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(logWindow_ + kDropLogWindow -
                                                                      now);
    uv_timer_start(
        &dropWindowTimer_,
        [](uv_timer_t* t) { static_cast<UvStoreServer*>(t->data)->closeDropWindowOnLoop(); },
        static_cast<uint64_t>(std::max<int64_t>(left.count(), 0)) + 1, 0);
  }
}

void UvStoreServer::closeDropWindowOnLoop() {
  uv_timer_stop(&dropWindowTimer_);
  if (suppressed_ > 0) {
    DTRAIN_LOG(Warn, "store {}: {} more dropped clients not shown", where_, suppressed_);
  }
  loggedInWindow_ = 0;
  suppressed_ = 0;
}

}  // namespace dtrain::store
