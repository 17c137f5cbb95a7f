// The fields dtrain itself writes, with the help line the Prometheus exposition gives each: the
// schema's vocabulary (docs/design.md "Metrics"). launch's are listed in
// launcher/monitor/records.h, the sample trainers' in docs/training.md.
#include <map>
#include <string>

#include "dtrain/base/metrics.h"

namespace dtrain::metrics {

const char* fieldHelp(const std::string& name) {
  // Never destroyed, like every table a background thread may read during exit.
  static const auto* const kHelp = new std::map<std::string, const char*>{
      // launch: a node
      {"load1", "1-minute load average of the node"},
      {"mem_total_bytes", "memory of the machine"},
      {"mem_available_bytes", "memory available on the machine (MemAvailable)"},
      {"mem_used_ratio", "memory in use: the larger of the memory cgroup's working set over its "
                         "limit and the machine's"},
      {"mem_headroom_bytes", "memory left before that ratio reaches 1"},
      {"cgroup_usage_bytes", "memory charged to launch's memory cgroup, page cache included"},
      {"cgroup_working_set_bytes", "the memory cgroup's usage minus inactive file pages"},
      {"cgroup_limit_bytes", "the memory cgroup's limit (absent: none)"},
      {"swap_total_bytes", "swap space of the machine"},
      {"swap_used_bytes", "swap in use (SwapTotal - SwapFree; 0 without swap)"},
      {"context_switches_per_s", "context switches on the machine per second"},
      {"workers", "workers launch runs on the node"},
      {"workers_alive", "workers running now"},
      // launch: a network interface
      {"net_rx_bytes_per_s", "bytes received per second"},
      {"net_tx_bytes_per_s", "bytes sent per second"},
      {"net_rx_errors_per_s", "receive errors per second"},
      {"net_tx_errors_per_s", "transmit errors per second"},
      {"net_rx_drops_per_s", "received packets dropped per second"},
      {"net_tx_drops_per_s", "packets to send dropped per second"},
      {"net_collectives", "1 for the interface the collectives use (NCCL_SOCKET_IFNAME)"},
      // launch: a filesystem of the job's directories
      {"disk_free_bytes", "bytes an unprivileged writer may still use (statvfs f_bavail)"},
      {"disk_total_bytes", "size of the filesystem"},
      {"disk_free_ratio", "disk_free_bytes over disk_total_bytes"},
      {"disk_read_bytes_per_s", "bytes read per second from the filesystem's block device"},
      {"disk_write_bytes_per_s", "bytes written per second to the filesystem's block device"},
      {"disk_checkpoints", "1 when the filesystem holds the checkpoint directory"},
      {"disk_logs", "1 when the filesystem holds a log directory (--log-dir, --metrics-file, "
                    "--tensorboard-dir)"},
      {"disk_data", "1 when the filesystem holds the data directory"},
      // launch: the job
      {"attempt", "the attempt running (0 first; restarts add one)"},
      {"restarts", "restarts so far"},
      {"world_size", "ranks in the job"},
      {"max_restarts", "the restart budget (--max-restarts)"},
      {"stalled", "1 while launch sees a stall (--stall-timeout)"},
      {"rank_stalled", "1 while the stall report blames the rank (behind, or stuck)"},
      {"heartbeat_age_seconds", "seconds since launch last heard from the node"},
      {"heartbeat_timeout_seconds", "a node silent this long is lost (--heartbeat-timeout)"},
      // launch: a worker
      {"pid", "the worker's process id"},
      {"local_rank", "the worker's local rank"},
      {"cpu_percent", "CPU of the worker and its descendants, percent of one core"},
      {"rss_bytes", "resident memory of the worker and its descendants"},
      {"rss_peak_bytes", "peak resident memory of the worker"},
      {"threads", "threads of the worker and its descendants"},
      {"processes", "the worker and its live descendants"},
      {"read_bytes", "bytes read from storage by the worker and its descendants"},
      {"write_bytes", "bytes written to storage by the worker and its descendants"},
      {"collective_seq", "collectives the rank has issued"},
      // launch: a GPU
      {"gpu_util", "GPU utilisation, percent"},
      {"gpu_mem_used_bytes", "GPU memory in use"},
      {"gpu_mem_total_bytes", "GPU memory"},
      {"gpu_temperature_c", "GPU temperature, degrees Celsius"},
      {"gpu_power_w", "GPU power draw, watts"},
      {"gpu_processes", "processes using the GPU"},
      {"gpu_process_mem_bytes", "GPU memory used by the worker's processes"},
      {"gpu_ecc_corrected_errors", "corrected ECC errors since the driver loaded"},
      {"gpu_ecc_uncorrected_errors", "uncorrected ECC errors since the driver loaded"},
      {"gpu_xid_events", "XID events (the driver's critical GPU errors) since launch started"},
      {"gpu_last_xid", "the code of the last XID event"},
      // a trainer
      {"step", "the rank's training step (optimizer steps done)"},
      {"loss", "training loss of the step"},
      {"accuracy", "training accuracy of the step's batch"},
      {"test_accuracy", "accuracy on the test set at the last evaluation"},
      {"samples_per_s", "training throughput, samples per second"},
      {"lr", "learning rate of the step"},
      {"epoch", "the epoch the step belongs to (0 first)"},
      {"loss_scale", "the loss scale of mixed precision (GradScaler)"},
      {"allreduce_wait_share", "share of the step spent waiting for gradient allreduces"},
      {"checkpoint_seconds", "seconds the step loop waited for a checkpoint"},
      {"checkpoint_write_seconds", "seconds a checkpoint took to write, fsync and commit on the "
                                   "node (in the background)"},
      {"checkpoint_bytes", "size of the checkpoint file"},
      {"resumed", "1 at the step a run resumed from a checkpoint"},
  };
  auto it = kHelp->find(name);
  return it == kHelp->end() ? "a figure the program recorded" : it->second;
}

bool fieldIsCounter(const std::string& name) {
  return name == "read_bytes" || name == "write_bytes" || name == "gpu_xid_events";
}

}  // namespace dtrain::metrics
