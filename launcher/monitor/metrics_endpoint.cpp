#include "launcher/monitor/metrics_endpoint.h"

#include <pthread.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <chrono>
#include <thread>

#include <httplib.h>

#include "dtrain/error.h"
#include "launcher/launch_config.h"

namespace dtrain::launcher::monitor {

struct MetricsEndpoint::Impl {
  httplib::Server server;
  std::thread thread;
};

MetricsEndpoint::MetricsEndpoint(const std::string& host, int port,
                                 std::function<std::string()> render)
    : impl_(std::make_unique<Impl>()), host_(host) {
  httplib::Server& s = impl_->server;
  s.new_task_queue = [] { return new httplib::ThreadPool(1); };
  // cpp-httplib's default adds SO_REUSEPORT, with which a second launch on the same port would
  // bind too and share the scrapes: SO_REUSEADDR only (a restarted launch rebinds at once).
  s.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  s.Get("/metrics", [render](const httplib::Request&, httplib::Response& res) {
    res.set_content(render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  s.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("dtrain launch: metrics at /metrics\n", "text/plain; charset=utf-8");
  });
  if (port == 0) {
    port_ = s.bind_to_any_port(host);
    DTRAIN_CHECK_ARG(port_ > 0, "--metrics-port: cannot bind a free port on {}: {}; HINT: give "
                     "an address of this machine (0.0.0.0 for all)", excerpt(host),
                     std::strerror(errno));
  } else {
    DTRAIN_CHECK_ARG(s.bind_to_port(host, port), "--metrics-port: cannot listen on {}:{}: {}; "
                     "HINT: the port is probably in use: pick another one, or 0 for a free one",
                     excerpt(host), port, std::strerror(errno));
    port_ = port;
  }
  impl_->thread = std::thread([this] {
    ::pthread_setname_np(::pthread_self(), "launch-metrics");
    impl_->server.listen_after_bind();
  });
  // stop() before the thread is listening would be lost (and the join below never return).
  for (int i = 0; i < 2000 && !impl_->server.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

MetricsEndpoint::~MetricsEndpoint() {
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace dtrain::launcher::monitor
