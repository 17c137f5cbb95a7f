#include "metrics/http_server.h"

#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <uv.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "net/socket.h"

namespace dtrain::metrics {

// Note [Metrics server]
// Scrapers keep their connection alive between scrapes (Prometheus does; a pair of them for high
// availability, plus a curl, is already three), and anyone who can reach the port can open
// connections and say nothing, or say nonsense. A server that gives each connection a thread
// from a small pool and reads it with a blocking timeout (cpp-httplib, used here before) is held
// up by a handful of them: four idle connections delayed a scrape by 10 s, sixty-four refused it.
// So the endpoint is one libuv event loop, as the store is: every connection is non-blocking and
// costs only its buffer until it has a whole request; a request is answered the moment its blank
// line arrives (the render runs on the loop thread: it only formats what the monitor already
// holds). What a connection may hold and how long is bounded (HttpLimits): a head longer than
// 8 KiB is answered 414 or 431, bytes that cannot start a request 400, a body 400, all then
// closed; a head not complete 10 s after its first byte, a connection idle for 60 s, and a
// response unread for 10 s are closed; past 512 connections the one idle the longest makes room.
// After an error answer the connection stops taking requests, shuts its side down and drains what
// the client still sends (up to a second), so the client reads the answer instead of a reset.
// Keep-alive and pipelined requests are answered in order, one response in flight at a time.

namespace {

constexpr size_t kReadChunk = 16 * 1024;
constexpr std::chrono::milliseconds kLinger{1000};
constexpr size_t kMaxMethodBytes = 16;

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

bool isMethodChar(char c) { return c >= 'A' && c <= 'Z'; }

// Whether `in` can still be the start of a request line: an upper-case method, then a space.
bool plausibleStart(std::string_view in) {
  const size_t n = std::min(in.size(), kMaxMethodBytes + 1);
  for (size_t i = 0; i < n; ++i) {
    if (in[i] == ' ') return i > 0;
    if (!isMethodChar(in[i])) return false;
  }
  return n <= kMaxMethodBytes;
}

// Offset just past the blank line that ends a head ("\r\n\r\n" or, leniently, "\n\n"); 0 when
// none has arrived.
size_t headEnd(std::string_view in) {
  for (size_t i = in.find('\n'); i != std::string_view::npos; i = in.find('\n', i + 1)) {
    if (i + 1 < in.size() && in[i + 1] == '\n') return i + 2;
    if (i + 2 < in.size() && in[i + 1] == '\r' && in[i + 2] == '\n') return i + 3;
  }
  return 0;
}

const char* reasonOf(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
  }
}

}  // namespace

HttpRequestHead parseRequestHead(std::string_view head) {
  HttpRequestHead r;
  const size_t lineEnd = head.find('\n');
  const std::string_view line = trim(head.substr(0, lineEnd));
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    r.status = 400;
    return r;
  }
  r.method = std::string(line.substr(0, sp1));
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (r.method.empty() || !std::all_of(r.method.begin(), r.method.end(), isMethodChar) ||
      target.empty() || target.front() != '/' || version.substr(0, 5) != "HTTP/") {
    r.status = 400;
    return r;
  }
  const bool http11 = version == "HTTP/1.1";
  if (!http11 && version != "HTTP/1.0") {
    r.status = 505;
    return r;
  }
  r.path = std::string(target.substr(0, target.find('?')));
  r.keepAlive = http11;
  for (size_t at = lineEnd; at != std::string_view::npos && at + 1 < head.size();) {
    const size_t next = head.find('\n', at + 1);
    const std::string_view field = trim(head.substr(at + 1, next - at - 1));
    at = next;
    if (field.empty()) continue;
    const size_t colon = field.find(':');
    if (colon == std::string_view::npos || colon == 0) {
      r.status = 400;
      return r;
    }
    const std::string name = lower(trim(field.substr(0, colon)));
    const std::string value = lower(trim(field.substr(colon + 1)));
    if (name == "connection") {
      if (value.find("close") != std::string::npos) r.keepAlive = false;
      if (value.find("keep-alive") != std::string::npos) r.keepAlive = true;
    } else if ((name == "content-length" && value != "0") || name == "transfer-encoding") {
      r.status = 400;  // scrapes have no body, and skipping one is not worth its risks
      return r;
    }
  }
  if (r.method != "GET" && r.method != "HEAD") r.status = 405;
  return r;
}

