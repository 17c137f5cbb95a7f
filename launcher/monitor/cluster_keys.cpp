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
// Keys per tryMultiGet: well below the store's 4096, and a few MiB of reports at most.
constexpr size_t kKeysPerRead = 512;

}  // namespace

std::vector<std::optional<store::Bytes>> readExisting(store::Store& round,
                                                      const std::vector<std::string>& keys) {
  std::vector<std::optional<store::Bytes>> out;
  out.reserve(keys.size());
  for (size_t at = 0; at < keys.size(); at += kKeysPerRead) {
    const std::vector<std::string> part(
        keys.begin() + static_cast<std::ptrdiff_t>(at),
        keys.begin() + static_cast<std::ptrdiff_t>(std::min(keys.size(), at + kKeysPerRead)));
    for (auto& v : round.tryMultiGet(part)) out.push_back(std::move(v));
  }
  return out;
}

void publishNodeRecords(store::Store& round, int nodeRank, const std::vector<Record>& records) {
  round.set(progress::nodeKey(nodeRank), store::toBytes(metrics::toJsonArray(records)));
  round.add(progress::kVersionKey, 1);
}

std::map<int, std::vector<Record>> readNodeRecords(store::Store& round, int numNodes, int ownNode,
                                                   std::vector<std::string>* problems) {
  std::map<int, std::vector<Record>> out;
  std::vector<int> nodes;
  std::vector<std::string> ks;
  for (int n = 0; n < numNodes; ++n) {
    if (n == ownNode) continue;
    nodes.push_back(n);
    ks.push_back(progress::nodeKey(n));
  }
  const auto values = readExisting(round, ks);
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!values[i]) continue;
    try {
      out[nodes[i]] = metrics::parseJsonArray(store::toString(*values[i]));
    } catch (const InvalidArgument& e) {
      if (problems) problems->push_back(fmt::format("{}: {}", ks[i], e.what()));
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

std::map<int, std::string> collectStacks(store::Store& round, int64_t id, int numNodes, int ownNode,
                                         std::chrono::milliseconds wait) {
  std::map<int, std::string> out;
  std::vector<bool> answered(static_cast<size_t>(std::max(0, numNodes)), false);
  if (ownNode >= 0 && ownNode < numNodes) answered[static_cast<size_t>(ownNode)] = true;
  const auto deadline = Clock::now() + wait;
  while (true) {
    std::vector<int> open;
    std::vector<std::string> ks;
    for (int n = 0; n < numNodes; ++n) {
      if (answered[static_cast<size_t>(n)]) continue;
      open.push_back(n);
      ks.push_back(progress::stacksKey(n));
    }
    const auto values = readExisting(round, ks);
    for (size_t i = 0; i < open.size(); ++i) {
      const int n = open[i];
      if (!values[i]) continue;
      json j = json::parse(store::toString(*values[i]), nullptr, false);
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
