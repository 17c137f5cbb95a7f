#include "launcher/cluster/protocol/plan_codec.h"

#include <tuple>

#include "dtrain/base/error.h"
#include "launcher/config/launch_args.h"
#include "parse_int.h"

namespace dtrain::launcher {

remote::Records agentPlanRecords(const AgentSetup& s) {
  remote::Records r;
  for (const auto& [name, value] : s.config.appliedOptions)
    r.emplace_back("option", name + "=" + value);
  r.emplace_back("node", s.node);
  r.emplace_back("requested-rank", std::to_string(s.requestedRank));
  r.emplace_back("label", s.label);
  r.emplace_back("slots", std::to_string(s.slots));
  std::string gpus;
  for (int g : s.gpus) gpus += (gpus.empty() ? "" : ",") + std::to_string(g);
  r.emplace_back("gpus", gpus);
  r.emplace_back("store", s.storeAddr + ":" + std::to_string(s.storePort));
  r.emplace_back("token", s.token);
  for (const auto& [key, value] : s.forwarded) r.emplace_back("env", key + "=" + value);
  return r;
}

AgentSetup agentSetupFromRecords(const remote::Records& records, const LaunchConfig& base) {
  AgentSetup s;
  s.config = base;
  s.watchStdin = true;
  auto number = [](const std::string& name, const std::string& v) {
    int64_t n = 0;
    DTRAIN_CHECK_ARG(parseInt64(v, &n) && n >= 0 && n <= 1 << 20,
                     "agent plan: {} \"{}\" is not "
                     "a number",
                     name, v);
    return static_cast<int>(n);
  };
  for (const auto& [name, value] : records) {
    if (name == "option") {
      size_t eq = value.find('=');
      DTRAIN_CHECK_ARG(eq != std::string::npos, "agent plan: option record \"{}\"", value);
      const std::string option = value.substr(0, eq);
      applyLaunchOption(s.config, option, value.substr(eq + 1),
                        "--" + option + " (from the master)");
    } else if (name == "node") {
      s.node = value;
    } else if (name == "requested-rank") {
      s.requestedRank = number(name, value);
    } else if (name == "label") {
      s.label = value;
    } else if (name == "slots") {
      s.slots = number(name, value);
    } else if (name == "gpus") {
      if (!value.empty()) s.gpus = parseRankList(value, "agent plan gpus");
    } else if (name == "store") {
      std::tie(s.storeAddr, s.storePort) = parseEndpoint(value, "agent plan store");
    } else if (name == "mode") {
      s.mode = value;
    } else if (name == "master") {
      s.master = value;
    } else if (name == "token") {
      s.token = value;
    } else if (name == "env") {
      size_t eq = value.find('=');
      DTRAIN_CHECK_ARG(eq != std::string::npos && eq > 0, "agent plan: env record without '='");
      s.forwarded[value.substr(0, eq)] = value.substr(eq + 1);
    } else {
      DTRAIN_THROW(InvalidArgument,
                   "agent plan: unknown record \"{}\"; HINT: the master runs "
                   "another launch version",
                   name);
    }
  }
  s.config.agent = true;
  DTRAIN_CHECK_ARG(!s.node.empty() && !s.storeAddr.empty() && s.storePort > 0,
                   "agent plan: no node id or store endpoint");
  return s;
}

}  // namespace dtrain::launcher
