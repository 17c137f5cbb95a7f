#include "launcher/monitor/process_sampler.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include <fmt/format.h>

#include "launcher/dirents.h"

namespace dtrain::launcher::monitor {

namespace {

// At most this many descendants of one worker are sampled.
constexpr size_t kMaxDescendants = 4096;

}  // namespace

std::optional<double> NodeSample::memUsedFraction() const {
  std::optional<double> fraction;
  if (mem.totalBytes > 0 && mem.availableBytes >= 0) {
    fraction = 1.0 - static_cast<double>(mem.availableBytes) / static_cast<double>(mem.totalBytes);
  }
  if (cgroup && cgroup->limitBytes > 0 && cgroup->workingSetBytes() >= 0) {
    double f = static_cast<double>(cgroup->workingSetBytes()) /
               static_cast<double>(cgroup->limitBytes);
    if (!fraction || f > *fraction) fraction = f;
  }
  return fraction;
}

std::optional<int64_t> NodeSample::memHeadroomBytes() const {
  std::optional<int64_t> headroom;
  if (mem.availableBytes >= 0) headroom = mem.availableBytes;
  if (cgroup && cgroup->limitBytes > 0 && cgroup->workingSetBytes() >= 0) {
    int64_t h = std::max<int64_t>(0, cgroup->limitBytes - cgroup->workingSetBytes());
    if (!headroom || h < *headroom) headroom = h;
  }
  return headroom;
}

std::string NodeSample::describeMemory() const {
  std::string machine;
  double machineFraction = -1;
  if (mem.totalBytes > 0 && mem.availableBytes >= 0) {
    machineFraction = 1.0 -
                      static_cast<double>(mem.availableBytes) / static_cast<double>(mem.totalBytes);
    machine = fmt::format("machine: {} of {} in use",
                          formatBytes(mem.totalBytes - mem.availableBytes),
                          formatBytes(mem.totalBytes));
  }
  if (cgroup && cgroup->limitBytes > 0) {
    double f = static_cast<double>(cgroup->workingSetBytes()) /
               static_cast<double>(cgroup->limitBytes);
    if (f >= machineFraction) {
      return fmt::format("memory cgroup {}: {} of its {} limit in use", cgroup->limitDir,
                         formatBytes(cgroup->workingSetBytes()), formatBytes(cgroup->limitBytes));
    }
  }
  return machine.empty() ? "memory use unknown" : machine;
}

std::string formatBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (std::abs(b) >= 1024.0 * 1024 * 1024)
    return fmt::format("{:.1f} GiB", b / (1024.0 * 1024 * 1024));
  if (std::abs(b) >= 1024.0 * 1024) return fmt::format("{:.0f} MiB", b / (1024.0 * 1024));
  if (std::abs(b) >= 1024.0) return fmt::format("{:.0f} KiB", b / 1024.0);
  return fmt::format("{} B", bytes);
}

std::vector<pid_t> descendantsOf(pid_t root, const std::multimap<pid_t, pid_t>& children) {
  std::vector<pid_t> out;
  std::vector<pid_t> frontier{root};
  while (!frontier.empty() && out.size() < kMaxDescendants) {
    pid_t p = frontier.back();
    frontier.pop_back();
    auto [from, to] = children.equal_range(p);
    for (auto it = from; it != to; ++it) {
      out.push_back(it->second);
      frontier.push_back(it->second);
    }
  }
  return out;
}

ProcessSampler::ProcessSampler(CgroupLocation cgroup, int discoverEvery, bool childrenLists)
    : cgroup_(std::move(cgroup)),
      discoverEvery_(std::max(1, discoverEvery)),
      childrenLists_(childrenLists && ::access("/proc/thread-self/children", R_OK) == 0),
      ticksPerSecond_(static_cast<double>(std::max(1L, ::sysconf(_SC_CLK_TCK)))),
      pageBytes_(std::max(1L, ::sysconf(_SC_PAGESIZE))) {
  path_.reserve(64);
}

void ProcessSampler::setWorkers(std::vector<WorkerProcess> workers) {
  std::vector<RankState> next;
  for (const auto& w : workers) {
    auto same = std::find_if(ranks_.begin(), ranks_.end(), [&](const RankState& r) {
      return r.worker.rank == w.rank && r.worker.pid == w.pid;
    });
    if (same != ranks_.end()) {
      next.push_back(std::move(*same));
    } else {
      RankState r;
      r.worker = w;
      next.push_back(std::move(r));
    }
  }
  ranks_ = std::move(next);
  samplesUntilDiscover_ = 0;  // new processes: look for their children at the next sample
}

void ProcessSampler::walkChildren(pid_t root, std::vector<pid_t>* out) {
  out->clear();
  frontier_.assign(1, root);
  while (!frontier_.empty() && out->size() < kMaxDescendants) {
    const pid_t p = frontier_.back();
    frontier_.pop_back();
    char pidText[16];
    auto [pidEnd, pidEc] = std::to_chars(pidText, pidText + sizeof pidText, p);
    (void)pidEc;
    path_.assign("/proc/").append(pidText, pidEnd).append("/task");
    // getdents64 into a reused buffer: opendir would allocate one per call.
    const int tasks = ::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (tasks < 0) continue;  // it ended meanwhile
    const size_t taskDir = path_.size();
    auto readChildren = [&](const char* tid) {
      if (tid[0] < '1' || tid[0] > '9') return;
      path_.resize(taskDir);
      path_.append("/").append(tid).append("/children");
      auto text = reader_.read(path_.c_str());
      if (!text) return;  // the thread ended meanwhile
      // "123 456 " -- the thread's children, each followed by a space.
      const char* at = text->data();
      const char* end = at + text->size();
      while (at < end) {
        pid_t child = 0;
        auto [next, ec] = std::from_chars(at, end, child);
        if (ec != std::errc{}) {
          ++at;
          continue;
        }
        out->push_back(child);
        frontier_.push_back(child);
        at = next;
      }
    };
    while (readDirents(tasks, direntBuffer_, sizeof direntBuffer_, readChildren) > 0) {
    }
    ::close(tasks);
  }
}

