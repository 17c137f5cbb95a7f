#pragma once
// The HTTP side of --metrics-port: GET /metrics answers Prometheus text (format 0.0.4) made by a
// callback at scrape time. cpp-httplib on one thread of its own with a one-thread task queue (a
// scrape every few seconds needs no pool); it blocks in accept(), so an idle endpoint costs no CPU.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace dtrain::launcher::monitor {

class MetricsEndpoint {
 public:
  // Binds `host`:`port` (0: a free port) before returning and serves on a thread. A busy port or
  // a host it cannot bind is an InvalidArgument naming them.
  MetricsEndpoint(const std::string& host, int port, std::function<std::string()> render);
  ~MetricsEndpoint();  // stops serving
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }
  const std::string& host() const { return host_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string host_;
  int port_ = 0;
};

}  // namespace dtrain::launcher::monitor
