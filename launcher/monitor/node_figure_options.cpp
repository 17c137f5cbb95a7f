#include "launcher/monitor/node_figure_options.h"

#include <filesystem>
#include <string>
#include <vector>

namespace dtrain::launcher {

monitor::NodeFigureOptions nodeFigureOptions(const LaunchConfig& config, const NodeContext& node) {
  // The value the workers see: --env, then launch's additions, then what launch inherited.
  auto workerValue = [&](const std::string& name) -> std::string {
    for (auto it = config.env.rbegin(); it != config.env.rend(); ++it) {
      if (it->first == name) return it->second;
    }
    if (auto it = node.overlay.find(name); it != node.overlay.end()) return it->second;
    if (auto it = node.inherited.find(name); it != node.inherited.end()) return it->second;
    return "";
  };
  std::vector<std::string> logDirs = {config.logDir, config.monitor.tensorboardDir};
  if (!config.monitor.metricsFile.empty()) {
    const std::string parent =
        std::filesystem::path(config.monitor.metricsFile).parent_path().string();
    logDirs.push_back(parent.empty() ? "." : parent);
  }
  monitor::NodeFigureOptions o;
  const auto off = node.inherited.find("DTRAIN_NODE_FIGURES");
  o.enabled = off == node.inherited.end() || off->second != "0";
  o.directories = monitor::watchedDirectories(logDirs, config.programArgs,
                                              workerValue("DTRAIN_CHECKPOINT_DIR"),
                                              workerValue("DTRAIN_DATA_DIR"));
  std::string ifname = workerValue("NCCL_SOCKET_IFNAME");
  if (!ifname.empty() && ifname.front() == '=') ifname.erase(0, 1);  // NCCL's exact match
  if (ifname.find_first_of(",^") == std::string::npos) o.collectiveInterface = ifname;
  return o;
}

}  // namespace dtrain::launcher
