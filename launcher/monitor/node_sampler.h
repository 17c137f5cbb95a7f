#pragma once
// A node's network, disk and scheduler figures, as people renting GPU nodes watch them: per
// network interface the bytes, drops and errors per second (/proc/net/dev); per filesystem that
// holds the job's checkpoint, log or data directories the bytes free and their share (statvfs)
// and the bytes read and written per second (/proc/diskstats); the context switches per second
// (/proc/stat). Swap and load come with ProcessSampler::sampleNode. Rates are over the time
// between two samples, so the first sample has none.

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "launcher/monitor/node_files.h"
#include "launcher/monitor/proc_files.h"

namespace dtrain::launcher::monitor {

// Note [Watched directories]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// launch knows where the job's logs go (--log-dir, the directories of --metrics-file and
// --tensorboard-dir) but not where the trainer keeps checkpoints or data: those are the
// program's own arguments. launch takes them from the program's command line when it spells
// them as the examples and most trainers do (`--checkpoint-dir DIR`, `--save-dir DIR`,
// `--data-dir DIR`, also with `=`), and from DTRAIN_CHECKPOINT_DIR / DTRAIN_DATA_DIR in the
// workers' environment (launch's own or --env), which name them for any program. A relative
// path is taken from launch's working directory, where the workers start. A directory that does
// not exist yet (the trainer creates its checkpoint directory later) is measured on the
// filesystem of its nearest existing parent, which is where it will be created. Each filesystem
// is reported once, with the roles of every directory on it.

enum class DirectoryRole { Checkpoint, Log, Data };
const char* directoryRoleName(DirectoryRole role);  // "checkpoint", "log", "data"

struct WatchedDirectory {
  DirectoryRole role = DirectoryRole::Log;
  std::string path;
};

// The directories of Note [Watched directories]: `logDirs` launch's own, then the program's
// arguments, then `environment` (DTRAIN_CHECKPOINT_DIR, DTRAIN_DATA_DIR). Pure; no duplicates.
std::vector<WatchedDirectory> watchedDirectories(const std::vector<std::string>& logDirs,
                                                 const std::vector<std::string>& programArgs,
                                                 const std::string& checkpointEnv,
                                                 const std::string& dataEnv);

struct NodeFigureOptions {
  bool enabled = true;  // DTRAIN_NODE_FIGURES=0 in launch's environment: none are sampled
  std::vector<WatchedDirectory> directories;
  // The interface the collectives use (NCCL_SOCKET_IFNAME when it names one); empty: unknown.
  std::string collectiveInterface;
  std::string procDir = "/proc";  // tests point it at recorded files
  size_t maxInterfaces = 32;      // beyond these, only the collectives' one is added
};

struct InterfaceFigures {
  std::string name;
  bool collectives = false;
  bool hasRates = false;  // false at the interface's first sample
  double rxBytesPerS = 0;
  double txBytesPerS = 0;
  double rxErrorsPerS = 0;
  double txErrorsPerS = 0;
  double rxDropsPerS = 0;
  double txDropsPerS = 0;
};

struct FilesystemFigures {
  std::string mountPoint;
  bool checkpoints = false;  // holds a directory of that role
  bool logs = false;
  bool data = false;
  int64_t freeBytes = -1;  // what an unprivileged writer may still use (f_bavail)
  int64_t totalBytes = -1;
  bool hasRates = false;  // its block device is in /proc/diskstats and sampled twice
  double readBytesPerS = 0;
  double writeBytesPerS = 0;

  std::optional<double> freeRatio() const;
};

struct NodeFigures {
  std::vector<InterfaceFigures> interfaces;
  std::vector<FilesystemFigures> filesystems;
  std::optional<double> contextSwitchesPerS;
};

class NodeFigureSampler {
 public:
  explicit NodeFigureSampler(NodeFigureOptions options);

  // `now`: steady-clock seconds. Valid until the next call.
  const NodeFigures& sample(double now);

 private:
  // A watched directory's filesystem, found again when the directory's device changes (it was
  // created on another filesystem than its parent's, or a mount came or went).
  struct Resolved {
    dev_t device = 0;
    bool known = false;
    std::string statPath;  // the directory, or its nearest existing parent
    MountPoint mount;
  };
  struct DiskState {
    bool known = false;
    double time = 0;
    uint64_t readBytes = 0;
    uint64_t writtenBytes = 0;
  };
  void resolve();
  void sampleInterfaces(double now);
  void sampleFilesystems(double now);

  const NodeFigureOptions options_;
  FileReader reader_;
  std::string netDevPath_;
  std::string diskStatsPath_;
  std::string statPath_;
  std::string mountInfoPath_;
  std::vector<Resolved> resolved_;      // one per options_.directories
  std::vector<NetDevCounters> netNow_;  // reused
  std::vector<NetDevCounters> netBefore_;
  double netTime_ = -1;
  std::vector<DiskState> disks_;  // one per figures_.filesystems
  std::optional<uint64_t> ctxtBefore_;
  double ctxtTime_ = 0;
  NodeFigures figures_;
};

}  // namespace dtrain::launcher::monitor
