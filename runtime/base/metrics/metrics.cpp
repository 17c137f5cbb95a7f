// Metrics records: the JSON forms, the stamping Metrics front end and the file sink. The
// Prometheus side is in prometheus.cpp, the sink towards launch in launch_sink.cpp.
#include "dtrain/base/metrics.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "dtrain/base/error.h"
#include "env_contract.h"
#include "metrics/record_json.h"
#include "net/socket.h"
#include "parse_int.h"

namespace dtrain::metrics {
namespace {

// The schema's own keys, which no field may shadow. Never destroyed: the progress publisher's
// thread encodes records while the process's exit handlers run (Note [Progress publisher]).
const std::set<std::string>& reservedKeys() {
  static const auto* const kKeys = new std::set<std::string>{
      "time", "source", "run_id", "node", "rank", "gpu", "interface", "mount", "step"};
  return *kKeys;
}

void checkFields(const std::vector<Field>& fields) {
  std::set<std::string> seen;
  for (const auto& [name, value] : fields) {
    DTRAIN_CHECK_ARG(validFieldName(name),
                     "metrics field name '{}' is not allowed: use letters, digits and '_' (not "
                     "first), and none of time, source, run_id, node, rank, gpu, interface, mount, "
                     "step",
                     name);
    DTRAIN_CHECK_ARG(seen.insert(name).second, "metrics field '{}' given twice in one record",
                     name);
  }
}

}  // namespace

std::optional<double> Record::field(const std::string& name) const {
  for (const auto& [key, value] : fields) {
    if (key == name) return value;
  }
  return std::nullopt;
}

bool validFieldName(const std::string& name) {
  if (name.empty() || reservedKeys().count(name)) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    const bool digit = c >= '0' && c <= '9';
    if (!(letter || (digit && i > 0))) return false;
  }
  return true;
}

double unixSeconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

nlohmann::ordered_json recordToJson(const Record& record) {
  checkFields(record.fields);
  nlohmann::ordered_json j;
  j["time"] = record.time;
  j["source"] = record.source;
  j["run_id"] = record.runId;
  j["node"] = record.node;
  if (record.rank) j["rank"] = *record.rank;
  if (record.gpu) j["gpu"] = *record.gpu;
  if (!record.interface.empty()) j["interface"] = record.interface;
  if (!record.mount.empty()) j["mount"] = record.mount;
  if (record.step) j["step"] = *record.step;
  for (const auto& [name, value] : record.fields) {
    if (!std::isfinite(value)) {
      j[name] = nullptr;
    } else if (value == std::floor(value) && std::fabs(value) < 9007199254740992.0) {
      j[name] = static_cast<int64_t>(
          value);  // counts and bytes as integers: 1048576, not 1048576.0
    } else {
      j[name] = value;
    }
  }
  return j;
}

Record recordFromJson(const nlohmann::ordered_json& j, const std::string& context) {
  using json = nlohmann::ordered_json;
  DTRAIN_CHECK_ARG(j.is_object(), "a metrics record must be one JSON object, got: {:.80}", context);
  auto need = [&](const char* key, bool (json::*is)() const noexcept, const char* what) {
    DTRAIN_CHECK_ARG(j.contains(key) && (j[key].*is)(), "metrics record: '{}' must be {} ({:.80})",
                     key, what, context);
  };
  need("time", &json::is_number, "a number");
  need("source", &json::is_string, "a string");
  Record r;
  r.time = j["time"].get<double>();
  r.source = j["source"].get<std::string>();
  if (j.contains("run_id")) {
    need("run_id", &json::is_string, "a string");
    r.runId = j["run_id"].get<std::string>();
  }
  if (j.contains("node")) {
    need("node", &json::is_string, "a string");
    r.node = j["node"].get<std::string>();
  }
  if (j.contains("rank")) {
    need("rank", &json::is_number_integer, "an integer");
    r.rank = j["rank"].get<int>();
  }
  if (j.contains("gpu")) {
    need("gpu", &json::is_number_integer, "an integer");
    r.gpu = j["gpu"].get<int>();
  }
  for (auto [key, label] : {std::pair{"interface", &r.interface}, std::pair{"mount", &r.mount}}) {
    if (!j.contains(key)) continue;
    need(key, &json::is_string, "a string");
    *label = j[key].get<std::string>();
  }
  if (j.contains("step")) {
    need("step", &json::is_number_integer, "an integer");
    r.step = j["step"].get<int64_t>();
  }
  for (const auto& [key, value] : j.items()) {
    if (reservedKeys().count(key)) continue;
    DTRAIN_CHECK_ARG(value.is_number() || value.is_null(),
                     "metrics record: field '{}' must be a number or null ({:.80})", key, context);
    r.fields.emplace_back(key, value.is_null() ? std::numeric_limits<double>::quiet_NaN()
                                               : value.get<double>());
  }
  checkFields(r.fields);
  return r;
}

