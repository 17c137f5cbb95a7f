#include "launcher/monitor/cluster_keys.h"

#include <algorithm>
#include <cstdint>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dtrain/base/error.h"
#include "dtrain/base/progress.h"
#include "parse_int.h"

namespace dtrain::launcher::monitor {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr std::chrono::milliseconds kStackPoll{100};

}  // namespace

void publishNodeRecords(store::Store& round, int nodeRank, const std::vector<Record>& records) {
  round.set(progress::nodeKey(nodeRank), store::toBytes(metrics::toJsonArray(records)));
  round.add(progress::kVersionKey, 1);
}

std::map<int, std::vector<Record>> readNodeRecords(store::Store& round, int numNodes, int ownNode,
                                                   std::vector<std::string>* problems) {
  std::map<int, std::vector<Record>> out;
  for (int n = 0; n < numNodes; ++n) {
    if (n == ownNode) continue;
    const std::string key = progress::nodeKey(n);
    if (!round.check({key})) continue;
    try {
      out[n] = metrics::parseJsonArray(store::toString(round.get(key)));
    } catch (const InvalidArgument& e) {
      if (problems) problems->push_back(fmt::format("{}: {}", key, e.what()));
    }
  }
  return out;
}

int64_t requestStacks(store::Store& round, const std::vector<int>& ranks) {
  const int64_t id = round.add("monitor/stacks/requests", 1);
  json j = {{"id", id}, {"ranks", ranks}};
  round.set(progress::kStackRequestKey, store::toBytes(j.dump()));
  round.add(progress::kVersionKey, 1);
  return id;
}

std::optional<StackRequest> pendingStackRequest(store::Store& round, int64_t answered) {
  if (!round.check({progress::kStackRequestKey})) return std::nullopt;
  json j = json::parse(store::toString(round.get(progress::kStackRequestKey)), nullptr, false);
  if (!j.is_object() || !j["id"].is_number_integer() || !j["ranks"].is_array()) return std::nullopt;
  StackRequest r;
  r.id = j["id"].get<int64_t>();
  if (r.id <= answered) return std::nullopt;
  for (const auto& rank : j["ranks"]) {
    if (rank.is_number_integer()) r.ranks.push_back(rank.get<int>());
  }
  return r;
}

void answerStacks(store::Store& round, int nodeRank, int64_t id,
                  const std::map<int, std::string>& stacks) {
  json answer = json::object();
  for (const auto& [rank, text] : stacks) answer[std::to_string(rank)] = text;
  json j = {{"request", id}, {"stacks", std::move(answer)}};
  round.set(progress::stacksKey(nodeRank), store::toBytes(j.dump()));
  round.flush();
}

std::map<int, std::string> collectStacks(store::Store& round, int64_t id, int numNodes,
                                         int ownNode, std::chrono::milliseconds wait) {
  std::map<int, std::string> out;
  std::vector<bool> answered(static_cast<size_t>(std::max(0, numNodes)), false);
  if (ownNode >= 0 && ownNode < numNodes) answered[static_cast<size_t>(ownNode)] = true;
  const auto deadline = Clock::now() + wait;
  while (true) {
    for (int n = 0; n < numNodes; ++n) {
      if (answered[static_cast<size_t>(n)]) continue;
      const std::string key = progress::stacksKey(n);
      if (!round.check({key})) continue;
      json j = json::parse(store::toString(round.get(key)), nullptr, false);
      if (!j.is_object() || !j["request"].is_number_integer() ||
          j["request"].get<int64_t>() != id || !j["stacks"].is_object()) {
        continue;  // an answer to an earlier request, or garbage: keep waiting
      }
      answered[static_cast<size_t>(n)] = true;
      for (const auto& [rank, text] : j["stacks"].items()) {
        int64_t r = -1;
        if (text.is_string() && parseInt64(rank, &r) && r >= 0 && r <= INT32_MAX) {
          out[static_cast<int>(r)] = text.get<std::string>();
        }
      }
    }
    if (std::all_of(answered.begin(), answered.end(), [](bool b) { return b; }) ||
        Clock::now() >= deadline) {
      return out;
    }
    std::this_thread::sleep_for(kStackPoll);
  }
}

}  // namespace dtrain::launcher::monitor
