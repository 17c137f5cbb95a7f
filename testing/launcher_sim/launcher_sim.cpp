#include "launcher_sim.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "child_env.h"
#include "free_port.h"

namespace dtrain::sim {

double monotonicSeconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// --- Fleet ---------------------------------------------------------------------------------------

Fleet::~Fleet() {
  for (auto& m : members_) {
    if (!m->exited) ::kill(-m->pid, SIGKILL);
  }
  for (auto& m : members_) {
    if (!m->exited) ::waitpid(m->pid, nullptr, 0);
    if (m->outFd >= 0) ::close(m->outFd);
    if (m->errFd >= 0) ::close(m->errFd);
  }
}

int Fleet::spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  std::vector<std::string> envStrings = dtrain::testing::childEnvironment(env);
  std::vector<char*> args;
  std::vector<char*> envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (auto& e : envStrings) envp.push_back(e.data());
  envp.push_back(nullptr);
  int out[2];
  int err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    const int nul = ::open("/dev/null", O_RDONLY);
    ::dup2(nul, STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  auto m = std::make_unique<Member>();
  m->pid = pid;
  m->outFd = out[0];
  m->errFd = err[0];
  ::fcntl(out[0], F_SETFL, O_NONBLOCK);
  ::fcntl(err[0], F_SETFL, O_NONBLOCK);
  members_.push_back(std::move(m));
  return static_cast<int>(members_.size()) - 1;
}

void Fleet::take(Member& m, int stream, const char* data, size_t n, double at) {
  std::string& partial = m.partial[stream];
  partial.append(data, n);
  size_t start = 0;
  for (size_t nl = partial.find('\n'); nl != std::string::npos; nl = partial.find('\n', start)) {
    m.lines.push_back({at, partial.substr(start, nl - start)});
    start = nl + 1;
  }
  partial.erase(0, start);
}

void Fleet::pump(int ms) {
  std::vector<pollfd> fds;
  std::vector<std::pair<size_t, int>> owners;  // member, stream
  for (size_t i = 0; i < members_.size(); ++i) {
    for (int stream = 0; stream < 2; ++stream) {
      const int fd = stream == 0 ? members_[i]->outFd : members_[i]->errFd;
      if (fd < 0) continue;
      fds.push_back({fd, POLLIN, 0});
      owners.emplace_back(i, stream);
    }
  }
  if (fds.empty()) {
    ::usleep(static_cast<useconds_t>(ms) * 1000);
    return;
  }
  if (::poll(fds.data(), fds.size(), ms) <= 0) return;
  const double at = monotonicSeconds();
  char buf[65536];
  for (size_t k = 0; k < fds.size(); ++k) {
    if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    Member& m = *members_[owners[k].first];
    int& fd = owners[k].second == 0 ? m.outFd : m.errFd;
    while (true) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n > 0) {
        take(m, owners[k].second, buf, static_cast<size_t>(n), at);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
      ::close(fd);  // end of the stream
      fd = -1;
      break;
    }
    if (m.outFd < 0 && m.errFd < 0 && !m.exited) {
      rusage usage{};
      ::wait4(m.pid, &m.status, 0, &usage);
      m.exited = true;
      m.exitedAt = monotonicSeconds();
      m.cpuSeconds = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                     static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
      m.maxRssBytes = static_cast<uint64_t>(usage.ru_maxrss) * 1024;
    }
  }
}

bool Fleet::pumpUntil(const std::function<bool()>& done, double seconds) {
  const double deadline = monotonicSeconds() + seconds;
  while (!done()) {
    const double left = deadline - monotonicSeconds();
    if (left <= 0) return false;
    pump(static_cast<int>(std::min(left, 0.1) * 1000) + 1);
  }
  return true;
}

void Fleet::signal(int member, int signo) {
  ::kill(members_[static_cast<size_t>(member)]->pid, signo);
}

bool Fleet::allExited() const {
  return std::all_of(members_.begin(), members_.end(), [](const auto& m) { return m->exited; });
}

int Fleet::exitCode(int i) const {
  const Member& m = member(i);
  if (!m.exited) return -1;
  return WIFEXITED(m.status) ? WEXITSTATUS(m.status) : 128 + WTERMSIG(m.status);
}

