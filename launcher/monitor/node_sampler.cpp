#include "launcher/monitor/node_sampler.h"

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>

#include <climits>
#include <cstdlib>
#include <filesystem>

namespace dtrain::launcher::monitor {

const char* directoryRoleName(DirectoryRole role) {
  switch (role) {
    case DirectoryRole::Checkpoint: return "checkpoint";
    case DirectoryRole::Log: return "log";
    case DirectoryRole::Data: return "data";
  }
  return "?";
}

std::vector<WatchedDirectory> watchedDirectories(const std::vector<std::string>& logDirs,
                                                 const std::vector<std::string>& programArgs,
                                                 const std::string& checkpointEnv,
                                                 const std::string& dataEnv) {
  std::vector<WatchedDirectory> out;
  auto add = [&](DirectoryRole role, const std::string& path) {
    if (path.empty()) return;
    for (const auto& d : out) {
      if (d.role == role && d.path == path) return;
    }
    out.push_back({role, path});
  };
  for (const auto& d : logDirs) add(DirectoryRole::Log, d);
  // See Note [Watched directories].
  static const std::pair<const char*, DirectoryRole> kFlags[] = {
      {"--checkpoint-dir", DirectoryRole::Checkpoint},
      {"--save-dir", DirectoryRole::Checkpoint},
      {"--data-dir", DirectoryRole::Data}};
  for (size_t i = 0; i < programArgs.size(); ++i) {
    const std::string& a = programArgs[i];
    for (const auto& [flag, role] : kFlags) {
      const std::string f = flag;
      if (a == f && i + 1 < programArgs.size()) {
        add(role, programArgs[i + 1]);
      } else if (a.size() > f.size() + 1 && a.compare(0, f.size(), f) == 0 && a[f.size()] == '=') {
        add(role, a.substr(f.size() + 1));
      }
    }
  }
  add(DirectoryRole::Checkpoint, checkpointEnv);
  add(DirectoryRole::Data, dataEnv);
  return out;
}

std::optional<double> FilesystemFigures::freeRatio() const {
  if (freeBytes < 0 || totalBytes <= 0) return std::nullopt;
  return static_cast<double>(freeBytes) / static_cast<double>(totalBytes);
}

NodeFigureSampler::NodeFigureSampler(NodeFigureOptions options)
    : options_(std::move(options)),
      reader_(256 * 1024),  // /proc/diskstats of a machine with many devices
      netDevPath_(options_.procDir + "/net/dev"),
      diskStatsPath_(options_.procDir + "/diskstats"),
      statPath_(options_.procDir + "/stat"),
      mountInfoPath_(options_.procDir + "/self/mountinfo"),
      resolved_(options_.directories.size()) {}

const NodeFigures& NodeFigureSampler::sample(double now) {
  if (!options_.enabled) return figures_;  // empty
  sampleInterfaces(now);
  resolve();
  sampleFilesystems(now);
  figures_.contextSwitchesPerS.reset();
  if (auto text = reader_.read(statPath_)) {
    if (auto ctxt = parseContextSwitches(*text)) {
      if (ctxtBefore_ && now > ctxtTime_ && *ctxt >= *ctxtBefore_) {
        figures_.contextSwitchesPerS = static_cast<double>(*ctxt - *ctxtBefore_) /
                                       (now - ctxtTime_);
      }
      ctxtBefore_ = ctxt;
      ctxtTime_ = now;
    }
  }
  return figures_;
}

void NodeFigureSampler::sampleInterfaces(double now) {
  auto text = reader_.read(netDevPath_);
  if (!text) {
    figures_.interfaces.clear();
    return;
  }
  parseNetDev(*text, netNow_);
  const double dt = netTime_ >= 0 ? now - netTime_ : 0;
  size_t kept = 0;
  for (const NetDevCounters& c : netNow_) {
    const std::string_view name = c.interface();
    const bool collectives = name == options_.collectiveInterface;
    // Loopback only when the collectives use it; interfaces that never carried a byte (an idle
    // bridge, ifb) are left out: they would be most of the series on a container host.
    if (!collectives && (name == "lo" || (c.rxBytes == 0 && c.txBytes == 0))) continue;
    if (!collectives && kept >= options_.maxInterfaces) continue;
    if (kept == figures_.interfaces.size()) figures_.interfaces.emplace_back();
    InterfaceFigures& f = figures_.interfaces[kept++];
    f.name.assign(name.data(), name.size());
    f.collectives = collectives;
    f.hasRates = false;
    for (const NetDevCounters& b : netBefore_) {
      // Counters that went down: the interface was recreated; no rate this time.
      if (b.interface() != name || dt <= 0 || c.rxBytes < b.rxBytes || c.txBytes < b.txBytes ||
          c.rxErrors < b.rxErrors || c.txErrors < b.txErrors || c.rxDrops < b.rxDrops ||
          c.txDrops < b.txDrops) {
        continue;
      }
      f.hasRates = true;
      f.rxBytesPerS = static_cast<double>(c.rxBytes - b.rxBytes) / dt;
      f.txBytesPerS = static_cast<double>(c.txBytes - b.txBytes) / dt;
      f.rxErrorsPerS = static_cast<double>(c.rxErrors - b.rxErrors) / dt;
      f.txErrorsPerS = static_cast<double>(c.txErrors - b.txErrors) / dt;
      f.rxDropsPerS = static_cast<double>(c.rxDrops - b.rxDrops) / dt;
      f.txDropsPerS = static_cast<double>(c.txDrops - b.txDrops) / dt;
      break;
    }
  }
  figures_.interfaces.resize(kept);
  netBefore_.swap(netNow_);
  netTime_ = now;
}

void NodeFigureSampler::resolve() {
  bool changed = false;
  for (size_t i = 0; i < resolved_.size(); ++i) {
    const std::string& path = options_.directories[i].path;
    Resolved& r = resolved_[i];
    struct stat st {};
    const bool exists = ::stat(path.c_str(), &st) == 0;
    if (exists && r.known && r.device == st.st_dev && r.statPath == path) continue;
    if (!exists && r.known && r.statPath != path) continue;  // measured on its parent meanwhile
    // See Note [Watched directories]: the nearest existing parent.
    std::filesystem::path at = std::filesystem::absolute(path);
    bool found = exists;
    while (!found && at.has_relative_path()) {
      at = at.parent_path();
      found = ::stat(at.c_str(), &st) == 0;
    }
    if (!found) continue;
    r.statPath = exists ? path : at.string();
    r.device = st.st_dev;
    r.known = true;
    char real[PATH_MAX];
    const std::string absolute = ::realpath(r.statPath.c_str(), real) ? std::string(real)
                                                                      : at.string();
    std::optional<MountPoint> m;
    if (auto text = reader_.read(mountInfoPath_)) {
      m = findMount(*text, absolute, major(st.st_dev), minor(st.st_dev));
    }
    r.mount = m ? *m : MountPoint{absolute, "", "", major(st.st_dev), minor(st.st_dev)};
    changed = true;
  }
  if (!changed) return;
  // One figure per filesystem, with the roles of every directory on it; the ones already
  // sampled keep their counters for the next rate.
  std::vector<FilesystemFigures> before;
  std::vector<DiskState> beforeDisks;
  before.swap(figures_.filesystems);
  beforeDisks.swap(disks_);
  for (size_t i = 0; i < resolved_.size(); ++i) {
    const Resolved& r = resolved_[i];
    if (!r.known) continue;
    size_t k = 0;
    while (k < figures_.filesystems.size() &&
           figures_.filesystems[k].mountPoint != r.mount.mountPoint) {
      ++k;
    }
    if (k == figures_.filesystems.size()) {
      figures_.filesystems.emplace_back().mountPoint = r.mount.mountPoint;
      disks_.emplace_back();
      for (size_t b = 0; b < before.size(); ++b) {
        if (before[b].mountPoint == r.mount.mountPoint) disks_.back() = beforeDisks[b];
      }
    }
    FilesystemFigures& f = figures_.filesystems[k];
    switch (options_.directories[i].role) {
      case DirectoryRole::Checkpoint: f.checkpoints = true; break;
      case DirectoryRole::Log: f.logs = true; break;
      case DirectoryRole::Data: f.data = true; break;
    }
  }
}

void NodeFigureSampler::sampleFilesystems(double now) {
  std::optional<std::string_view> diskstats = reader_.read(diskStatsPath_);
  for (size_t k = 0; k < figures_.filesystems.size(); ++k) {
    FilesystemFigures& f = figures_.filesystems[k];
    DiskState& d = disks_[k];
    const Resolved* r = nullptr;
    for (const Resolved& candidate : resolved_) {
      if (candidate.known && candidate.mount.mountPoint == f.mountPoint) {
        r = &candidate;
        break;
      }
    }
    if (r == nullptr) continue;
    struct statvfs vfs {};
    const bool measured = ::statvfs(r->statPath.c_str(), &vfs) == 0;
    f.freeBytes = measured ? static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize)
                           : -1;
    f.totalBytes = measured
                       ? static_cast<int64_t>(vfs.f_blocks) * static_cast<int64_t>(vfs.f_frsize)
                       : -1;
    f.hasRates = false;
    if (!diskstats) continue;
    // The device by number, else by the name the mount's source gives ("/dev/vda1" -> "vda1").
    std::string_view name;
    if (r->mount.source.compare(0, 5, "/dev/") == 0) {
      name = std::string_view(r->mount.source).substr(r->mount.source.rfind('/') + 1);
    }
    auto c = findDiskStats(*diskstats, r->mount.major, r->mount.minor, name);
    if (!c) continue;
    if (d.known && now > d.time && c->readBytes >= d.readBytes &&
        c->writtenBytes >= d.writtenBytes) {
      f.hasRates = true;
      f.readBytesPerS = static_cast<double>(c->readBytes - d.readBytes) / (now - d.time);
      f.writeBytesPerS = static_cast<double>(c->writtenBytes - d.writtenBytes) / (now - d.time);
    }
    d.known = true;
    d.time = now;
    d.readBytes = c->readBytes;
    d.writtenBytes = c->writtenBytes;
  }
}

}  // namespace dtrain::launcher::monitor
