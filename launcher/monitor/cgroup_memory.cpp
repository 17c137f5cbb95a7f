#include "launcher/monitor/cgroup_memory.h"

#include <algorithm>
#include <charconv>
#include <vector>

namespace dtrain::launcher::monitor {

namespace {

std::vector<std::string_view> splitLines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t at = 0;
  while (at < text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string_view::npos) nl = text.size();
    if (nl > at) lines.push_back(text.substr(at, nl - at));
    at = nl + 1;
  }
  return lines;
}

std::vector<std::string_view> splitFields(std::string_view line, char sep) {
  std::vector<std::string_view> fields;
  size_t at = 0;
  while (at <= line.size()) {
    size_t end = line.find(sep, at);
    if (end == std::string_view::npos) end = line.size();
    fields.push_back(line.substr(at, end - at));
    at = end + 1;
  }
  return fields;
}

bool hasOption(std::string_view options, std::string_view name) {
  for (std::string_view o : splitFields(options, ',')) {
    if (o == name) return true;
  }
  return false;
}

// The directory of cgroup `path` in a hierarchy mounted at `mountPoint` whose root is `root`.
std::optional<std::string> joinCgroupPath(const std::string& mountPoint, const std::string& root,
                                          const std::string& path) {
  std::string relative = path;
  if (root != "/") {
    if (path.compare(0, root.size(), root) != 0) return std::nullopt;  // outside this mount
    relative = path.substr(root.size());
  }
  if (relative == "/") relative.clear();
  return mountPoint + relative;
}

int64_t parseLimit(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  if (text == "max") return -1;
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return -1;
  return v >= kNoCgroupLimit ? -1 : v;
}

std::optional<int64_t> parseCount(std::optional<std::string_view> text) {
  if (!text) return std::nullopt;
  std::string_view t = *text;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.remove_suffix(1);
  int64_t v = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (ec != std::errc() || end != t.data() + t.size()) return std::nullopt;
  return v;
}

}  // namespace

CgroupLocation locateMemoryCgroup(std::string_view procSelfCgroup, std::string_view mountinfo) {
  std::string v1Path;
  std::string v2Path;
  bool haveV1 = false;
  bool haveV2 = false;
  for (std::string_view line : splitLines(procSelfCgroup)) {
    auto fields = splitFields(line, ':');
    if (fields.size() < 3) continue;
    // The path may itself contain ':'; rejoin the rest.
    std::string path(line.substr(fields[0].size() + fields[1].size() + 2));
    if (fields[0] == "0" && fields[1].empty()) {
      v2Path = path;
      haveV2 = true;
    } else if (hasOption(fields[1], "memory")) {
      v1Path = path;
      haveV1 = true;
    }
  }
  CgroupLocation v1;
  CgroupLocation v2;
  for (std::string_view line : splitLines(mountinfo)) {
    // "id parent major:minor root mountpoint options [optional...] - fstype source superopts"
    size_t dash = line.find(" - ");
    if (dash == std::string_view::npos) continue;
    auto before = splitFields(line.substr(0, dash), ' ');
    auto after = splitFields(line.substr(dash + 3), ' ');
    if (before.size() < 5 || after.size() < 3) continue;
    const std::string root = unescapeMountField(before[3]);
    const std::string mountPoint = unescapeMountField(before[4]);
    if (after[0] == "cgroup" && haveV1 && v1.version == 0 && hasOption(after[2], "memory")) {
      if (auto dir = joinCgroupPath(mountPoint, root, v1Path)) {
        v1.version = 1;
        v1.dir = *dir;
        v1.mountDir = mountPoint;
      }
    } else if (after[0] == "cgroup2" && haveV2 && v2.version == 0) {
      if (auto dir = joinCgroupPath(mountPoint, root, v2Path)) {
        v2.version = 2;
        v2.dir = *dir;
        v2.mountDir = mountPoint;
      }
    }
  }
  return v1.version != 0 ? v1 : v2;
}

CgroupMemoryReader::CgroupMemoryReader(CgroupLocation location, int rescanEvery)
    : location_(std::move(location)), rescanEvery_(std::max(1, rescanEvery)) {}

void CgroupMemoryReader::findLimit(FileReader& reader) {
  limitDir_.clear();
  limitBytes_ = -1;
  if (location_.version != 2) return;
  // The smallest memory.max from the cgroup up to (not including) the root, which has none.
  std::string dir = location_.dir;
  while (dir.size() > location_.mountDir.size()) {
    if (auto text = reader.read(dir + "/memory.max")) {
      int64_t limit = parseLimit(*text);
      if (limit >= 0 && (limitBytes_ < 0 || limit < limitBytes_)) {
        limitBytes_ = limit;
        limitDir_ = dir;
      }
    }
    size_t slash = dir.find_last_of('/');
    if (slash == std::string::npos) break;
    dir.resize(slash);
  }
}

std::optional<CgroupMemory> CgroupMemoryReader::read(FileReader& reader) {
  if (location_.version == 0) return std::nullopt;
  CgroupMemory m;
  if (location_.version == 1) {
    auto usage = parseCount(reader.read(location_.dir + "/memory.usage_in_bytes"));
    if (!usage) return std::nullopt;
    m.usageBytes = *usage;
    if (auto stat = reader.read(location_.dir + "/memory.stat")) {
      int64_t limit = findKeyedValue(*stat, "hierarchical_memory_limit", ' ');
      m.limitBytes = limit >= kNoCgroupLimit ? -1 : limit;
      m.inactiveFileBytes = std::max<int64_t>(0, findKeyedValue(*stat, "total_inactive_file", ' '));
    }
    m.limitDir = location_.dir;
    return m;
  }
  if (readsUntilRescan_-- <= 0) {
    findLimit(reader);
    readsUntilRescan_ = rescanEvery_ - 1;
  }
  // The limit's cgroup is charged for everything below it, launch's cgroup included.
  const std::string& dir = limitDir_.empty() ? location_.dir : limitDir_;
  auto usage = parseCount(reader.read(dir + "/memory.current"));
  if (!usage) return std::nullopt;
  m.usageBytes = *usage;
  m.limitBytes = limitBytes_;
  m.limitDir = dir;
  if (auto stat = reader.read(dir + "/memory.stat")) {
    m.inactiveFileBytes = std::max<int64_t>(0, findKeyedValue(*stat, "inactive_file", ' '));
  }
  return m;
}

CgroupLocation locateOwnMemoryCgroup() {
  FileReader reader(256 * 1024);
  auto cgroup = reader.read("/proc/self/cgroup");
  std::string cgroupText = cgroup ? std::string(*cgroup) : "";
  auto mounts = reader.read("/proc/self/mountinfo");
  return locateMemoryCgroup(cgroupText, mounts ? *mounts : std::string_view());
}

}  // namespace dtrain::launcher::monitor
