#pragma once
// HttpServer: the HTTP/1.1 server behind PrometheusServer -- one libuv event-loop thread, every
// connection non-blocking and bounded in what it may hold and how long, so that no client, idle
// or hostile, can hold up a scrape. See Note [Metrics server] in http_server.cpp.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::metrics {

struct HttpLimits {
  // Request line and headers together; past it: 414 (no line end yet) or 431, then close.
  size_t maxHeadBytes = 8192;
  // From a request's first byte to its blank line: a truncated or trickled request is closed.
  std::chrono::milliseconds headTimeout{10000};
  // A connection with no request in progress (kept alive, or never used) is closed after this.
  std::chrono::milliseconds idleTimeout{60000};
  // A response the client does not read within this is dropped with its connection.
  std::chrono::milliseconds writeTimeout{10000};
  // Open connections; one more closes the one idle the longest.
  size_t maxConnections = 512;
};

struct HttpRoute {
  std::string path;                   // "/metrics"
  std::string contentType;            // of what `body` returns
  std::function<std::string()> body;  // runs on the server's thread, at each request
};

// What HttpServer reads of a request head (request line and headers, without the blank line).
// Pure, for tests.
struct HttpRequestHead {
  int status = 0;  // 0: well-formed; otherwise the error status to answer before closing
  std::string method;
  std::string path;  // the target without its query
  bool keepAlive = false;
};
HttpRequestHead parseRequestHead(std::string_view head);

class HttpServer {
 public:
  // Binds host:port (port 0: a free one) on the caller's thread -- an InvalidArgument naming
  // `option`, host and port when it cannot (a busy port above all; SO_REUSEADDR only, never
  // SO_REUSEPORT, which would let a second process take half the scrapes) -- then serves on a
  // thread of its own ("dtrain-metrics").
  HttpServer(const std::string& host, uint16_t port, const std::string& option,
             std::vector<HttpRoute> routes, HttpLimits limits = {});
  ~HttpServer();  // closes every connection and joins the thread
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  uint16_t port() const;
  // Connections open now.
  size_t connections() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::metrics
