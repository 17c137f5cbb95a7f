#pragma once
// What `launch` is asked to watch (--sample-interval, --metrics-port, --metrics-file,
// --tensorboard-dir, --status-interval, --stall-timeout, --stall-action). Part of LaunchConfig;
// plain values,
// checked by validateMonitorOptions() without touching the machine.

#include <functional>
#include <string>

namespace dtrain::launcher {

// torchrun users pass --monitor-interval 0.1 (its polling period); sampling that often would cost
// the job, so sampling has an option of its own and --monitor-interval stays accepted and ignored.
constexpr double kDefaultSampleIntervalSeconds = 5.0;
constexpr double kMinSampleIntervalSeconds = 0.05;
constexpr const char* kDefaultMetricsHost = "0.0.0.0";  // every interface, as exporters do

enum class StallAction { Report, Stop };

struct MonitorOptions {
  double sampleInterval = kDefaultSampleIntervalSeconds;
  std::string metricsHost = kDefaultMetricsHost;
  int metricsPort = -1;        // -1: no endpoint; 0: a free port (printed)
  std::string metricsFile;     // empty: none
  std::string tensorboardDir;  // empty: none; else TensorBoard event files of what metricsFile gets
  double statusInterval = 0;   // 0: no status line
  double stallTimeout = 0;     // 0: no stall detection
  StallAction stallAction = StallAction::Report;
};

// Value parsers (throw InvalidArgument naming `label` and the accepted forms).
// "9400", "127.0.0.1:9400", "0" (a free port).
void parseMetricsEndpoint(const std::string& text, const std::string& label, MonitorOptions& out);
StallAction parseStallAction(const std::string& text, const std::string& label);

// The shortest stall timeout: ranks publish progress at most once a second.
constexpr double kMinStallTimeoutSeconds = 2.0;

// Cross-option checks; `label` maps an option name ("stall-timeout") to how the user gave it.
void validateMonitorOptions(const MonitorOptions& o,
                            const std::function<std::string(const std::string&)>& label);

const char* stallActionName(StallAction action);

}  // namespace dtrain::launcher
