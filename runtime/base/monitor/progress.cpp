// The wire side of dtrain/base/progress.h: store keys, and a rank's report as JSON.
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "dtrain/base/error.h"
#include "dtrain/base/progress.h"
#include "metrics/record_json.h"

namespace dtrain::progress {

namespace {

// Ordered: the records inside keep their schema's key order.
using json = nlohmann::ordered_json;

double numberOrNan(const json& v) {
  return v.is_number() ? v.get<double>() : std::numeric_limits<double>::quiet_NaN();
}

// The parts of a report that count as progress (see advanced()).
struct Signature {
  std::optional<int64_t> step;
  std::optional<int64_t> figuresStep;
  double figuresTime = 0;
  uint64_t lastRecord = 0;
  std::vector<std::pair<std::string, uint64_t>> issued;
  std::vector<std::pair<uint64_t, std::string>> states;
  bool operator==(const Signature& o) const {
    return step == o.step && figuresStep == o.figuresStep && figuresTime == o.figuresTime &&
           lastRecord == o.lastRecord && issued == o.issued && states == o.states;
  }
};

Signature signatureOf(const RankReport& r) {
  Signature s;
  s.step = r.step;
  s.figuresStep = r.figuresStep;
  s.figuresTime = r.figuresTime;
  s.lastRecord = r.lastRecord;
  for (const auto& c : r.collectives) {
    s.issued.emplace_back(c.name, c.issued);
    for (const auto& e : c.tail) s.states.emplace_back(e.seq, e.state);
  }
  return s;
}

}  // namespace

std::string rankKey(int rank) { return "monitor/rank/" + std::to_string(rank); }
std::string nodeKey(int nodeRank) { return "monitor/node/" + std::to_string(nodeRank); }
std::string stacksKey(int nodeRank) { return "monitor/stacks/" + std::to_string(nodeRank); }

std::string encodeReport(const RankReport& r) {
  json j;
  j["rank"] = r.rank;
  if (r.nodeRank >= 0) j["node_rank"] = r.nodeRank;
  j["pid"] = r.pid;
  j["time"] = r.time;
  if (r.step) j["step"] = *r.step;
  json collectives = json::array();
  for (const auto& c : r.collectives) {
    json tail = json::array();
    for (const auto& e : c.tail) {
      tail.push_back({{"seq", e.seq}, {"what", e.what}, {"state", e.state}, {"ms", e.ms}});
    }
    collectives.push_back({{"name", c.name}, {"issued", c.issued}, {"tail", std::move(tail)}});
  }
  j["collectives"] = std::move(collectives);
  if (!r.figures.empty() || r.figuresStep) {
    json fields = json::object();
    for (const auto& [name, value] : r.figures) {
      if (std::isfinite(value)) {
        fields[name] = value;
      } else {
        fields[name] = nullptr;
      }
    }
    json figures = {{"time", r.figuresTime}, {"fields", std::move(fields)}};
    if (r.figuresStep) figures["step"] = *r.figuresStep;
    j["figures"] = std::move(figures);
  }
  if (!r.records.empty()) {
    json items = json::array();
    for (const auto& record : r.records) items.push_back(metrics::recordToJson(record));
    j["records"] = {{"last", r.lastRecord}, {"items", std::move(items)}};
  }
  return j.dump();
}

RankReport decodeReport(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  DTRAIN_CHECK_ARG(j.is_object(), "progress report is not a JSON object: {}", text.substr(0, 120));
  auto need = [&](const json& obj, const char* key, bool (json::*is)() const noexcept,
                  const char* type) -> const json& {
    auto it = obj.find(key);
    DTRAIN_CHECK_ARG(it != obj.end() && ((*it).*is)(),
                     "progress report: \"{}\" is missing or "
                     "not {}: {}",
                     key, type, text.substr(0, 120));
    return *it;
  };
  RankReport r;
  r.rank = need(j, "rank", &json::is_number_integer, "an integer").get<int>();
  if (j.contains("node_rank")) {
    r.nodeRank = need(j, "node_rank", &json::is_number_integer, "an integer").get<int>();
  }
  r.pid = need(j, "pid", &json::is_number_integer, "an integer").get<int64_t>();
  r.time = need(j, "time", &json::is_number, "a number").get<double>();
  if (j.contains("step"))
    r.step = need(j, "step", &json::is_number_integer, "an integer").get<int64_t>();
  for (const auto& c : need(j, "collectives", &json::is_array, "an array")) {
    DTRAIN_CHECK_ARG(c.is_object(), "progress report: a collective is not an object");
    CollectiveState state;
    state.name = need(c, "name", &json::is_string, "a string").get<std::string>();
    state.issued = need(c, "issued", &json::is_number_unsigned, "a count").get<uint64_t>();
    for (const auto& e : need(c, "tail", &json::is_array, "an array")) {
      DTRAIN_CHECK_ARG(e.is_object(), "progress report: a collective entry is not an object");
      CollectiveEntry entry;
      entry.seq = need(e, "seq", &json::is_number_unsigned, "a count").get<uint64_t>();
      entry.what = need(e, "what", &json::is_string, "a string").get<std::string>();
      entry.state = need(e, "state", &json::is_string, "a string").get<std::string>();
      entry.ms = need(e, "ms", &json::is_number, "a number").get<double>();
      state.tail.push_back(std::move(entry));
    }
    r.collectives.push_back(std::move(state));
  }
  if (j.contains("figures")) {
    const json& f = need(j, "figures", &json::is_object, "an object");
    r.figuresTime = need(f, "time", &json::is_number, "a number").get<double>();
    if (f.contains("step")) {
      r.figuresStep = need(f, "step", &json::is_number_integer, "an integer").get<int64_t>();
    }
    for (const auto& [name, value] : need(f, "fields", &json::is_object, "an object").items()) {
      DTRAIN_CHECK_ARG(value.is_number() || value.is_null(),
                       "progress report: figure \"{}\" "
                       "is not a number",
                       name);
      r.figures.emplace_back(name, numberOrNan(value));
    }
  }
  if (j.contains("records")) {
    const json& rec = need(j, "records", &json::is_object, "an object");
    r.lastRecord = need(rec, "last", &json::is_number_unsigned, "a count").get<uint64_t>();
    const json& items = need(rec, "items", &json::is_array, "an array");
    DTRAIN_CHECK_ARG(items.size() <= r.lastRecord,
                     "progress report: {} records, but the last is "
                     "number {}",
                     items.size(), r.lastRecord);
    for (const auto& item : items) r.records.push_back(metrics::recordFromJson(item, text));
  }
  return r;
}

bool advanced(const RankReport& before, const RankReport& after) {
  return !(signatureOf(before) == signatureOf(after));
}

}  // namespace dtrain::progress
