// The Prometheus side of dtrain::metrics: the text exposition of the latest records, the server
// that answers scrapes (http_server.h), and the endpoint sink built from both.
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "dtrain/base/metrics.h"
#include "metrics/http_server.h"

namespace dtrain::metrics {

// One time series: a metric name and its labels. Not in the anonymous namespace:
// PrometheusEndpoint::Impl holds them, and a unity build compiles this file as if it were a header.
struct PrometheusSeries {
  std::string name;  // without the dtrain_ prefix
  std::string node;
  std::optional<int> rank;
  std::optional<int> gpu;
  std::string interface;
  std::string mount;
  bool operator<(const PrometheusSeries& o) const {
    return std::tie(name, node, rank, gpu, interface, mount) <
           std::tie(o.name, o.node, o.rank, o.gpu, o.interface, o.mount);
  }
};

using Latest = std::map<PrometheusSeries, double>;

namespace {

// The record's values replace earlier ones of the same series.
void absorb(Latest& latest, const Record& r) {
  auto put = [&](const std::string& name, double value) {
    latest[PrometheusSeries{name, r.node, r.rank, r.gpu, r.interface, r.mount}] = value;
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
    if (!key.interface.empty()) add(fmt::format("interface=\"{}\"", escapeLabel(key.interface)));
    if (!key.mount.empty()) add(fmt::format("mount=\"{}\"", escapeLabel(key.mount)));
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
  HttpServer http;
};

PrometheusServer::PrometheusServer(const PrometheusOptions& options,
                                   std::function<std::string()> render)
    : host_(options.host) {
  std::vector<HttpRoute> routes;
  routes.push_back({"/metrics", "text/plain; version=0.0.4; charset=utf-8", std::move(render)});
  routes.push_back({"/", "text/plain; charset=utf-8",
                    [] { return std::string("dtrain: metrics at /metrics\n"); }});
  impl_.reset(new Impl{HttpServer(options.host, options.port, options.option, std::move(routes))});
  port_ = impl_->http.port();
}

PrometheusServer::~PrometheusServer() = default;

// --- PrometheusEndpoint -------------------------------------------------------------------------

struct PrometheusEndpoint::Impl {
  mutable std::mutex mu;
  Latest latest;                             // guarded by mu
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
