#include "membership.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dtrain/base/error.h"
#include "parse_int.h"

namespace dtrain::membership {

std::string epochKey() { return "launch/epoch"; }

std::string formedKey(int epoch) { return fmt::format("launch/epoch{}/formed", epoch); }

std::string readyKey(int epoch) { return fmt::format("launch/epoch{}/ready", epoch); }

std::string epochPrefix(int epoch) { return fmt::format("epoch{}", epoch); }

int Epoch::rankOf(const std::string& node, int localRank) const {
  for (const auto& n : nodes) {
    if (n.node != node) continue;
    if (localRank < 0 || localRank >= n.localWorldSize) return -1;
    return n.rankOffset + localRank;
  }
  return -1;
}

std::string encodeEpoch(const Epoch& epoch) {
  nlohmann::json nodes = nlohmann::json::array();
  for (const auto& n : epoch.nodes) nodes.push_back({n.node, n.rankOffset, n.localWorldSize});
  nlohmann::json j = {{"epoch", epoch.epoch},
                      {"world_size", epoch.worldSize},
                      {"nodes", nodes},
                      {"why", epoch.why}};
  if (epoch.joining > 0) j["joining"] = epoch.joining;
  return fmt::format("{}\n{}", epoch.epoch, j.dump());
}

Epoch decodeEpoch(const std::string& text) {
  const size_t newline = text.find('\n');
  if (newline == std::string::npos) {
    DTRAIN_THROW(InvalidArgument, "membership epoch '{}' has no newline after its number",
                 text.substr(0, 40));
  }
  Epoch e;
  try {
    const nlohmann::json j = nlohmann::json::parse(text.substr(newline + 1));
    e.epoch = j.at("epoch").get<int>();
    e.worldSize = j.at("world_size").get<int>();
    e.why = j.value("why", "");
    e.joining = j.value("joining", 0);
    for (const auto& n : j.at("nodes")) {
      e.nodes.push_back(
          EpochNode{n.at(0).get<std::string>(), n.at(1).get<int>(), n.at(2).get<int>()});
    }
  } catch (const nlohmann::json::exception& ex) {
    DTRAIN_THROW(InvalidArgument, "membership epoch is malformed: {}", ex.what());
  }
  int64_t head = 0;
  if (!parseInt64(text.substr(0, newline), &head) || head != e.epoch || e.epoch < 0) {
    DTRAIN_THROW(InvalidArgument, "membership epoch's number '{}' does not match its body ({})",
                 text.substr(0, newline), e.epoch);
  }
  int next = 0;
  for (const auto& n : e.nodes) {
    if (n.rankOffset != next || n.localWorldSize < 1) {
      DTRAIN_THROW(InvalidArgument,
                   "membership epoch {}: node {} has ranks [{}, {}), expected them from {}",
                   e.epoch, n.node, n.rankOffset, n.rankOffset + n.localWorldSize, next);
    }
    next += n.localWorldSize;
  }
  if (next != e.worldSize || e.worldSize < 1) {
    DTRAIN_THROW(InvalidArgument, "membership epoch {}: its nodes hold {} ranks, world size {}",
                 e.epoch, next, e.worldSize);
  }
  if (e.joining < 0 || e.joining >= e.worldSize) {
    DTRAIN_THROW(InvalidArgument, "membership epoch {}: {} joining ranks of {}", e.epoch, e.joining,
                 e.worldSize);
  }
  return e;
}

}  // namespace dtrain::membership
