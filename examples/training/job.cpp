#include "training/job.h"

#include <cstdio>

namespace examples {

std::shared_ptr<dtrain::ProcessGroup> joinJob(const std::string& device) {
  dtrain::InitOptions init;
  if (device == "cpu") init.backend = "gloo";
  if (device == "cuda") init.backend = "nccl";
  return dtrain::init(init);
}

void addOwnSinks(dtrain::metrics::Metrics& metrics, const OwnSinks& sinks) {
  if (!sinks.metricsFile.empty()) {
    metrics.addSink(dtrain::metrics::JsonlSink::open(sinks.metricsFile));
  }
  if (!sinks.tensorboardDir.empty()) {
    metrics.addSink(dtrain::metrics::TensorBoardSink::open(sinks.tensorboardDir));
  }
  if (sinks.metricsPort >= 0) {
    auto endpoint = dtrain::metrics::PrometheusEndpoint::start(
        {"0.0.0.0", static_cast<uint16_t>(sinks.metricsPort)});
    std::printf("metrics: http://%s:%u/metrics\n", metrics.node().c_str(), endpoint->port());
    metrics.addSink(endpoint);
  }
}

void recordCheckpointWrites(dtrain::Checkpointer* checkpointer, dtrain::metrics::Metrics& metrics) {
  if (!checkpointer) return;
  for (const auto& write : checkpointer->finishedWrites()) {
    metrics.record(write.step, {{"checkpoint_write_seconds", write.seconds},
                                {"checkpoint_bytes", static_cast<double>(write.bytes)}});
  }
}

}  // namespace examples
