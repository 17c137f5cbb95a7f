#pragma once
// Samples as metrics records -- the one record schema of docs/design.md ("Metrics records"), the
// same that a trainer's dtrain::Metrics writes, so scripts/plot_metrics.py reads launch's
// --metrics-file and a trainer's alike -- and the Prometheus text launch serves on
// --metrics-port.
//
// Records launch writes (source "launch"), one per interval each:
//   node  {node}                      load1, mem_total_bytes, mem_available_bytes, mem_used_ratio,
//                                     mem_headroom_bytes, cgroup_usage_bytes,
//                                     cgroup_working_set_bytes, cgroup_limit_bytes, workers,
//                                     workers_alive, attempt, restarts
//   rank  {node, rank}                pid, local_rank, cpu_percent, rss_bytes, rss_peak_bytes,
//                                     threads, processes, read_bytes, write_bytes, collective_seq
//   gpu   {node, gpu}                 gpu_util, gpu_mem_used_bytes, gpu_mem_total_bytes,
//                                     gpu_temperature_c, gpu_power_w, gpu_processes
//   gpu   {node, gpu, rank}           gpu_process_mem_bytes (a worker's memory on that GPU)
// and, for the endpoint only, each rank's latest trainer figures (source "trainer", with step).

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/progress.h"
#include "launcher/monitor/gpu_sampler.h"
#include "launcher/monitor/process_sampler.h"

namespace dtrain::launcher::monitor {

using Field = std::pair<std::string, double>;

struct Record {
  double time = 0;  // Unix seconds
  std::string source = "launch";
  std::string runId;
  std::string node;
  std::optional<int> rank;
  std::optional<int> gpu;
  std::optional<int64_t> step;
  std::vector<Field> fields;

  std::optional<double> field(const std::string& name) const;
};

// One JSON object, no newline; non-finite values as null. And back (throws InvalidArgument).
std::string toJsonLine(const Record& record);
Record parseJsonLine(const std::string& line);
// A node's records as one JSON array (the value of monitor/node/<N>), and back.
std::string toJsonArray(const std::vector<Record>& records);
std::vector<Record> parseJsonArray(const std::string& text);

struct SampleContext {
  double time = 0;  // Unix seconds
  std::string runId;
  std::string node;
  int attempt = 0;
  int workers = 0;       // expected on this node
  int workersAlive = 0;
};

// The launch records of one node's sample. `progress` (rank -> its latest report) adds
// collective_seq; `ranksByPid` is filled from `ranks` to attribute GPU processes.
std::vector<Record> sampleRecords(const SampleContext& ctx, const NodeSample& node,
                                  const std::vector<RankSample>& ranks,
                                  const std::vector<GpuSample>& gpus,
                                  const std::map<int, progress::RankReport>& progress);

// A rank's trainer record (source "trainer") from its report: its step and figures. nullopt when
// it published neither.
std::optional<Record> trainerRecord(const progress::RankReport& report, const std::string& runId,
                                    const std::string& node);

// Job-wide state for the endpoint.
struct JobState {
  int attempt = 0;
  int restarts = 0;
  int maxRestarts = 0;
  int worldSize = 0;
  bool stalled = false;
  std::map<std::string, double> heartbeatAge;  // node -> seconds since the master heard from it
};

// Prometheus text exposition (format 0.0.4): one # HELP / # TYPE block per metric, dtrain_<field>
// with labels node, rank, gpu where the record has them; read_bytes and write_bytes are counters,
// everything else a gauge. A trainer figure that repeats a launch series is left out.
std::string prometheusText(const std::vector<Record>& records, const JobState& job);

// Whether `name` may name a field: [a-zA-Z_][a-zA-Z0-9_]*, not a schema key.
bool validFieldName(const std::string& name);

}  // namespace dtrain::launcher::monitor