std::vector<Fleet::Line> Fleet::linesWith(int i, const std::string& needle) const {
  std::vector<Line> out;
  for (const auto& l : member(i).lines) {
    if (l.text.find(needle) != std::string::npos) out.push_back(l);
  }
  return out;
}

std::string Fleet::text(int i, size_t maxBytes) const {
  std::string out;
  for (const auto& l : member(i).lines) out += l.text + "\n";
  return out.size() > maxBytes ? "..." + out.substr(out.size() - maxBytes) : out;
}

double timeIn(const std::string& line) {
  const size_t at = line.find(" t=");
  if (at == std::string::npos) return -1;
  return std::strtod(line.c_str() + at + 3, nullptr);
}

// --- /proc ---------------------------------------------------------------------------------------

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// utime + stime of a /proc/.../stat line, in seconds; -1 when unreadable.
double statCpuSeconds(const std::string& stat) {
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(stat.substr(close + 2));
  std::string f;
  double utime = 0, stime = 0;
  // After the command: state(3) ... utime is field 14, stime 15 (1-based over the whole line).
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14) utime = std::strtod(f.c_str(), nullptr);
    if (i == 15) stime = std::strtod(f.c_str(), nullptr);
  }
  return (utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

std::vector<pid_t> childrenOf(pid_t pid) {
  std::vector<pid_t> out;
  DIR* d = ::opendir(fmt::format("/proc/{}/task", pid).c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::istringstream in(slurp(fmt::format("/proc/{}/task/{}/children", pid, e->d_name)));
    for (pid_t c; in >> c;) out.push_back(c);
  }
  ::closedir(d);
  return out;
}

}  // namespace

