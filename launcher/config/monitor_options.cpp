#include "launcher/config/monitor_options.h"

#include "dtrain/base/error.h"
#include "launcher/config/launch_config.h"
#include "parse_int.h"

namespace dtrain::launcher {

void parseMetricsEndpoint(const std::string& text, const std::string& label, MonitorOptions& out) {
  std::string host = kDefaultMetricsHost;
  std::string port = text;
  size_t colon = text.rfind(':');
  if (colon != std::string::npos) {
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    DTRAIN_CHECK_ARG(!host.empty(),
                     "{} {}: the address before ':' is empty; HINT: PORT or "
                     "HOST:PORT, e.g. 9400 or 127.0.0.1:9400",
                     label, quoteValue(text));
  }
  int64_t value = -1;
  DTRAIN_CHECK_ARG(parseInt64(port, &value) && value >= 0 && value <= 65535,
                   "{} {}: not a port (0-65535); HINT: PORT or HOST:PORT, e.g. 9400 or "
                   "127.0.0.1:9400 (0: a free port, printed at the start)",
                   label, quoteValue(text));
  out.metricsHost = host;
  out.metricsPort = static_cast<int>(value);
}

StallAction parseStallAction(const std::string& text, const std::string& label) {
  return parseChoice(text, label,
                     {{"report", "print where the ranks are and go on"},
                      {"stop", "print it, then stop the job and exit 124"}}) == 0
             ? StallAction::Report
             : StallAction::Stop;
}

const char* stallActionName(StallAction action) {
  return action == StallAction::Stop ? "stop" : "report";
}

void validateMonitorOptions(const MonitorOptions& o,
                            const std::function<std::string(const std::string&)>& label) {
  DTRAIN_CHECK_ARG(o.sampleInterval >= kMinSampleIntervalSeconds,
                   "{} {:g}: at least {:g} "
                   "seconds; HINT: sampling costs the job a little CPU each time (5 is the "
                   "default)",
                   label("sample-interval"), o.sampleInterval, kMinSampleIntervalSeconds);
  DTRAIN_CHECK_ARG(o.stallTimeout == 0 || o.stallTimeout >= kMinStallTimeoutSeconds,
                   "{} {:g}: at least {:g} seconds (ranks publish their progress at most once a "
                   "second), or 0 for none",
                   label("stall-timeout"), o.stallTimeout, kMinStallTimeoutSeconds);
  DTRAIN_CHECK_ARG(o.stallAction == StallAction::Report || o.stallTimeout > 0,
                   "{} stop needs {} (when to call it a stall); HINT: e.g. --stall-timeout 600",
                   label("stall-action"), label("stall-timeout"));
}

}  // namespace dtrain::launcher