// --- The server ---------------------------------------------------------------------------------

// One client (below). Not in the anonymous namespace: Impl holds pointers to it, and a unity
// build compiles this file as if it were a header.
struct HttpConnection;

struct HttpServer::Impl {
  std::vector<HttpRoute> routes;
  HttpLimits limits;
  std::string where;  // "host:port"
  uint16_t port = 0;
  uv_loop_t loop;
  uv_tcp_t listener;
  uv_async_t stopAsync;
  std::thread thread;
  std::atomic<size_t> open{0};
  // Loop thread only: every live connection, the one active the longest ago first.
  std::list<HttpConnection*> byActivity;

  void bind(const std::string& host, uint16_t requested, const std::string& option);
  void onConnectionOnLoop();
  void stopOnLoop();
  // Closes the connection idle the longest (none in the middle of a response); false if none.
  bool evictOnLoop();
};

namespace {

struct WriteRequest {
  uv_write_t req;
  std::string bytes;
};

}  // namespace

// One client, on the loop thread. Deletes itself when its handles are closed.
struct HttpConnection {
  enum class State { Idle, Head, Writing, Lingering };

  HttpServer::Impl* server;
  uv_tcp_t tcp;
  uv_timer_t timer;
  int openHandles = 0;
  bool closing = false;
  State state = State::Idle;
  bool closeAfterWrite = false;
  std::string in;
  size_t readAt = 0;  // where the buffer handed to libuv starts in `in`
  std::list<HttpConnection*>::iterator position;

  explicit HttpConnection(HttpServer::Impl* s) : server(s) {
    tcp.data = this;
    timer.data = this;
  }

  uv_stream_t* stream() { return reinterpret_cast<uv_stream_t*>(&tcp); }

  void touch() {
    server->byActivity.splice(server->byActivity.end(), server->byActivity, position);
  }

  void arm(std::chrono::milliseconds after) {
    uv_timer_start(
        &timer, [](uv_timer_t* t) { static_cast<HttpConnection*>(t->data)->close(); },
        static_cast<uint64_t>(std::max<int64_t>(1, after.count())), 0);
  }

  bool accept(uv_stream_t* listener) {
    uv_tcp_init(&server->loop, &tcp);
    ++openHandles;
    uv_timer_init(&server->loop, &timer);
    ++openHandles;
    server->byActivity.push_back(this);
    position = std::prev(server->byActivity.end());
    server->open.fetch_add(1);
    if (uv_accept(listener, stream()) != 0) return false;
    uv_tcp_nodelay(&tcp, 1);
    arm(server->limits.idleTimeout);
    return uv_read_start(stream(), allocCb, readCb) == 0;
  }

  void close() {
    if (closing) return;
    closing = true;
    server->byActivity.erase(position);
    server->open.fetch_sub(1);
    uv_close(reinterpret_cast<uv_handle_t*>(&timer), closeCb);
    uv_close(reinterpret_cast<uv_handle_t*>(&tcp), closeCb);
  }

  static void closeCb(uv_handle_t* h) {
    auto* c = static_cast<HttpConnection*>(h->data);
    if (--c->openHandles == 0) delete c;
  }

  static void allocCb(uv_handle_t* h, size_t, uv_buf_t* buf) {
    auto* c = static_cast<HttpConnection*>(h->data);
    c->readAt = c->in.size();
    c->in.resize(c->readAt + kReadChunk);
    *buf = uv_buf_init(c->in.data() + c->readAt, kReadChunk);
  }

  static void readCb(uv_stream_t* s, ssize_t n, const uv_buf_t* buf) {
    auto* c = static_cast<HttpConnection*>(s->data);
    (void)buf;
    c->in.resize(c->readAt + static_cast<size_t>(std::max<ssize_t>(n, 0)));
    if (n < 0) return c->close();  // end of stream or an error
    if (n == 0) return;
    c->onBytes();
  }

  void onBytes() {
    if (state == State::Lingering) {
      in.clear();  // drained: the answer is on its way
      return;
    }
    touch();
    if (state == State::Idle) {
      state = State::Head;
      arm(server->limits.headTimeout);
    }
    serve();
  }