void ProcessSampler::discover() {
  if (childrenLists_) {
    for (auto& r : ranks_) walkChildren(r.worker.pid, &r.descendants);
    return;
  }
  std::multimap<pid_t, pid_t> children;
  DIR* dir = ::opendir("/proc");
  if (dir == nullptr) return;
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    path_.assign("/proc/").append(e->d_name).append("/stat");
    auto text = reader_.read(path_.c_str());
    if (!text) continue;
    auto stat = parseProcStat(*text);
    if (stat && stat->ppid > 0)
      children.emplace(stat->ppid, static_cast<pid_t>(std::atoi(e->d_name)));
  }
  ::closedir(dir);
  for (auto& r : ranks_) r.descendants = descendantsOf(r.worker.pid, children);
}

bool ProcessSampler::sampleProcess(pid_t pid, RankState& rank, double now, RankSample& out,
                                   bool isWorker) {
  char base[32];
  auto [end, ec] = std::to_chars(base, base + sizeof base, pid);
  (void)ec;
  const std::string_view pidText(base, static_cast<size_t>(end - base));
  auto pathOf = [&](const char* file) -> const char* {
    path_.assign("/proc/").append(pidText).append("/").append(file);
    return path_.c_str();
  };
  auto statText = reader_.read(pathOf("stat"));
  if (!statText) return false;
  auto stat = parseProcStat(*statText);
  if (!stat || stat->state == 'Z') return false;
  auto it = rank.seen.find(pid);
  if (it != rank.seen.end() && it->second.startTicks != stat->startTicks) {
    rank.seen.erase(it);  // the pid now names another process
    if (!isWorker) return false;
    it = rank.seen.end();
  }
  PidState now_{};
  now_.startTicks = stat->startTicks;
  now_.cpuTicks = stat->cpuTicks;
  now_.time = now;
  int64_t rss = stat->rssPages * pageBytes_;
  int64_t threads = stat->threads;
  if (isWorker) {
    if (auto status = reader_.read(pathOf("status"))) {
      ProcStatus s = parseProcStatus(*status);
      if (s.rssBytes >= 0) rss = s.rssBytes;
      if (s.peakRssBytes > out.peakRssBytes) out.peakRssBytes = s.peakRssBytes;
    }
  }
  if (auto io = reader_.read(pathOf("io"))) {
    ProcIo p = parseProcIo(*io);
    now_.readBytes = p.readBytes;
    now_.writeBytes = p.writeBytes;
  }
  if (it != rank.seen.end() && now > it->second.time) {
    const double ticks = static_cast<double>(now_.cpuTicks -
                                             std::min(now_.cpuTicks, it->second.cpuTicks));
    const double percent = 100.0 * ticks / ticksPerSecond_ / (now - it->second.time);
    out.cpuPercent = std::max(0.0, out.cpuPercent) + percent;
  }
  out.rssBytes += rss;
  out.threads += threads;
  out.processes += 1;
  if (now_.readBytes >= 0) out.readBytes = std::max<int64_t>(0, out.readBytes) + now_.readBytes;
  if (now_.writeBytes >= 0) out.writeBytes = std::max<int64_t>(0, out.writeBytes) + now_.writeBytes;
  out.pids.push_back(pid);
  rank.seen[pid] = now_;
  return true;
}

std::vector<RankSample> ProcessSampler::sampleWorkers(double now) {
  if (ranks_.empty()) return {};
  if (childrenLists_ || samplesUntilDiscover_-- <= 0) {
    discover();
    samplesUntilDiscover_ = discoverEvery_ - 1;
  }
  std::vector<RankSample> out;
  out.reserve(ranks_.size());
  for (auto& r : ranks_) {
    RankSample s;
    s.rank = r.worker.rank;
    s.localRank = r.worker.localRank;
    s.pid = r.worker.pid;
    if (!sampleProcess(r.worker.pid, r, now, s, /*isWorker=*/true)) continue;  // it ended
    for (pid_t d : r.descendants) sampleProcess(d, r, now, s, /*isWorker=*/false);
    // Processes seen before and gone now: keep their I/O so the counters never go back.
    for (auto it = r.seen.begin(); it != r.seen.end();) {
      if (std::find(s.pids.begin(), s.pids.end(), it->first) == s.pids.end()) {
        r.departedRead += std::max<int64_t>(0, it->second.readBytes);
        r.departedWrite += std::max<int64_t>(0, it->second.writeBytes);
        it = r.seen.erase(it);
      } else {
        ++it;
      }
    }
    if (s.readBytes >= 0) s.readBytes += r.departedRead;
    if (s.writeBytes >= 0) s.writeBytes += r.departedWrite;
    r.peakTree = std::max(r.peakTree, s.rssBytes);
    s.peakRssBytes = std::max(s.peakRssBytes, r.peakTree);
    out.push_back(std::move(s));
  }
  return out;
}

NodeSample ProcessSampler::sampleMemory() {
  NodeSample n;
  if (auto text = reader_.read("/proc/meminfo")) n.mem = parseMemInfo(*text);
  n.cgroup = cgroup_.read(reader_);
  return n;
}

NodeSample ProcessSampler::sampleNode() {
  NodeSample n = sampleMemory();
  if (auto text = reader_.read("/proc/loadavg")) n.load1 = parseLoadAvg(*text);
  return n;
}

}  // namespace dtrain::launcher::monitor