std::string toJsonLine(const Record& record) { return recordToJson(record).dump(); }

Record parseJsonLine(const std::string& line) {
  // ordered_json: fields come back in the order they were written.
  auto j = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
  return recordFromJson(j, line);
}

std::string toJsonArray(const std::vector<Record>& records) {
  nlohmann::ordered_json a = nlohmann::ordered_json::array();
  for (const auto& r : records) a.push_back(recordToJson(r));
  return a.dump();
}

std::vector<Record> parseJsonArray(const std::string& text) {
  auto a = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  DTRAIN_CHECK_ARG(a.is_array(), "metrics records: not a JSON array: {:.80}", text);
  std::vector<Record> out;
  out.reserve(a.size());
  for (const auto& j : a) out.push_back(recordFromJson(j, text));
  return out;
}

std::shared_ptr<JsonlSink> JsonlSink::open(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "a");
  DTRAIN_CHECK_ARG(file != nullptr,
                   "cannot open metrics file {}: {}. HINT: does its directory "
                   "exist and is it writable?",
                   path, std::strerror(errno));
  return std::shared_ptr<JsonlSink>(new JsonlSink(path, file));
}

JsonlSink::JsonlSink(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}

JsonlSink::~JsonlSink() { std::fclose(file_); }

void JsonlSink::write(const Record& record) {
  std::string line = toJsonLine(record);
  line += '\n';
  const bool ok = std::fwrite(line.data(), 1, line.size(), file_) == line.size() &&
                  std::fflush(file_) == 0;
  DTRAIN_CHECK(ok, "cannot append to metrics file {}: {}", path_, std::strerror(errno));
}

Metrics::Metrics(MetricsOptions options)
    : source_(std::move(options.source)),
      runId_(std::move(options.runId)),
      node_(std::move(options.node)) {
  if (runId_.empty()) {
    const char* id = std::getenv(env::kRunId);
    runId_ = id && *id ? id : "local";
  }
  if (node_.empty()) node_ = net::hostName();
  if (options.rank >= 0) {
    rank_ = options.rank;
  } else if (const char* rank = std::getenv(env::kRank); rank && *rank) {
    int64_t value = 0;
    DTRAIN_CHECK_ARG(parseInt64(rank, &value) && value >= 0 &&
                         value <= std::numeric_limits<int>::max(),
                     "{}='{}' is not a rank. HINT: launch sets it; unset it to record no rank",
                     env::kRank, rank);
    rank_ = static_cast<int>(value);
  }
  if (options.toLaunch) {
    if (auto sink = LaunchSink::open()) {
      sinks_.push_back(std::move(sink));
      toLaunch_ = true;
    }
  }
}

void Metrics::addSink(std::shared_ptr<Sink> sink) {
  DTRAIN_CHECK_ARG(sink != nullptr, "Metrics::addSink: null sink");
  sinks_.push_back(std::move(sink));
}

void Metrics::record(int64_t step, std::vector<Field> fields) {
  Record r;
  r.source = source_;
  r.step = step;
  r.fields = std::move(fields);
  record(std::move(r));
}

void Metrics::record(Record r) {
  checkFields(r.fields);
  if (sinks_.empty()) return;
  if (r.time == 0) r.time = unixSeconds();
  if (r.source.empty()) r.source = source_;
  if (r.runId.empty()) r.runId = runId_;
  if (r.node.empty()) r.node = node_;
  if (!r.rank) r.rank = rank_;
  for (auto& sink : sinks_) sink->write(r);
}

void Metrics::flush() {
  for (auto& sink : sinks_) sink->flush();
}

}  // namespace dtrain::metrics
