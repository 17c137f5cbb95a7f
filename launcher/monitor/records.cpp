#include "launcher/monitor/records.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dtrain/error.h"
#include "launcher/monitor/stall_detector.h"

namespace dtrain::launcher::monitor {

namespace {

using nlohmann::json;

const std::set<std::string>& schemaKeys() {
  static const std::set<std::string> keys{"time", "source", "run_id", "node", "rank", "gpu", "step"};
  return keys;
}

json toJson(const Record& r) {
  json j = json::object();
  j["time"] = r.time;
  j["source"] = r.source;
  j["run_id"] = r.runId;
  j["node"] = r.node;
  if (r.rank) j["rank"] = *r.rank;
  if (r.gpu) j["gpu"] = *r.gpu;
  if (r.step) j["step"] = *r.step;
  for (const auto& [name, value] : r.fields) {
    if (!std::isfinite(value)) {
      j[name] = nullptr;
    } else if (value == std::floor(value) && std::fabs(value) < 9007199254740992.0) {
      j[name] = static_cast<int64_t>(value);  // counts and bytes read as integers: 1048576, not 1048576.0
    } else {
      j[name] = value;
    }
  }
  return j;
}

Record fromJson(const json& j, const std::string& text) {
  DTRAIN_CHECK_ARG(j.is_object(), "metrics record is not a JSON object: {}", text.substr(0, 120));
  Record r;
  auto str = [&](const char* key) {
    auto it = j.find(key);
    DTRAIN_CHECK_ARG(it != j.end() && it->is_string(), "metrics record: \"{}\" is missing or not "
                     "a string: {}", key, text.substr(0, 120));
    return it->get<std::string>();
  };
  auto it = j.find("time");
  DTRAIN_CHECK_ARG(it != j.end() && it->is_number(), "metrics record: \"time\" is missing or not "
                   "a number: {}", text.substr(0, 120));
  r.time = it->get<double>();
  r.source = str("source");
  r.runId = str("run_id");
  r.node = str("node");
  for (const auto& [key, value] : j.items()) {
    if (key == "rank" || key == "gpu" || key == "step") {
      DTRAIN_CHECK_ARG(value.is_number_integer(), "metrics record: \"{}\" is not an integer", key);
      if (key == "rank") r.rank = value.get<int>();
      if (key == "gpu") r.gpu = value.get<int>();
      if (key == "step") r.step = value.get<int64_t>();
      continue;
    }
    if (schemaKeys().count(key)) continue;
    DTRAIN_CHECK_ARG(value.is_number() || value.is_null(), "metrics record: field \"{}\" is not a "
                     "number", key);
    r.fields.emplace_back(key, value.is_null() ? std::numeric_limits<double>::quiet_NaN()
                                               : value.get<double>());
  }
  return r;
}

void put(Record& r, const char* name, double value) { r.fields.emplace_back(name, value); }
void putIfKnown(Record& r, const char* name, int64_t value) {
  if (value >= 0) r.fields.emplace_back(name, static_cast<double>(value));
}

Record base(const SampleContext& ctx) {
  Record r;
  r.time = ctx.time;
  r.runId = ctx.runId;
  r.node = ctx.node;
  return r;
}

}  // namespace

std::optional<double> Record::field(const std::string& name) const {
  for (const auto& [n, v] : fields) {
    if (n == name) return v;
  }
  return std::nullopt;
}

bool validFieldName(const std::string& name) {
  if (name.empty() || schemaKeys().count(name)) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

std::string toJsonLine(const Record& record) { return toJson(record).dump(); }

Record parseJsonLine(const std::string& line) {
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  return fromJson(j, line);
}

std::string toJsonArray(const std::vector<Record>& records) {
  json a = json::array();
  for (const auto& r : records) a.push_back(toJson(r));
  return a.dump();
}

std::vector<Record> parseJsonArray(const std::string& text) {
  json a = json::parse(text, nullptr, /*allow_exceptions=*/false);
  DTRAIN_CHECK_ARG(a.is_array(), "node sample is not a JSON array: {}", text.substr(0, 120));
  std::vector<Record> out;
  for (const auto& j : a) out.push_back(fromJson(j, text));
  return out;
}

std::vector<Record> sampleRecords(const SampleContext& ctx, const NodeSample& node,
                                  const std::vector<RankSample>& ranks,
                                  const std::vector<GpuSample>& gpus,
                                  const std::map<int, progress::RankReport>& progress) {
  std::vector<Record> out;
  Record n = base(ctx);
  if (node.load1) put(n, "load1", *node.load1);
  putIfKnown(n, "mem_total_bytes", node.mem.totalBytes);
  putIfKnown(n, "mem_available_bytes", node.mem.availableBytes);
  if (auto f = node.memUsedFraction()) put(n, "mem_used_ratio", *f);
  if (auto h = node.memHeadroomBytes()) put(n, "mem_headroom_bytes", static_cast<double>(*h));
  if (node.cgroup) {
    putIfKnown(n, "cgroup_usage_bytes", node.cgroup->usageBytes);
    putIfKnown(n, "cgroup_working_set_bytes", node.cgroup->workingSetBytes());
    putIfKnown(n, "cgroup_limit_bytes", node.cgroup->limitBytes);
  }
  put(n, "workers", ctx.workers);
  put(n, "workers_alive", ctx.workersAlive);
  put(n, "attempt", ctx.attempt);
  put(n, "restarts", ctx.attempt);
  out.push_back(std::move(n));

  std::map<int64_t, int> rankOfPid;
  for (const auto& s : ranks) {
    Record r = base(ctx);
    r.rank = s.rank;
    put(r, "pid", s.pid);
    put(r, "local_rank", s.localRank);
    if (s.cpuPercent >= 0) put(r, "cpu_percent", s.cpuPercent);
    put(r, "rss_bytes", static_cast<double>(s.rssBytes));
    put(r, "rss_peak_bytes", static_cast<double>(s.peakRssBytes));
    put(r, "threads", static_cast<double>(s.threads));
    put(r, "processes", static_cast<double>(s.processes));
    putIfKnown(r, "read_bytes", s.readBytes);
    putIfKnown(r, "write_bytes", s.writeBytes);
    auto p = progress.find(s.rank);
    if (p != progress.end()) {
      if (const auto* c = primaryCollectives(p->second)) {
        put(r, "collective_seq", static_cast<double>(c->issued));
      }
    }
    out.push_back(std::move(r));
    for (pid_t pid : s.pids) rankOfPid[pid] = s.rank;
  }

  for (const auto& g : gpus) {
    Record r = base(ctx);
    r.gpu = g.index;
    if (g.utilPercent) put(r, "gpu_util", *g.utilPercent);
    if (g.memUsedBytes) put(r, "gpu_mem_used_bytes", *g.memUsedBytes);
    if (g.memTotalBytes) put(r, "gpu_mem_total_bytes", *g.memTotalBytes);
    if (g.temperatureC) put(r, "gpu_temperature_c", *g.temperatureC);
    if (g.powerW) put(r, "gpu_power_w", *g.powerW);
    put(r, "gpu_processes", static_cast<double>(g.processes.size()));
    out.push_back(std::move(r));
    std::map<int, double> perRank;
    for (const auto& p : g.processes) {
      auto it = rankOfPid.find(p.pid);
      if (it == rankOfPid.end()) continue;
      perRank[it->second] += p.usedBytes > 0 ? static_cast<double>(p.usedBytes) : 0.0;
    }
    for (const auto& [rank, bytes] : perRank) {
      Record pr = base(ctx);
      pr.gpu = g.index;
      pr.rank = rank;
      put(pr, "gpu_process_mem_bytes", bytes);
      out.push_back(std::move(pr));
    }
  }
  return out;
}

std::optional<Record> trainerRecord(const progress::RankReport& report, const std::string& runId,
                                    const std::string& node) {
  if (!report.step && report.figures.empty()) return std::nullopt;
  Record r;
  r.time = report.figuresStep ? report.figuresTime : report.time;
  r.source = "trainer";
  r.runId = runId;
  r.node = node;
  r.rank = report.rank;
  r.step = report.step;
  for (const auto& [name, value] : report.figures) {
    if (validFieldName(name)) r.fields.emplace_back(name, value);
  }
  return r;
}

namespace {

struct Series {
  std::string node;
  std::optional<int> rank;
  std::optional<int> gpu;
  double value = 0;
};

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
  return fmt::format("{}", v);
}

const char* helpOf(const std::string& field) {
  static const std::map<std::string, const char*> help{
      {"load1", "1-minute load average of the node"},
      {"mem_total_bytes", "memory of the machine"},
      {"mem_available_bytes", "memory available on the machine (MemAvailable)"},
      {"mem_used_ratio", "memory in use: the larger of the memory cgroup's working set over its "
                         "limit and the machine's"},
      {"mem_headroom_bytes", "memory left before that ratio reaches 1"},
      {"cgroup_usage_bytes", "memory charged to launch's memory cgroup, page cache included"},
      {"cgroup_working_set_bytes", "the memory cgroup's usage minus inactive file pages"},
      {"cgroup_limit_bytes", "the memory cgroup's limit (absent: none)"},
      {"workers", "workers launch runs on the node"},
      {"workers_alive", "workers running now"},
      {"attempt", "the attempt running (0 first; restarts add one)"},
      {"restarts", "restarts so far"},
      {"pid", "the worker's process id"},
      {"local_rank", "the worker's local rank"},
      {"cpu_percent", "CPU of the worker and its descendants, percent of one core"},
      {"rss_bytes", "resident memory of the worker and its descendants"},
      {"rss_peak_bytes", "peak resident memory of the worker"},
      {"threads", "threads of the worker and its descendants"},
      {"processes", "the worker and its live descendants"},
      {"read_bytes", "bytes read from storage by the worker and its descendants"},
      {"write_bytes", "bytes written to storage by the worker and its descendants"},
      {"collective_seq", "collectives the rank has issued"},
      {"step", "the rank's training step"},
      {"gpu_util", "GPU utilisation, percent"},
      {"gpu_mem_used_bytes", "GPU memory in use"},
      {"gpu_mem_total_bytes", "GPU memory"},
      {"gpu_temperature_c", "GPU temperature, degrees Celsius"},
      {"gpu_power_w", "GPU power draw, watts"},
      {"gpu_processes", "processes using the GPU"},
      {"gpu_process_mem_bytes", "GPU memory used by the worker's processes"},
      {"world_size", "ranks in the job"},
      {"max_restarts", "the restart budget (--max-restarts)"},
      {"stalled", "1 while launch sees a stall (--stall-timeout)"},
      {"heartbeat_age_seconds", "seconds since launch last heard from the node"},
  };
  auto it = help.find(field);
  return it == help.end() ? "a figure the trainer published" : it->second;
}

bool isCounter(const std::string& field) { return field == "read_bytes" || field == "write_bytes"; }

}  // namespace

std::string prometheusText(const std::vector<Record>& records, const JobState& job) {
  // name -> series, in a stable order; a series already present (same name and labels) is not
  // repeated: launch's own records come first and win over a trainer figure of the same name.
  std::map<std::string, std::vector<Series>> families;
  std::set<std::tuple<std::string, std::string, int, int>> seen;
  auto add = [&](const std::string& name, const std::string& node, std::optional<int> rank,
                 std::optional<int> gpu, double value) {
    auto key = std::make_tuple(name, node, rank.value_or(-1), gpu.value_or(-1));
    if (!seen.insert(key).second) return;
    families[name].push_back(Series{node, rank, gpu, value});
  };
  std::vector<const Record*> ordered;
  for (const auto& r : records) {
    if (r.source != "trainer") ordered.push_back(&r);
  }
  for (const auto& r : records) {
    if (r.source == "trainer") ordered.push_back(&r);
  }
  for (const Record* r : ordered) {
    if (r->step) add("step", r->node, r->rank, r->gpu, static_cast<double>(*r->step));
    for (const auto& [name, value] : r->fields) {
      if (validFieldName(name)) add(name, r->node, r->rank, r->gpu, value);
    }
  }
  std::string out;
  auto family = [&](const std::string& name, const char* type) {
    out += fmt::format("# HELP dtrain_{} {}\n# TYPE dtrain_{} {}\n", name, helpOf(name), name, type);
  };
  family("attempt", "gauge");
  out += fmt::format("dtrain_attempt {}\n", job.attempt);
  family("restarts", "gauge");
  out += fmt::format("dtrain_restarts {}\n", job.restarts);
  family("max_restarts", "gauge");
  out += fmt::format("dtrain_max_restarts {}\n", job.maxRestarts);
  family("world_size", "gauge");
  out += fmt::format("dtrain_world_size {}\n", job.worldSize);
  family("stalled", "gauge");
  out += fmt::format("dtrain_stalled {}\n", job.stalled ? 1 : 0);
  if (!job.heartbeatAge.empty()) {
    family("heartbeat_age_seconds", "gauge");
    for (const auto& [node, age] : job.heartbeatAge) {
      out += fmt::format("dtrain_heartbeat_age_seconds{{node=\"{}\"}} {}\n", escapeLabel(node),
                         formatValue(age));
    }
  }
  for (auto& [name, series] : families) {
    if (name == "attempt" || name == "restarts") continue;  // job-wide above
    std::sort(series.begin(), series.end(), [](const Series& a, const Series& b) {
      return std::make_tuple(a.node, a.rank.value_or(-1), a.gpu.value_or(-1)) <
             std::make_tuple(b.node, b.rank.value_or(-1), b.gpu.value_or(-1));
    });
    family(name, isCounter(name) ? "counter" : "gauge");
    for (const auto& s : series) {
      std::string labels = fmt::format("node=\"{}\"", escapeLabel(s.node));
      if (s.rank) labels += fmt::format(",rank=\"{}\"", *s.rank);
      if (s.gpu) labels += fmt::format(",gpu=\"{}\"", *s.gpu);
      out += fmt::format("dtrain_{}{{{}}} {}\n", name, labels, formatValue(s.value));
    }
  }
  return out;
}

}  // namespace dtrain::launcher::monitor
