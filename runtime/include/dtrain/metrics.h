#pragma once
// Metrics: a training program's figures (loss, accuracy, samples/s, ...) per step, to a JSONL file
// and to a Prometheus endpoint, in the one record schema that launch's monitoring writes too.
//
//   dtrain::metrics::Metrics metrics;                       // run id, node, rank from the
//   environment metrics.addSink(dtrain::metrics::JsonlSink::open("metrics.jsonl"));
//   metrics.addSink(dtrain::metrics::PrometheusEndpoint::start({/*host*/ "0.0.0.0", /*port*/
//   9400})); metrics.record(step, {{"loss", 0.25}, {"samples_per_s", 812.0}});
//
// Record schema (docs/design.md#metrics): one JSON object a line with `time` (Unix
// seconds), `source` ("trainer" | "launch"), `run_id`, `node`, `rank` (absent for node-wide
// figures), `gpu` (GPU figures only), `step` (trainer records), then the named numeric fields.
// A field that is not finite (a diverged loss) is written as null and read back as NaN; an
// integral value as a JSON integer (2 rather than 2.0).
// Prometheus: each field becomes the gauge `dtrain_<field>` (and the step `dtrain_step`), labelled
// node, rank and gpu where present, holding the latest value of each series.
//
// A sink is a small interface, so that other destinations (the job's store, for launch to serve
// one endpoint for the whole job) plug in beside these two. Torch-free: launch uses it as well.

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::metrics {

using Field = std::pair<std::string, double>;

struct Record {
  double time = 0;  // Unix seconds
  std::string source = "trainer";
  std::string runId;
  std::string node;
  std::optional<int> rank;
  std::optional<int> gpu;
  std::optional<int64_t> step;
  std::vector<Field> fields;  // in the order given; names are unique within a record

  // The value of field `name`, if present.
  std::optional<double> field(const std::string& name) const;
};

// Whether `name` may name a field: a Prometheus name ([a-zA-Z_][a-zA-Z0-9_]*) that is not one of
// the schema's own keys (time, source, run_id, node, rank, gpu, step).
bool validFieldName(const std::string& name);

// One line of JSON, without the newline. Throws InvalidArgument for an invalid or repeated field.
std::string toJsonLine(const Record& record);
// Parses one line; throws InvalidArgument naming what is wrong (not an object, a key of the wrong
// type, a non-numeric field).
Record parseJsonLine(const std::string& line);

// The Prometheus text exposition (format 0.0.4) of the latest record of each series: one
// `# TYPE dtrain_<field> gauge` block per field name, one sample per (node, rank, gpu).
std::string prometheusText(const std::vector<Record>& latest);

// Where records go. write() is called from the thread that records; an implementation that is
// read from elsewhere (an HTTP server, a publisher thread) guards itself.
class Sink {
 public:
  virtual ~Sink() = default;
  virtual void write(const Record& record) = 0;
  virtual void flush() {}
};

// Appends one line per record to a file (created if missing) and flushes it, so a reader sees
// whole lines while training runs and a crash loses at most the line being written.
class JsonlSink : public Sink {
 public:
  // Throws InvalidArgument naming the path and the reason when it cannot be opened.
  static std::shared_ptr<JsonlSink> open(const std::string& path);
  ~JsonlSink() override;
  void write(const Record& record) override;
  const std::string& path() const { return path_; }

 private:
  JsonlSink(std::string path, std::FILE* file);
  std::string path_;
  std::FILE* file_;
};

struct PrometheusOptions {
  std::string host = "0.0.0.0";  // every interface, as exporters do; "127.0.0.1" to keep it local
  uint16_t port = 0;             // 0: a free port (see port())
};

// Serves GET /metrics in Prometheus text format on a thread of its own (cpp-httplib), from the
// latest record of each series written to it.
class PrometheusEndpoint : public Sink {
 public:
  // Binds before returning: a busy port is an InvalidArgument naming host and port.
  static std::shared_ptr<PrometheusEndpoint> start(const PrometheusOptions& options);
  ~PrometheusEndpoint() override;  // stops serving
  void write(const Record& record) override;
  uint16_t port() const;
  // What a scrape answers now.
  std::string text() const;

 private:
  struct Impl;
  explicit PrometheusEndpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct MetricsOptions {
  std::string source = "trainer";
  // Empty: TORCHELASTIC_RUN_ID (set by launch and torchrun), else "local".
  std::string runId;
  // Empty: this host's name.
  std::string node;
  // -1: RANK from the environment when set, else absent.
  int rank = -1;
};

// Stamps records with time, source, run id, node and rank and hands them to every sink. Without
// sinks, record() does nothing (ranks that do not report call it all the same).
class Metrics {
 public:
  explicit Metrics(MetricsOptions options = {});
  void addSink(std::shared_ptr<Sink> sink);
  bool enabled() const { return !sinks_.empty(); }

  // The figures of `step`, now. Throws InvalidArgument for an invalid or repeated field name.
  void record(int64_t step, std::vector<Field> fields);
  // A record as given; its empty time / run id / node / rank are filled in.
  void record(Record record);
  void flush();

  const std::string& runId() const { return runId_; }
  const std::string& node() const { return node_; }

 private:
  std::string source_;
  std::string runId_;
  std::string node_;
  std::optional<int> rank_;
  std::vector<std::shared_ptr<Sink>> sinks_;
};

// Unix time in seconds, with sub-second precision.
double unixSeconds();

}  // namespace dtrain::metrics
