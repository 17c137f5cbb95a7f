// The Prometheus side of dtrain::metrics: the text exposition of the latest records, the HTTP
// server that answers scrapes (cpp-httplib), and the endpoint sink built from both.
#include <pthread.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include <fmt/format.h>
#include <httplib.h>

#include "dtrain/base/error.h"
#include "dtrain/base/metrics.h"

namespace dtrain::metrics {
namespace {

// One time series: a metric name and its labels.
struct SeriesKey {
  std::string name;  // without the dtrain_ prefix
  std::string node;
  std::optional<int> rank;
  std::optional<int> gpu;
  bool operator<(const SeriesKey& o) const {
    return std::tie(name, node, rank, gpu) < std::tie(o.name, o.node, o.rank, o.gpu);
  }
};

using Latest = std::map<SeriesKey, double>;

// The record's values replace earlier ones of the same series.
void absorb(Latest& latest, const Record& r) {
  auto put = [&](const std::string& name, double value) {
    latest[SeriesKey{name, r.node, r.rank, r.gpu}] = value;
  };
  if (r.step) put("step", static_cast<double>(*r.step));
  for (const auto& [name, value] : r.fields) put(name, value);
}

std::string escapeLabel(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string formatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);  // shortest form that reads back exactly
}

// The map's order groups each metric's samples under its one # HELP / # TYPE block, as the
// format requires.
std::string render(const Latest& latest) {
  std::string out;
  const std::string* current = nullptr;
  for (const auto& [key, value] : latest) {
    if (current == nullptr || *current != key.name) {
      out += fmt::format("# HELP dtrain_{} {}\n# TYPE dtrain_{} {}\n", key.name,
                         fieldHelp(key.name), key.name,
                         fieldIsCounter(key.name) ? "counter" : "gauge");
      current = &key.name;
    }
    std::string labels;
    auto add = [&](const std::string& label) {
      labels += labels.empty() ? "{" : ",";
      labels += label;
    };
    if (!key.node.empty()) add(fmt::format("node=\"{}\"", escapeLabel(key.node)));
    if (key.rank) add(fmt::format("rank=\"{}\"", *key.rank));
    if (key.gpu) add(fmt::format("gpu=\"{}\"", *key.gpu));
    if (!labels.empty()) labels += "}";
    out += fmt::format("dtrain_{}{} {}\n", key.name, labels, formatValue(value));
  }
  return out;
}

}  // namespace

std::string prometheusText(const std::vector<Record>& records) {
  Latest series;
  for (const auto& r : records) absorb(series, r);
  return render(series);
}

// --- PrometheusServer ---------------------------------------------------------------------------

struct PrometheusServer::Impl {
  httplib::Server server;
  std::thread thread;
  std::atomic<bool> listenReturned{false};
};

PrometheusServer::PrometheusServer(const PrometheusOptions& options,
                                   std::function<std::string()> render)
    : impl_(std::make_unique<Impl>()), host_(options.host) {
  httplib::Server& s = impl_->server;
  // Two handler threads and no keep-alive: scrapes are rare, and a scraper holding its
  // connection open must not keep another from being answered.
  s.new_task_queue = [] { return new httplib::ThreadPool(2); };
  s.set_keep_alive_max_count(1);
  s.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  s.Get("/metrics", [render = std::move(render)](const httplib::Request&, httplib::Response& res) {
    res.set_content(render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  s.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("dtrain: metrics at /metrics\n", "text/plain; charset=utf-8");
  });
  if (options.port == 0) {
    const int port = s.bind_to_any_port(options.host);
    DTRAIN_CHECK_ARG(port > 0, "{}: cannot bind a free port on {}: {}. HINT: give an address of "
                     "this machine (0.0.0.0 for all)", options.option, options.host,
                     std::strerror(errno));
    port_ = static_cast<uint16_t>(port);
  } else {
    DTRAIN_CHECK_ARG(s.bind_to_port(options.host, options.port), "{}: cannot listen on {}:{}: {}. "
                     "HINT: the port is probably in use: pick another one, or 0 for a free one",
                     options.option, options.host, options.port, std::strerror(errno));
    port_ = options.port;
  }
  Impl* impl = impl_.get();
  impl->thread = std::thread([impl] {
    ::pthread_setname_np(::pthread_self(), "dtrain-metrics");
    impl->server.listen_after_bind();
    impl->listenReturned = true;
  });
  // stop() is a no-op until the server runs: wait for it, so the destructor cannot miss it.
  while (!impl->server.is_running() && !impl->listenReturned) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  if (!impl->server.is_running()) {
    impl->thread.join();
    DTRAIN_THROW(Error, "the metrics server on {}:{} stopped at once", options.host, port_);
  }
}

PrometheusServer::~PrometheusServer() {
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

// --- PrometheusEndpoint -------------------------------------------------------------------------

struct PrometheusEndpoint::Impl {
  mutable std::mutex mu;
  Latest latest;  // guarded by mu
  std::unique_ptr<PrometheusServer> server;  // last: stops before `latest` goes
};

std::shared_ptr<PrometheusEndpoint> PrometheusEndpoint::start(const PrometheusOptions& options) {
  auto impl = std::make_unique<Impl>();
  Impl* raw = impl.get();
  impl->server = std::make_unique<PrometheusServer>(options, [raw] {
    std::lock_guard<std::mutex> lock(raw->mu);
    return render(raw->latest);
  });
  return std::shared_ptr<PrometheusEndpoint>(new PrometheusEndpoint(std::move(impl)));
}

PrometheusEndpoint::PrometheusEndpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PrometheusEndpoint::~PrometheusEndpoint() { impl_->server.reset(); }

void PrometheusEndpoint::write(const Record& record) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  absorb(impl_->latest, record);
}

uint16_t PrometheusEndpoint::port() const { return impl_->server->port(); }

std::string PrometheusEndpoint::text() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return render(impl_->latest);
}

}  // namespace dtrain::metrics