// The process's CPU clock (every thread, the exited ones too; nanoseconds), not /proc's 10 ms
// ticks: an idle agent uses about 2 ms in the scale benchmark's 15 s window, and 256 of them read
// in ticks summed to 0.0-0.2 % of a core where their clocks said 3.4-4.1 %.
double processCpuSeconds(pid_t pid) {
  clockid_t clock;
  timespec t{};
  if (::clock_getcpuclockid(pid, &clock) != 0 || ::clock_gettime(clock, &t) != 0) return -1;
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

std::map<std::string, double> threadCpuSeconds(pid_t pid) {
  std::map<std::string, double> out;
  DIR* d = ::opendir(fmt::format("/proc/{}/task", pid).c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::string name = slurp(fmt::format("/proc/{}/task/{}/comm", pid, e->d_name));
    while (!name.empty() && name.back() == '\n') name.pop_back();
    // schedstat's first field: nanoseconds on a CPU (another process's thread clocks cannot be
    // read with clock_gettime); the stat line's ticks where it is missing.
    const std::string task = fmt::format("/proc/{}/task/{}/", pid, e->d_name);
    const std::string schedstat = slurp(task + "schedstat");
    const double cpu = !schedstat.empty() ? std::strtod(schedstat.c_str(), nullptr) * 1e-9
                                          : statCpuSeconds(slurp(task + "stat"));
    if (cpu >= 0) out[name] += cpu;
  }
  ::closedir(d);
  return out;
}

uint64_t residentBytes(pid_t pid) {
  std::istringstream in(slurp(fmt::format("/proc/{}/statm", pid)));
  uint64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

void treeUsage(pid_t pid, double* cpuSeconds, uint64_t* resident) {
  const double cpu = processCpuSeconds(pid);
  if (cpu > 0) *cpuSeconds += cpu;
  *resident += residentBytes(pid);
  for (pid_t c : childrenOf(pid)) treeUsage(c, cpuSeconds, resident);
}

// --- LaunchSim -----------------------------------------------------------------------------------

LaunchSim::LaunchSim(LaunchSimOptions options) : options_(std::move(options)) {
  port_ = testing::freePortOn("127.0.0.1");
}

std::vector<std::string> LaunchSim::agentArgv(int node) const {
  const int minNodes = options_.minNodes > 0 ? options_.minNodes : options_.nodes;
  const std::string nnodes = minNodes == options_.nodes
                                 ? std::to_string(options_.nodes)
                                 : fmt::format("{}:{}", minNodes, options_.nodes);
  std::vector<std::string> argv{options_.launch,
                                "--nnodes",
                                nnodes,
                                "--node-rank",
                                std::to_string(node),
                                "--rdzv-endpoint",
                                fmt::format("127.0.0.1:{}", port_),
                                "--nproc-per-node",
                                "1",
                                "--heartbeat-interval",
                                fmt::format("{:g}", options_.heartbeatInterval),
                                "--heartbeat-timeout",
                                fmt::format("{:g}", options_.heartbeatTimeout),
                                "--grace-period",
                                fmt::format("{:g}", options_.gracePeriod),
                                "--rdzv-timeout",
                                fmt::format("{:g}", options_.rdzvTimeout),
                                "--max-restarts",
                                std::to_string(options_.maxRestarts),
                                options_.worker,
                                "--no-store",
                                "--progress",
                                "--quiet",
                                "--on-sigterm",
                                "75",
                                "--steps",
                                std::to_string(options_.workerSteps),
                                "--step-ms",
                                "1000"};
  if (options_.restartSteps >= 0) {
    argv.insert(argv.end(), {"--restart-steps", std::to_string(options_.restartSteps)});
  }
  return argv;
}

void LaunchSim::start() {
  const std::vector<std::string> env{"DTRAIN_VERBOSE=1", "DTRAIN_STORE_TOKEN=" + options_.token};
  for (int node = 0; node < options_.nodes; ++node) fleet_.spawn(agentArgv(node), env);
  startedAt_ = monotonicSeconds();
}

namespace {

// Times of member lines with `needle` (one per member: the first), -1 where none.
std::vector<double> timesOf(const Fleet& fleet, const std::string& needle) {
  std::vector<double> out(fleet.size(), -1);
  for (size_t i = 0; i < fleet.size(); ++i) {
    for (const auto& l : fleet.member(static_cast<int>(i)).lines) {
      if (l.text.find(needle) == std::string::npos) continue;
      out[i] = timeIn(l.text);
      break;
    }
  }
  return out;
}

}  // namespace

std::vector<double> LaunchSim::joined(int round) const {
  return timesOf(fleet_, fmt::format("round {}: joined at", round));
}

std::vector<double> LaunchSim::planned(int round) const {
  return timesOf(fleet_, fmt::format("round {}: plan read at", round));
}

std::vector<double> LaunchSim::workerStarted(int round) const {
  return timesOf(fleet_, fmt::format(": started attempt={} ", round));
}

std::vector<double> LaunchSim::workerDone(int round) const {
  return timesOf(fleet_, fmt::format(": done attempt={} ", round));
}

double LaunchSim::workerStopped(int node) const {
  for (const auto& l : fleet_.member(node).lines) {
    if (l.text.find("SIGTERM: checkpointing") == std::string::npos) continue;
    // "... (t=123.456)"
    const size_t at = l.text.find("(t=");
    return at == std::string::npos ? l.at : std::strtod(l.text.c_str() + at + 3, nullptr);
  }
  return -1;
}

std::vector<StoreCount> LaunchSim::storeCounts() const {
  static const std::regex re(
      "store requests so far \\(([^)]*)\\) at t=([0-9.]+): [0-9]+ \\(heartbeats ([0-9]+), "
      "monitoring ([0-9]+), the rest ([0-9]+)\\)");
  std::vector<StoreCount> out;
  if (fleet_.size() == 0) return out;
  for (const auto& l : fleet_.member(0).lines) {
    std::smatch m;
    if (!std::regex_search(l.text, m, re)) continue;
    StoreCount c;
    c.when = m[1];
    c.at = std::stod(m[2]);
    c.heartbeats = std::stoull(m[3]);
    c.monitoring = std::stoull(m[4]);
    c.rest = std::stoull(m[5]);
    out.push_back(c);
  }
  return out;
}

double LaunchSim::masterSaid(const std::string& needle) const {
  if (fleet_.size() == 0) return -1;
  auto lines = fleet_.linesWith(0, needle);
  return lines.empty() ? -1 : lines.front().at;
}

int LaunchSim::count(const std::vector<double>& times) {
  return static_cast<int>(
      std::count_if(times.begin(), times.end(), [](double t) { return t >= 0; }));
}

double LaunchSim::latest(const std::vector<double>& times) {
  double out = -1;
  for (double t : times) out = std::max(out, t);
  return out;
}

}  // namespace dtrain::sim
