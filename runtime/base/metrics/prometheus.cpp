// The Prometheus side of dtrain::metrics: the text exposition of the latest records, and the
// endpoint that serves it (cpp-httplib).
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include <httplib.h>
#include <sys/socket.h>

#include "dtrain/error.h"
#include "dtrain/metrics.h"

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
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string formatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);  // shortest form that reads back exactly
}

std::string render(const Latest& latest) {
  std::string out;
  const std::string* current = nullptr;
  for (const auto& [key, value] : latest) {
    if (current == nullptr || *current != key.name) {
      out += fmt::format("# TYPE dtrain_{} gauge\n", key.name);
      current = &key.name;
    }
    std::string labels = fmt::format("node=\"{}\"", escapeLabel(key.node));
    if (key.rank) labels += fmt::format(",rank=\"{}\"", *key.rank);
    if (key.gpu) labels += fmt::format(",gpu=\"{}\"", *key.gpu);
    out += fmt::format("dtrain_{}{{{}}} {}\n", key.name, labels, formatValue(value));
  }
  return out;
}

}  // namespace

std::string prometheusText(const std::vector<Record>& latest) {
  Latest series;
  for (const auto& r : latest) absorb(series, r);
  return render(series);
}

struct PrometheusEndpoint::Impl {
  httplib::Server server;
  std::thread thread;
  int port = 0;
  std::atomic<bool> listenReturned{false};
  mutable std::mutex mu;
  Latest latest;  // guarded by mu
};

std::shared_ptr<PrometheusEndpoint> PrometheusEndpoint::start(const PrometheusOptions& options) {
  auto impl = std::make_unique<Impl>();
  Impl* raw = impl.get();
  // Two handler threads and no keep-alive: scrapes are rare, and a scraper holding its
  // connection open must not keep another from being answered.
  impl->server.new_task_queue = [] { return new httplib::ThreadPool(2); };
  impl->server.set_keep_alive_max_count(1);
  // httplib's default is SO_REUSEPORT, which lets a second process bind the same port and take
  // half the scrapes; SO_REUSEADDR alone makes a busy port an error and still allows a quick
  // restart.
  impl->server.set_socket_options([](int sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  impl->server.Get("/metrics", [raw](const httplib::Request&, httplib::Response& res) {
    std::string body;
    {
      std::lock_guard<std::mutex> lock(raw->mu);
      body = render(raw->latest);
    }
    res.set_content(body, "text/plain; version=0.0.4; charset=utf-8");
  });
  if (options.port == 0) {
    impl->port = impl->server.bind_to_any_port(options.host);
  } else {
    impl->port = impl->server.bind_to_port(options.host, options.port) ? options.port : -1;
  }
  DTRAIN_CHECK_ARG(impl->port > 0,
                   "cannot serve metrics on {}:{}: {}. HINT: pick another --metrics-port, or 0 "
                   "for a free one",
                   options.host, options.port, errno ? std::strerror(errno) : "bind failed");
  impl->thread = std::thread([raw] {
    raw->server.listen_after_bind();
    raw->listenReturned = true;
  });
  // stop() is a no-op until the server runs: wait for it, so the destructor cannot miss it.
  while (!impl->server.is_running() && !impl->listenReturned) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  if (!impl->server.is_running()) {
    impl->thread.join();
    DTRAIN_THROW(Error, "the metrics server on {}:{} stopped at once", options.host, impl->port);
  }
  return std::shared_ptr<PrometheusEndpoint>(new PrometheusEndpoint(std::move(impl)));
}

PrometheusEndpoint::PrometheusEndpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PrometheusEndpoint::~PrometheusEndpoint() {
  impl_->server.stop();
  impl_->thread.join();
}

void PrometheusEndpoint::write(const Record& record) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  absorb(impl_->latest, record);
}

uint16_t PrometheusEndpoint::port() const { return static_cast<uint16_t>(impl_->port); }

std::string PrometheusEndpoint::text() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return render(impl_->latest);
}

}  // namespace dtrain::metrics
