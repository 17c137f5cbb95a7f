// ft_bench's plumbing: the simulated cluster (scripts/netns-cluster.sh) and one launch job on it,
// its lines read as they come and a node lost on cue.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "bench_run.h"
#include "free_port.h"
#include "ft_bench.h"

namespace dtrain::bench {

namespace {

// The output of `sh -c command`, stderr too (bench_run.h's shellOut).
std::string shell(const std::string& command, int* rc = nullptr) {
  return shellOut(command + " 2>&1", rc);
}

std::vector<pid_t> namespacePids(const std::string& ns) {
  std::vector<pid_t> pids;
  std::istringstream in(shell("ip netns pids " + ns));
  for (pid_t p; in >> p;) pids.push_back(p);
  return pids;
}

// Splits complete lines off `buffer` into `run`, stamped `now`.
void takeLines(std::string& buffer, bool err, double now, JobRun& run) {
  for (size_t nl = buffer.find('\n'); nl != std::string::npos; nl = buffer.find('\n')) {
    run.lines.push_back({now, err, buffer.substr(0, nl)});
    buffer.erase(0, nl + 1);
  }
}

}  // namespace

const char* lossName(Loss loss) {
  switch (loss) {
    case Loss::kNone: return "none";
    case Loss::kKill: return "SIGKILL";
    case Loss::kDrop: return "dropped";
    case Loss::kJoin: return "join";
  }
  return "?";
}

SimCluster::SimCluster(std::string script, std::string name, int nodes)
    : script_(std::move(script)), name_(std::move(name)), nodes_(nodes) {}

SimCluster::~SimCluster() { down(); }

void SimCluster::up() {
  int rc = 0;
  const std::string out = shell(fmt::format("{} up {} {}", script_, nodes_, name_), &rc);
  if (rc != 0) {
    shell(fmt::format("{} down {}", script_, name_));
    throw std::runtime_error("netns-cluster.sh up failed: " + out);
  }
  isUp_ = true;
  const std::string dir = out.substr(out.rfind('\n') + 1);
  std::ifstream hosts(dir + "/hosts");
  std::vector<std::string> list;
  hostList_.clear();
  for (std::string h; std::getline(hosts, h);) {
    if (h.empty()) continue;
    list.push_back(h);
    hostList_ += (hostList_.empty() ? "" : ",") + h;
  }
  if (static_cast<int>(list.size()) != nodes_)
    throw std::runtime_error("netns-cluster.sh up: no hosts in " + dir);
  stateDir_ = dir;
  sshConfig_ = dir + "/ssh_config";
  workDir_ = dir + "/work";
  const std::string bridge = list[0].substr(0, list[0].rfind('.')) + ".254";
  // Not 29400: another job on a shared machine may hold it on every address.
  endpoint_ = bridge + ":" + std::to_string(testing::freePortOn(bridge));
}

void SimCluster::down() {
  if (!isUp_) return;
  shell(fmt::format("{} down {}", script_, name_));
  isUp_ = false;
}

std::vector<std::string> SimCluster::onHost(int k, std::vector<std::string> argv) const {
  std::vector<std::string> out = {script_, "exec", name_, std::to_string(k)};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

Background startBackground(const std::vector<std::string>& argv, const std::string& log) {
  Background b;
  b.log = log;
  b.pid = ::fork();
  if (b.pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  if (b.pid < 0) throw std::runtime_error("fork failed");
  return b;
}

int finish(Background& b, double seconds) {
  if (b.pid <= 0) return -1;
  const double deadline = wallNow() + seconds;
  int status = 0;
  while (::waitpid(b.pid, &status, WNOHANG) == 0) {
    if (wallNow() > deadline) {
      ::kill(b.pid, SIGKILL);
      ::waitpid(b.pid, &status, 0);
      b.pid = -1;
      return -1;
    }
    ::usleep(20000);
  }
  b.pid = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

double SimCluster::lose(int k, Loss loss) const {
  const std::string ns = fmt::format("{}-{}", name_, k);
  if (loss == Loss::kKill) {
    // The pids first, so that the kills follow each other within microseconds; a second pass
    // for anything forked meanwhile.
    const std::vector<pid_t> pids = namespacePids(ns);
    const double at = wallNow();
    for (pid_t p : pids) ::kill(p, SIGKILL);
    for (pid_t p : namespacePids(ns)) ::kill(p, SIGKILL);
    return at;
  }
  // Every packet in or out of the node's one interface dropped, loopback untouched (its agent and
  // workers still talk among themselves): a host that went silent without closing anything.
  // The rules are in effect once nft returned; its start is the time of the loss.
  const double at = wallNow();
  int rc = 0;
  const std::string out = shell(
      fmt::format("ip netns exec {} nft 'add table inet ftbench; "
                  "add chain inet ftbench in {{ type filter hook input priority -100; "
                  "policy accept; }}; add rule inet ftbench in iifname \"eth0\" drop; "
                  "add chain inet ftbench out {{ type filter hook output priority -100; "
                  "policy accept; }}; add rule inet ftbench out oifname \"eth0\" drop'",
                  ns),
      &rc);
  if (rc != 0) throw std::runtime_error("nft failed on " + ns + ": " + out);
  return at;
}

JobRun runJob(const JobSpec& spec, SimCluster& cluster) {
  JobRun run;
  int out[2];
  int err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)
    throw std::runtime_error("pipe failed");
  run.started = wallNow();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    std::vector<char*> argv;
    for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  std::string buffers[2];
  bool open[2] = {true, true};
  double loseAt = 0;  // when to lose the node, once its step came
  while (open[0] || open[1]) {
    pollfd p[2] = {{open[0] ? out[0] : -1, POLLIN, 0}, {open[1] ? err[0] : -1, POLLIN, 0}};
    ::poll(p, 2, 2);
    const double now = wallNow();
    for (int i = 0; i < 2; ++i) {
      if (!open[i] || !(p[i].revents & (POLLIN | POLLHUP))) continue;
      char buf[8192];
      const ssize_t n = ::read(p[i].fd, buf, sizeof buf);
      if (n <= 0) {
        open[i] = false;
        continue;
      }
      buffers[i].append(buf, static_cast<size_t>(n));
      const size_t before = run.lines.size();
      takeLines(buffers[i], i == 1, now, run);
      for (size_t l = before; l < run.lines.size() && loseAt == 0 && run.lostAt == 0; ++l) {
        const std::string& text = run.lines[l].text;
        const size_t at = text.find("ft step ");
        if ((spec.loss != Loss::kNone || spec.cue) && at != std::string::npos &&
            std::stoll(text.substr(at + 8)) >= spec.loseAfter) {
          loseAt = now + spec.loseDelay;
        }
      }
    }
    if (loseAt > 0 && run.lostAt == 0 && wallNow() >= loseAt) {
      run.lostAt = spec.cue ? spec.cue() : cluster.lose(spec.node, spec.loss);
    }
    if (wallNow() - run.started > spec.timeoutSeconds) {
      ::kill(pid, SIGKILL);
      break;
    }
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(out[0]);
  ::close(err[0]);
  run.ended = wallNow();
  if (WIFEXITED(status)) run.exitCode = WEXITSTATUS(status);
  return run;
}

double field(const std::string& text, const std::string& key) {
  const std::string k = " " + key + "=";
  const size_t at = text.find(k);
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + k.size()));
}

}  // namespace dtrain::bench