  // Answers every whole request in `in`, one at a time.
  void serve() {
    while (state == State::Head) {
      if (!plausibleStart(in)) return fail(400, "this is not an HTTP request\n");
      const size_t end = headEnd(in);
      if (end == 0) {
        if (in.size() <= server->limits.maxHeadBytes) return;
        const bool lineEnded = in.find('\n') < server->limits.maxHeadBytes;
        return fail(lineEnded ? 431 : 414,
                    fmt::format("the request {} is longer than {} bytes\n",
                                lineEnded ? "head" : "line", server->limits.maxHeadBytes));
      }
      if (end > server->limits.maxHeadBytes) {
        return fail(431, fmt::format("the request head is longer than {} bytes\n",
                                     server->limits.maxHeadBytes));
      }
      const HttpRequestHead head = parseRequestHead(std::string_view(in).substr(0, end));
      in.erase(0, end);
      answer(head);
    }
  }

  void answer(const HttpRequestHead& head) {
    if (head.status != 0) {
      return fail(head.status,
                  head.status == 405 ? "only GET and HEAD are served\n" : "malformed request\n");
    }
    const HttpRoute* route = nullptr;
    for (const HttpRoute& r : server->routes) {
      if (r.path == head.path) route = &r;
    }
    if (route == nullptr) {
      return respond(404, "text/plain; charset=utf-8", "not found; metrics are at /metrics\n",
                     head.keepAlive, head.method == "HEAD");
    }
    std::string body;
    try {
      body = route->body();
    } catch (const std::exception& e) {
      return respond(500, "text/plain; charset=utf-8", std::string(e.what()) + "\n", false, false);
    }
    respond(200, route->contentType, body, head.keepAlive, head.method == "HEAD");
  }

  void fail(int status, const std::string& why) {
    respond(status, "text/plain; charset=utf-8", why, false, false);
  }

  void respond(int status, const std::string& type, const std::string& body, bool keepAlive,
               bool headOnly) {
    auto* w = new WriteRequest;
    w->req.data = this;
    w->bytes = fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n"
                           "Connection: {}\r\n{}\r\n",
                           status, reasonOf(status), type, body.size(),
                           keepAlive ? "keep-alive" : "close",
                           status == 405 ? "Allow: GET, HEAD\r\n" : "");
    if (!headOnly) w->bytes += body;
    state = State::Writing;
    closeAfterWrite = !keepAlive;
    if (closeAfterWrite) in.clear();
    uv_read_stop(stream());  // one response in flight: a client that does not read stops here
    arm(server->limits.writeTimeout);
    uv_buf_t buf = uv_buf_init(w->bytes.data(), w->bytes.size());
    if (uv_write(&w->req, stream(), &buf, 1, writeCb) != 0) {
      delete w;
      close();
    }
  }

  static void writeCb(uv_write_t* req, int status) {
    auto* w = reinterpret_cast<WriteRequest*>(req);
    auto* c = static_cast<HttpConnection*>(req->data);
    delete w;
    if (status == UV_ECANCELED || c->closing) return;
    if (status < 0) return c->close();
    c->written();
  }

  void written() {
    if (closeAfterWrite) return linger();
    state = in.empty() ? State::Idle : State::Head;
    arm(state == State::Idle ? server->limits.idleTimeout : server->limits.headTimeout);
    if (uv_read_start(stream(), allocCb, readCb) != 0) return close();
    serve();
  }

  // After an answer that closes: FIN, then read and drop until the client closes or kLinger.
  void linger() {
    state = State::Lingering;
    arm(kLinger);
    auto* shutdown = new uv_shutdown_t;
    shutdown->data = this;
    if (uv_shutdown(shutdown, stream(), [](uv_shutdown_t* s, int) { delete s; }) != 0) {
      delete shutdown;
      return close();
    }
    if (uv_read_start(stream(), allocCb, readCb) != 0) close();
  }
};

namespace {

// The address to bind: numeric addresses directly, names through the resolver.
bool bindAddress(const std::string& host, uint16_t port, sockaddr_storage* addr, std::string* why) {
  *addr = {};
  if (uv_ip4_addr(host.c_str(), port, reinterpret_cast<sockaddr_in*>(addr)) == 0) return true;
  if (uv_ip6_addr(host.c_str(), port, reinterpret_cast<sockaddr_in6*>(addr)) == 0) return true;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* list = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list);
  if (rc != 0) {
    *why = fmt::format("cannot resolve \"{}\": {}", host, ::gai_strerror(rc));
    return false;
  }
  std::memcpy(addr, list->ai_addr, list->ai_addrlen);
  ::freeaddrinfo(list);
  return true;
}

}  // namespace

