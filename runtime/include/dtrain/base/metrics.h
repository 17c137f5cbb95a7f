#pragma once
// Metrics: the one record schema of docs/design.md ("Metrics") -- a training program's figures
// (loss, accuracy, samples/s, ...) and launch's samples (memory, CPU, GPUs, ...) alike -- with its
// JSONL form, its Prometheus text form, and the sinks a program hands its records to.
//
//   dtrain::metrics::Metrics metrics;                 // run id, node and rank from the environment
//   metrics.addSink(dtrain::metrics::JsonlSink::open("metrics.jsonl"));
//   metrics.addSink(dtrain::metrics::PrometheusEndpoint::start({"0.0.0.0", 9400}));
//   metrics.record(step, {{"loss", 0.25}, {"samples_per_s", 812.0}});
//
// Under `launch` every record also goes to launch through the job's store (LaunchSink, added by
// Metrics itself), so launch's --metrics-port and --metrics-file show it beside launch's own
// samples: a program needs no port of its own.
//
// Record schema: one JSON object a line with `time` (Unix seconds), `source` ("trainer" |
// "launch"), `run_id`, `node`, `rank` (absent for node-wide figures), `gpu` (GPU figures only),
// `interface` / `mount` (launch's network and filesystem figures only), `step` (trainer
// records), then the named numeric fields. A field that is not finite (a diverged
// loss) is written as null and read back as NaN; an integral value as a JSON integer (2, not 2.0).
// Prometheus: each field becomes `dtrain_<field>` (and the step `dtrain_step`), labelled node,
// rank, gpu, interface and mount where present, holding the latest value of each series.
//
// Torch-free (dtrain_base): launch writes and serves its records with the same code.

#include <cstdint>
#include <cstdio>
#include <functional>
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
  std::string node;  // empty: a job-wide figure (launch's endpoint: no node label)
  std::optional<int> rank;
  std::optional<int> gpu;
  // launch's figures of one network interface or one filesystem (its mount point); empty: none.
  std::string interface;
  std::string mount;
  std::optional<int64_t> step;
  std::vector<Field> fields;  // in the order given; names are unique within a record

  // The value of field `name`, if present.
  std::optional<double> field(const std::string& name) const;
};

// Whether `name` may name a field: a Prometheus name ([a-zA-Z_][a-zA-Z0-9_]*) that is not one of
// the schema's own keys (time, source, run_id, node, rank, gpu, interface, mount, step).
bool validFieldName(const std::string& name);

// One line of JSON, without the newline, schema keys first. Throws InvalidArgument for an invalid
// or repeated field.
std::string toJsonLine(const Record& record);
// Parses one line; throws InvalidArgument naming what is wrong (not an object, a key of the wrong
// type, a non-numeric field).
Record parseJsonLine(const std::string& line);
// Several records as one JSON array (a node's sample in the job's store), and back.
std::string toJsonArray(const std::vector<Record>& records);
std::vector<Record> parseJsonArray(const std::string& text);

// The Prometheus text exposition (format 0.0.4) of `records`: one `# HELP` / `# TYPE` block per
// metric `dtrain_<field>` (and `dtrain_step`), one sample per series (name and labels) with the
// value of the last record in `records` that has it. Labels node (left out when empty), rank,
// gpu, interface and mount where present. A field is a gauge unless fieldIsCounter(); its help
// is fieldHelp().
std::string prometheusText(const std::vector<Record>& records);

// The fields dtrain itself writes (launch's samples, the sample trainers' figures), with a line
// of help each; any other name reads "a figure the program recorded". read_bytes, write_bytes
// and gpu_xid_events only grow: counters.
const char* fieldHelp(const std::string& name);
bool fieldIsCounter(const std::string& name);

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
  // How the program's user sets the port, named in the error when it is busy.
  std::string option = "--metrics-port";
};

// Serves GET /metrics with what `render` returns at each scrape (Prometheus text, format 0.0.4),
// from one event-loop thread of its own that idle or malformed connections cannot hold up
// (docs/design.md, Metrics). Binds before the constructor returns: a busy port or an address it
// cannot bind is an InvalidArgument naming host, port and the option. Only SO_REUSEADDR, never
// SO_REUSEPORT, which would let a second process bind the same port and take half the scrapes.
// `render` runs on the server's thread.
class PrometheusServer {
 public:
  PrometheusServer(const PrometheusOptions& options, std::function<std::string()> render);
  ~PrometheusServer();  // stops serving
  PrometheusServer(const PrometheusServer&) = delete;
  PrometheusServer& operator=(const PrometheusServer&) = delete;

  uint16_t port() const { return port_; }
  const std::string& host() const { return host_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string host_;
  uint16_t port_ = 0;
};

// A sink served as a Prometheus endpoint: the latest record of each series written to it.
class PrometheusEndpoint : public Sink {
 public:
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

// Hands records to the job's `launch` through its store (dtrain/base/progress.h), for launch's
// --metrics-port endpoint and --metrics-file: launch labels them with the rank's node and rank.
// write() only copies the record under a short lock; the progress thread publishes at most once
// a second. Records are carried while they are recent (Note [Trainer records] in
// dtrain/base/progress.h); the endpoint shows the latest value of every field.
class LaunchSink : public Sink {
 public:
  // Null when this process was not started by launch (no DTRAIN_STORE_ADDR or RANK).
  static std::shared_ptr<LaunchSink> open();
  void write(const Record& record) override;
  // Publishes what was recorded now rather than at the next tick (at most 2 s).
  void flush() override;

 private:
  LaunchSink() = default;
};

struct MetricsOptions {
  std::string source = "trainer";
  // Empty: TORCHELASTIC_RUN_ID (set by launch and torchrun), else "local".
  std::string runId;
  // Empty: this host's name.
  std::string node;
  // -1: RANK from the environment when set, else absent.
  int rank = -1;
  // Under launch, also hand every record to launch (a LaunchSink), so one scrape of launch's
  // endpoint shows the whole job. Ignored outside launch.
  bool toLaunch = true;
};

// Stamps records with time, source, run id, node and rank and hands them to every sink. Without
// sinks, record() does nothing (ranks that do not report call it all the same).
class Metrics {
 public:
  explicit Metrics(MetricsOptions options = {});
  void addSink(std::shared_ptr<Sink> sink);
  bool enabled() const { return !sinks_.empty(); }
  // Whether records reach launch (MetricsOptions::toLaunch under launch).
  bool toLaunch() const { return toLaunch_; }

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
  bool toLaunch_ = false;
  std::vector<std::shared_ptr<Sink>> sinks_;
};

// Unix time in seconds, with sub-second precision.
double unixSeconds();

}  // namespace dtrain::metrics
