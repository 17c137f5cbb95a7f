#pragma once
// A metrics record as a JSON value, for the JSONL form (metrics.cpp) and for documents that carry
// records inside them (a rank's progress report, runtime/base/monitor/progress.cpp). Internal to
// dtrain_base.

#include <string>

#include <nlohmann/json.hpp>

#include "dtrain/base/metrics.h"

namespace dtrain::metrics {

// ordered_json keeps the schema's keys first, in the order docs/design.md lists them, and the
// fields in the order recorded. Throws InvalidArgument for an invalid or repeated field name.
nlohmann::ordered_json recordToJson(const Record& record);
// `context` (the text it came from) is quoted in errors. Throws InvalidArgument.
Record recordFromJson(const nlohmann::ordered_json& j, const std::string& context);

}  // namespace dtrain::metrics