void HttpServer::Impl::bind(const std::string& host, uint16_t requested,
                            const std::string& option) {
  where = net::hostPort(host, requested);
  sockaddr_storage addr{};
  std::string why;
  int rc = 0;
  if (bindAddress(host, requested, &addr, &why)) {
    // libuv sets SO_REUSEADDR (a restarted launch rebinds at once), never SO_REUSEPORT; it may
    // report a failure at bind() or only at listen().
    rc = uv_tcp_bind(&listener, reinterpret_cast<const sockaddr*>(&addr), 0);
    if (rc == 0) {
      rc = uv_listen(reinterpret_cast<uv_stream_t*>(&listener), 511, [](uv_stream_t* s, int st) {
        if (st == 0) static_cast<Impl*>(s->data)->onConnectionOnLoop();
      });
    }
    if (rc != 0) why = fmt::format("{} ({})", uv_strerror(rc), uv_err_name(rc));
  }
  if (!why.empty()) {
    DTRAIN_THROW(InvalidArgument, "{}: cannot listen on {}: {}. HINT: {}", option, where, why,
                 rc == UV_EADDRINUSE
                     ? "the port is probably in use: pick another one, or 0 for a free one"
                     : "give an address of this machine (0.0.0.0 for all, 127.0.0.1 for this "
                       "machine only)");
  }
  sockaddr_storage bound{};
  int len = sizeof(bound);
  uv_tcp_getsockname(&listener, reinterpret_cast<sockaddr*>(&bound), &len);
  port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  where = net::hostPort(host, port);
}

void HttpServer::Impl::onConnectionOnLoop() {
  if (open.load() >= limits.maxConnections && !evictOnLoop()) {
    // Every connection is in the middle of a response: take this one and close it at once.
    auto* c = new HttpConnection(this);
    c->accept(reinterpret_cast<uv_stream_t*>(&listener));
    return c->close();
  }
  auto* c = new HttpConnection(this);
  if (!c->accept(reinterpret_cast<uv_stream_t*>(&listener))) c->close();
}

bool HttpServer::Impl::evictOnLoop() {
  for (HttpConnection* c : byActivity) {
    if (c->state != HttpConnection::State::Writing) {
      c->close();
      return true;
    }
  }
  return false;
}

void HttpServer::Impl::stopOnLoop() {
  std::vector<HttpConnection*> all(byActivity.begin(), byActivity.end());
  for (HttpConnection* c : all) c->close();
  uv_close(reinterpret_cast<uv_handle_t*>(&listener), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&stopAsync), nullptr);
}

HttpServer::HttpServer(const std::string& host, uint16_t port, const std::string& option,
                       std::vector<HttpRoute> routes, HttpLimits limits)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.routes = std::move(routes);
  s.limits = limits;
  const int rc = uv_loop_init(&s.loop);
  DTRAIN_CHECK(rc == 0, "{}: uv_loop_init failed: {}", option, uv_strerror(rc));
  uv_tcp_init(&s.loop, &s.listener);
  s.listener.data = impl_.get();
  uv_async_init(&s.loop, &s.stopAsync,
                [](uv_async_t* a) { static_cast<Impl*>(a->data)->stopOnLoop(); });
  s.stopAsync.data = impl_.get();
  try {
    s.bind(host, port, option);
  } catch (...) {
    uv_close(reinterpret_cast<uv_handle_t*>(&s.listener), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&s.stopAsync), nullptr);
    uv_run(&s.loop, UV_RUN_DEFAULT);
    uv_loop_close(&s.loop);
    throw;
  }
  s.thread = std::thread([impl = impl_.get()] {
    ::pthread_setname_np(::pthread_self(), "dtrain-metrics");
    // A client that resets its connection must not end the process with SIGPIPE: blocked here,
    // the write fails with EPIPE instead and closes that connection only.
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    uv_run(&impl->loop, UV_RUN_DEFAULT);
  });
}

HttpServer::~HttpServer() {
  uv_async_send(&impl_->stopAsync);
  impl_->thread.join();
  const int rc = uv_loop_close(&impl_->loop);
  if (rc != 0) {
    DTRAIN_LOG(Warn, "metrics server {}: loop did not close cleanly: {}", impl_->where,
               uv_strerror(rc));
  }
}

uint16_t HttpServer::port() const { return impl_->port; }

size_t HttpServer::connections() const { return impl_->open.load(); }

}  // namespace dtrain::metrics
