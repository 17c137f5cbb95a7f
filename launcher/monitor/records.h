#pragma once
// launch's samples as metrics records -- the one record schema of dtrain/base/metrics.h
// (docs/design.md "Metrics"), the same a trainer's dtrain::metrics::Metrics writes, so
// scripts/plot_metrics.py reads launch's --metrics-file and a trainer's alike -- and the job's
// Prometheus exposition that launch serves on --metrics-port.
//
// Records launch writes (source "launch"), one per interval each:
//   node  {node}                      load1, mem_total_bytes, mem_available_bytes, mem_used_ratio,
//                                     mem_headroom_bytes, cgroup_usage_bytes,
//                                     cgroup_working_set_bytes, cgroup_limit_bytes,
//                                     swap_total_bytes, swap_used_bytes, context_switches_per_s,
//                                     workers, workers_alive, attempt, restarts
//   net   {node, interface}           net_rx_bytes_per_s, net_tx_bytes_per_s, net_rx_errors_per_s,
//                                     net_tx_errors_per_s, net_rx_drops_per_s, net_tx_drops_per_s,
//                                     net_collectives
//   disk  {node, mount}               disk_free_bytes, disk_total_bytes, disk_free_ratio,
//                                     disk_read_bytes_per_s, disk_write_bytes_per_s,
//                                     disk_checkpoints, disk_logs, disk_data
//   rank  {node, rank}                pid, local_rank, cpu_percent, rss_bytes, rss_peak_bytes,
//                                     threads, processes, read_bytes, write_bytes, collective_seq
//   gpu   {node, gpu}                 gpu_util, gpu_mem_used_bytes, gpu_mem_total_bytes,
//                                     gpu_temperature_c, gpu_power_w, gpu_processes,
//                                     gpu_ecc_corrected_errors, gpu_ecc_uncorrected_errors,
//                                     gpu_xid_events, gpu_last_xid
//   gpu   {node, gpu, rank}           gpu_process_mem_bytes (a worker's memory on that GPU)
// and the ranks' own trainer records (source "trainer", with step), which reach launch through
// the store (Note [Trainer records] in dtrain/base/progress.h), labelled with the rank's node.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/base/metrics.h"
#include "dtrain/base/progress.h"
#include "launcher/monitor/gpu_sampler.h"
#include "launcher/monitor/node_sampler.h"
#include "launcher/monitor/process_sampler.h"

namespace dtrain::launcher::monitor {

using metrics::Field;
using metrics::Record;

struct SampleContext {
  double time = 0;  // Unix seconds
  std::string runId;
  std::string node;
  int attempt = 0;
  int workers = 0;  // expected on this node
  int workersAlive = 0;
};

// The launch records of one node's sample. `progress` (rank -> its latest report) adds
// collective_seq; `ranks` attribute GPU processes to ranks by pid.
std::vector<Record> sampleRecords(const SampleContext& ctx, const NodeSample& node,
                                  const std::vector<RankSample>& ranks,
                                  const std::vector<GpuSample>& gpus,
                                  const std::map<int, progress::RankReport>& progress);

// The node's network, disk and scheduler figures of one sample: context_switches_per_s into
// `records`' node record (the first; sampleRecords' order), then one record per interface and
// one per filesystem. A rate is left out until its second sample.
void addNodeFigures(std::vector<Record>& records, const SampleContext& ctx,
                    const NodeFigures& figures);

// A rank's latest trainer figures as one record (source "trainer", the rank's step): what the
// endpoint shows. nullopt when it published neither a step nor a figure. Invalid names are
// dropped.
std::optional<Record> trainerRecord(const progress::RankReport& report, const std::string& runId,
                                    const std::string& node);

// The trainer records of `report` numbered above `written` (the last one launch appended to its
// file), stamped with launch's run id, the rank's node and rank; `written` moves to the last one.
// Records the report no longer carries (the trainer recorded faster than launch read) are
// counted in `*missed`.
std::vector<Record> newTrainerRecords(const progress::RankReport& report, uint64_t& written,
                                      const std::string& runId, const std::string& node,
                                      uint64_t* missed = nullptr);

// Job-wide state for the endpoint.
struct JobState {
  int attempt = 0;
  int restarts = 0;
  int maxRestarts = 0;
  int worldSize = 0;
  bool stalled = false;
  std::map<std::string, double> heartbeatAge;  // node -> seconds since the master heard from it
  double heartbeatTimeout = 0;                 // --heartbeat-timeout of a multi-node job; 0: none
  std::vector<int> stalledRanks;               // the ranks the stall report blames, while it lasts
};

// What launch's endpoint answers: `records` (the nodes' latest samples and the ranks' latest
// trainer records) and the job's state, as metrics::prometheusText renders them -- the job state
// without labels (dtrain_attempt, dtrain_restarts, dtrain_max_restarts, dtrain_world_size,
// dtrain_stalled, dtrain_heartbeat_timeout_seconds where there is one) and
// dtrain_heartbeat_age_seconds{node}, and dtrain_rank_stalled{node,rank} (1 for a rank in
// `stalledRanks`, else 0) for every rank launch samples. A trainer figure that repeats one of
// launch's series (same name and labels) is left out: launch's value is shown.
std::string exposition(const std::vector<Record>& records, const JobState& job);

}  // namespace dtrain::launcher::monitor
