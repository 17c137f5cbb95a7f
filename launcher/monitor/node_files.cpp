#include "launcher/monitor/node_files.h"

#include <algorithm>
#include <charconv>
#include <cstring>

#include "launcher/monitor/proc_files.h"

namespace dtrain::launcher::monitor {

namespace {

// Names unlike those of the other monitor files: a unity build compiles them together.

// The next token separated by spaces or tabs, from `at`, advancing `at`.
std::string_view procToken(std::string_view text, size_t& at) {
  while (at < text.size() && (text[at] == ' ' || text[at] == '\t')) ++at;
  const size_t start = at;
  while (at < text.size() && text[at] != ' ' && text[at] != '\t') ++at;
  return text.substr(start, at - start);
}

template <typename T>
bool procNumber(std::string_view s, T& out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size() && !s.empty();
}

template <typename Fn>
void forEachProcLine(std::string_view text, Fn fn) {
  size_t at = 0;
  while (at < text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string_view::npos) nl = text.size();
    if (nl > at) fn(text.substr(at, nl - at));
    at = nl + 1;
  }
}

// Whether `mountPoint` is `path` or a directory above it.
bool mountHolds(std::string_view mountPoint, std::string_view path) {
  if (mountPoint == "/") return !path.empty() && path.front() == '/';
  if (path.size() < mountPoint.size() || path.compare(0, mountPoint.size(), mountPoint) != 0) {
    return false;
  }
  return path.size() == mountPoint.size() || path[mountPoint.size()] == '/';
}

}  // namespace

void parseNetDev(std::string_view text, std::vector<NetDevCounters>& out) {
  out.clear();
  forEachProcLine(text, [&](std::string_view line) {
    // "  eth0: 112954662  168159 0 0 0 0 0 0 8041329 60105 0 0 0 0 0 0"
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) return;
    size_t start = 0;
    while (start < colon && line[start] == ' ') ++start;
    std::string_view name = line.substr(start, colon - start);
    if (name.empty() || name.size() >= sizeof(NetDevCounters::name) ||
        name.find_first_of(" |") != std::string_view::npos) {
      return;
    }
    uint64_t v[16];
    size_t at = colon + 1;
    for (uint64_t& value : v) {
      if (!procNumber(procToken(line, at), value)) return;
    }
    NetDevCounters& c = out.emplace_back();
    std::memcpy(c.name, name.data(), name.size());
    c.name[name.size()] = '\0';
    // Receive: bytes packets errs drop fifo frame compressed multicast; transmit: bytes packets
    // errs drop fifo colls carrier compressed.
    c.rxBytes = v[0];
    c.rxErrors = v[2];
    c.rxDrops = v[3];
    c.txBytes = v[8];
    c.txErrors = v[10];
    c.txDrops = v[11];
  });
}

std::optional<DiskCounters> findDiskStats(std::string_view text, unsigned major, unsigned minor,
                                          std::string_view name) {
  std::optional<DiskCounters> byName;
  std::optional<DiskCounters> byNumber;
  forEachProcLine(text, [&](std::string_view line) {
    if (byNumber) return;
    // "major minor name reads merged sectors_read ms writes merged sectors_written ms ..."
    size_t at = 0;
    DiskCounters d;
    if (!procNumber(procToken(line, at), d.major) || !procNumber(procToken(line, at), d.minor)) {
      return;
    }
    const std::string_view device = procToken(line, at);
    const bool numberMatches = d.major == major && d.minor == minor;
    if (!numberMatches && (name.empty() || device != name)) return;
    uint64_t v[7];
    for (uint64_t& value : v) {
      if (!procNumber(procToken(line, at), value)) return;
    }
    d.readBytes = v[2] * 512;
    d.writtenBytes = v[6] * 512;
    (numberMatches ? byNumber : byName) = d;
  });
  return byNumber ? byNumber : byName;
}

std::optional<uint64_t> parseContextSwitches(std::string_view text) {
  std::optional<uint64_t> out;
  forEachProcLine(text, [&](std::string_view line) {
    if (out || line.compare(0, 5, "ctxt ") != 0) return;
    size_t at = 5;
    uint64_t v = 0;
    if (procNumber(procToken(line, at), v)) out = v;
  });
  return out;
}

std::optional<MountPoint> findMount(std::string_view mountinfo, std::string_view path,
                                    unsigned major, unsigned minor) {
  std::optional<MountPoint> best;
  forEachProcLine(mountinfo, [&](std::string_view line) {
    // "id parent major:minor root mountpoint options [optional...] - fstype source superopts"
    const size_t dash = line.find(" - ");
    if (dash == std::string_view::npos) return;
    size_t at = 0;
    procToken(line, at);  // id
    procToken(line, at);  // parent
    const std::string_view device = procToken(line, at);
    procToken(line, at);  // root within the filesystem
    const std::string_view point = procToken(line, at);
    const size_t colon = device.find(':');
    MountPoint m;
    if (colon == std::string_view::npos || !procNumber(device.substr(0, colon), m.major) ||
        !procNumber(device.substr(colon + 1), m.minor) || m.major != major || m.minor != minor) {
      return;
    }
    m.mountPoint = unescapeMountField(point);
    if (!mountHolds(m.mountPoint, path)) return;
    if (best && best->mountPoint.size() > m.mountPoint.size()) return;
    size_t after = dash + 3;
    m.fsType = std::string(procToken(line, after));
    m.source = unescapeMountField(procToken(line, after));
    best = std::move(m);  // a later mount at the same place covers an earlier one
  });
  return best;
}

}  // namespace dtrain::launcher::monitor
