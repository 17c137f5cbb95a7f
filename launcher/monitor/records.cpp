#include "launcher/monitor/records.h"

#include <algorithm>

#include "launcher/monitor/stall_detector.h"

namespace dtrain::launcher::monitor {

namespace {

void put(Record& r, const char* name, double value) { r.fields.emplace_back(name, value); }
void putIfKnown(Record& r, const char* name, int64_t value) {
  if (value >= 0) r.fields.emplace_back(name, static_cast<double>(value));
}

Record base(const SampleContext& ctx) {
  Record r;
  r.time = ctx.time;
  r.source = "launch";
  r.runId = ctx.runId;
  r.node = ctx.node;
  return r;
}

}  // namespace

std::vector<Record> sampleRecords(const SampleContext& ctx, const NodeSample& node,
                                  const std::vector<RankSample>& ranks,
                                  const std::vector<GpuSample>& gpus,
                                  const std::map<int, progress::RankReport>& progress) {
  std::vector<Record> out;
  Record n = base(ctx);
  if (node.load1) put(n, "load1", *node.load1);
  putIfKnown(n, "mem_total_bytes", node.mem.totalBytes);
  putIfKnown(n, "mem_available_bytes", node.mem.availableBytes);
  if (auto f = node.memUsedFraction()) put(n, "mem_used_ratio", *f);
  if (auto h = node.memHeadroomBytes()) put(n, "mem_headroom_bytes", static_cast<double>(*h));
  if (node.cgroup) {
    putIfKnown(n, "cgroup_usage_bytes", node.cgroup->usageBytes);
    putIfKnown(n, "cgroup_working_set_bytes", node.cgroup->workingSetBytes());
    putIfKnown(n, "cgroup_limit_bytes", node.cgroup->limitBytes);
  }
  putIfKnown(n, "swap_total_bytes", node.mem.swapTotalBytes);
  if (node.mem.swapTotalBytes >= 0 && node.mem.swapFreeBytes >= 0) {
    const int64_t used = node.mem.swapTotalBytes - node.mem.swapFreeBytes;
    put(n, "swap_used_bytes", static_cast<double>(std::max<int64_t>(0, used)));
  }
  put(n, "workers", ctx.workers);
  put(n, "workers_alive", ctx.workersAlive);
  put(n, "attempt", ctx.attempt);
  put(n, "restarts", ctx.attempt);
  out.push_back(std::move(n));

  std::map<int64_t, int> rankOfPid;
  for (const auto& s : ranks) {
    Record r = base(ctx);
    r.rank = s.rank;
    put(r, "pid", s.pid);
    put(r, "local_rank", s.localRank);
    if (s.cpuPercent >= 0) put(r, "cpu_percent", s.cpuPercent);
    put(r, "rss_bytes", static_cast<double>(s.rssBytes));
    put(r, "rss_peak_bytes", static_cast<double>(s.peakRssBytes));
    put(r, "threads", static_cast<double>(s.threads));
    put(r, "processes", static_cast<double>(s.processes));
    putIfKnown(r, "read_bytes", s.readBytes);
    putIfKnown(r, "write_bytes", s.writeBytes);
    auto p = progress.find(s.rank);
    if (p != progress.end()) {
      if (const auto* c = primaryCollectives(p->second)) {
        put(r, "collective_seq", static_cast<double>(c->issued));
      }
    }
    out.push_back(std::move(r));
    for (pid_t pid : s.pids) rankOfPid[pid] = s.rank;
  }

  for (const auto& g : gpus) {
    Record r = base(ctx);
    r.gpu = g.index;
    if (g.utilPercent) put(r, "gpu_util", *g.utilPercent);
    if (g.memUsedBytes) put(r, "gpu_mem_used_bytes", *g.memUsedBytes);
    if (g.memTotalBytes) put(r, "gpu_mem_total_bytes", *g.memTotalBytes);
    if (g.temperatureC) put(r, "gpu_temperature_c", *g.temperatureC);
    if (g.powerW) put(r, "gpu_power_w", *g.powerW);
    put(r, "gpu_processes", static_cast<double>(g.processes.size()));
    if (g.eccCorrected) put(r, "gpu_ecc_corrected_errors", *g.eccCorrected);
    if (g.eccUncorrected) put(r, "gpu_ecc_uncorrected_errors", *g.eccUncorrected);
    if (g.xidEvents) put(r, "gpu_xid_events", *g.xidEvents);
    if (g.lastXid) put(r, "gpu_last_xid", *g.lastXid);
    out.push_back(std::move(r));
    std::map<int, double> perRank;
    for (const auto& p : g.processes) {
      auto it = rankOfPid.find(p.pid);
      if (it == rankOfPid.end()) continue;
      perRank[it->second] += p.usedBytes > 0 ? static_cast<double>(p.usedBytes) : 0.0;
    }
    for (const auto& [rank, bytes] : perRank) {
      Record pr = base(ctx);
      pr.gpu = g.index;
      pr.rank = rank;
      put(pr, "gpu_process_mem_bytes", bytes);
      out.push_back(std::move(pr));
    }
  }
  return out;
}

void addNodeFigures(std::vector<Record>& records, const SampleContext& ctx,
                    const NodeFigures& figures) {
  if (!records.empty() && figures.contextSwitchesPerS) {
    put(records.front(), "context_switches_per_s", *figures.contextSwitchesPerS);
  }
  for (const auto& i : figures.interfaces) {
    Record r = base(ctx);
    r.interface = i.name;
    if (i.hasRates) {
      put(r, "net_rx_bytes_per_s", i.rxBytesPerS);
      put(r, "net_tx_bytes_per_s", i.txBytesPerS);
      put(r, "net_rx_errors_per_s", i.rxErrorsPerS);
      put(r, "net_tx_errors_per_s", i.txErrorsPerS);
      put(r, "net_rx_drops_per_s", i.rxDropsPerS);
      put(r, "net_tx_drops_per_s", i.txDropsPerS);
    }
    put(r, "net_collectives", i.collectives ? 1 : 0);
    records.push_back(std::move(r));
  }
  for (const auto& f : figures.filesystems) {
    Record r = base(ctx);
    r.mount = f.mountPoint;
    putIfKnown(r, "disk_free_bytes", f.freeBytes);
    putIfKnown(r, "disk_total_bytes", f.totalBytes);
    if (auto ratio = f.freeRatio()) put(r, "disk_free_ratio", *ratio);
    if (f.hasRates) {
      put(r, "disk_read_bytes_per_s", f.readBytesPerS);
      put(r, "disk_write_bytes_per_s", f.writeBytesPerS);
    }
    put(r, "disk_checkpoints", f.checkpoints ? 1 : 0);
    put(r, "disk_logs", f.logs ? 1 : 0);
    put(r, "disk_data", f.data ? 1 : 0);
    records.push_back(std::move(r));
  }
}

std::optional<Record> trainerRecord(const progress::RankReport& report, const std::string& runId,
                                    const std::string& node) {
  if (!report.step && report.figures.empty()) return std::nullopt;
  Record r;
  r.time = report.figuresStep ? report.figuresTime : report.time;
  r.source = "trainer";
  r.runId = runId;
  r.node = node;
  r.rank = report.rank;
  r.step = report.step;
  for (const auto& [name, value] : report.figures) {
    if (metrics::validFieldName(name)) r.fields.emplace_back(name, value);
  }
  return r;
}

std::vector<Record> newTrainerRecords(const progress::RankReport& report, uint64_t& written,
                                      const std::string& runId, const std::string& node,
                                      uint64_t* missed) {
  std::vector<Record> out;
  if (report.lastRecord <= written) return out;
  const uint64_t first = report.lastRecord - report.records.size() + 1;
  if (missed != nullptr && first > written + 1) *missed += first - written - 1;
  for (uint64_t number = std::max(first, written + 1); number <= report.lastRecord; ++number) {
    Record r = report.records[number - first];
    r.source = "trainer";
    r.runId = runId;
    r.node = node;
    r.rank = report.rank;
    out.push_back(std::move(r));
  }
  written = report.lastRecord;
  return out;
}

std::string exposition(const std::vector<Record>& records, const JobState& job) {
  // Later records win a series in metrics::prometheusText: the trainers' first, so that launch's
  // own series are never replaced by a trainer figure of the same name.
  std::vector<Record> all;
  all.reserve(records.size() + job.heartbeatAge.size() + 1);
  for (const auto& r : records) {
    if (r.source == "trainer") all.push_back(r);
  }
  for (const auto& r : records) {
    if (r.source == "trainer") continue;
    Record copy = r;
    // Job-wide below, without a node label.
    copy.fields.erase(std::remove_if(copy.fields.begin(), copy.fields.end(),
                                     [](const Field& f) {
                                       return f.first == "attempt" || f.first == "restarts";
                                     }),
                      copy.fields.end());
    all.push_back(std::move(copy));
  }
  Record state;
  state.source = "launch";
  state.fields = {{"attempt", job.attempt},
                  {"restarts", job.restarts},
                  {"max_restarts", job.maxRestarts},
                  {"world_size", job.worldSize},
                  {"stalled", job.stalled ? 1 : 0}};
  if (job.heartbeatTimeout > 0) {
    state.fields.emplace_back("heartbeat_timeout_seconds", job.heartbeatTimeout);
  }
  all.push_back(std::move(state));
  for (const auto& r : records) {
    if (r.source != "launch" || !r.rank || r.gpu) continue;
    Record stalled;
    stalled.source = "launch";
    stalled.node = r.node;
    stalled.rank = r.rank;
    const bool blamed = std::find(job.stalledRanks.begin(), job.stalledRanks.end(), *r.rank) !=
                        job.stalledRanks.end();
    stalled.fields = {{"rank_stalled", blamed ? 1 : 0}};
    all.push_back(std::move(stalled));
  }
  for (const auto& [node, age] : job.heartbeatAge) {
    Record heartbeat;
    heartbeat.source = "launch";
    heartbeat.node = node;
    heartbeat.fields = {{"heartbeat_age_seconds", age}};
    all.push_back(std::move(heartbeat));
  }
  return metrics::prometheusText(all);
}

}  // namespace dtrain::launcher::monitor
