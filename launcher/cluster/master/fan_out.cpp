#include "launcher/cluster/master/fan_out.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <set>
#include <thread>

#include "dtrain/base/error.h"
#include "env_contract.h"
#include "fault.h"
#include "launcher/cluster/master/master.h"
#include "launcher/cluster/protocol/plan_codec.h"
#include "launcher/cluster/remote/remote_command.h"
#include "launcher/cluster/remote/session.h"
#include "launcher/supervisor/output.h"
#include "launcher/supervisor/supervisor.h"

namespace dtrain::launcher {

namespace {

// How long an agent may take to exit after the master's decision, before SIGTERM.
constexpr double kSessionGraceSeconds = 5;

std::vector<std::string> environmentFor(const EnvMap& environment) {
  std::vector<std::string> out;
  for (const auto& [k, v] : environment) {
    if (k.rfind(env::kLaunchOptionPrefix, 0) == 0 || k == env::kStoreToken) continue;
    out.push_back(k + "=" + v);
  }
  return out;
}

}  // namespace

std::vector<std::string> agentCommand(const LaunchConfig& config, const MultiNodePlan& plan,
                                      int index) {
  const PlannedHost& h = plan.hosts.at(static_cast<size_t>(index));
  std::vector<std::string> argv{h.local ? selfPath() : plan.launchPath, "--agent", "--",
                                config.program};
  argv.insert(argv.end(), config.programArgs.begin(), config.programArgs.end());
  if (h.local) return argv;
  return remote::sshArgv(config.ssh, h.entry.host, remote::remoteShellCommand(plan.cwd, argv));
}

// Note [Fan-out master loop]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// The master's main thread owns the sessions (one per host: ssh, or a child agent) and the
// console; the coordinator runs on a thread of its own, on the store. The main thread sleeps in
// one poll() over everything that can happen: a signal (signalfd), output of a session, a
// session's end (its pidfd), and an eventfd the coordinator writes when it has nodes to start
// again or has ended the job. Nothing is looked at on a timer, so the master neither waits a
// tick to notice an ended session nor to exit after the decision. (Without pidfd_open, sessions
// are reaped on a 20 ms timer instead.) The ssh sessions start before anything else of the
// master, so the connections, the slowest part of a fan-out, run while the rest is set up.
namespace {

// The fan-out master's main thread: see Note [Fan-out master loop].
class FanOut {
 public:
  FanOut(const LaunchConfig& config, const MultiNodePlan& plan, const EnvMap& environment,
         const store::TcpStoreServer* server)
      : config_(config),
        plan_(plan),
        master_(config, plan, server),
        childEnv_(environmentFor(environment)),
        sessions_(plan.hosts.size()) {}
  int run();

 private:
  // Starts node `i`'s agent: ssh, or a child for this host; its plan on stdin.
  void startAgent(size_t i);
  void wake();
  // Sleeps until something happens: a signal, a session's output or end, the coordinator's wake.
  void waitForEvents();
  void onSignals();
  // Tells the coordinator of each session that ended, with why.
  void onSessionsEnded();
  // The agents have the decision and go; a lost node's session is not waited for.
  void finishSessions();

  // Closed after master_ is gone: the coordinator's thread writes wakeFd_ until it is joined.
  struct OwnedFd {
    int fd = -1;
    ~OwnedFd() {
      if (fd >= 0) ::close(fd);
    }
  };

  const LaunchConfig& config_;
  const MultiNodePlan& plan_;
  OwnedFd wakeFd_;
  OwnedFd signalFd_;
  Master master_;
  const std::vector<std::string> childEnv_;
  std::vector<std::unique_ptr<remote::Session>> sessions_;  // by node id (host-list index)
  int signals_ = 0;
};

int FanOut::run() {
  for (size_t i = 0; i < plan_.hosts.size(); ++i) startAgent(i);
  wakeFd_.fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  DTRAIN_CHECK(wakeFd_.fd >= 0, "launch: eventfd failed: {}", std::strerror(errno));
  master_.start([this] { wake(); });
  sigset_t set;
  sigemptyset(&set);
  for (int s : kForwardedSignals) sigaddset(&set, s);
  signalFd_.fd = ::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  while (!master_.done()) {
    waitForEvents();
    onSignals();
    onSessionsEnded();
    for (const auto& node : master_.coordinator().takeGoneNodes()) {
      try {
        startAgent(std::stoul(node));
      } catch (const Error& e) {
        master_.coordinator().nodeGone(
            node, fmt::format("its agent could not be started again: {}", e.what()));
      }
    }
  }
  const int code = master_.finish();
  finishSessions();
  return code;
}

void FanOut::startAgent(size_t i) {
  const std::string records = remote::encodePlan(
      agentPlanRecords(agentSetupFor(config_, plan_, static_cast<int>(i))));
  sessions_[i] = std::make_unique<remote::Session>(
      std::to_string(i), plan_.hosts[i].entry.host,
      agentCommand(config_, plan_, static_cast<int>(i)), childEnv_, records);
}

void FanOut::wake() {
  uint64_t one = 1;
  (void)!::write(wakeFd_.fd, &one, sizeof one);
}

void FanOut::waitForEvents() {
  std::vector<pollfd> fds{{signalFd_.fd, POLLIN, 0}, {wakeFd_.fd, POLLIN, 0}};
  bool timer = false;
  for (const auto& s : sessions_) {
    if (!s || s->exited()) continue;
    for (int fd : {s->stdoutFd(), s->stderrFd(), s->exitFd()}) {
      if (fd >= 0) fds.push_back({fd, POLLIN, 0});
    }
    timer = timer || s->exitFd() < 0;
  }
  ::poll(fds.data(), fds.size(), timer ? 20 : -1);
  uint64_t woken = 0;
  (void)!::read(wakeFd_.fd, &woken, sizeof woken);
}

void FanOut::onSignals() {
  signalfd_siginfo si{};
  while (signalFd_.fd >= 0 &&
         ::read(signalFd_.fd, &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
    const int sig = static_cast<int>(si.ssi_signo);
    say(++signals_ == 1
            ? fmt::format("launch: received {}; stopping the workers on every node (SIGTERM, "
                          "SIGKILL after {:g} s)",
                          fault::signalName(sig), config_.gracePeriod)
            : fmt::format("launch: received {} again; ending every node's agent now",
                          fault::signalName(sig)));
    master_.coordinator().requestStop(sig);
    if (signals_ > 1) {
      for (auto& s : sessions_) {
        if (s && !s->exited()) ::kill(-s->pid(), SIGTERM);
      }
    }
  }
}

void FanOut::onSessionsEnded() {
  for (auto& s : sessions_) {
    if (!s) continue;
    s->drain();
    if (s->exited() || !s->reap()) continue;
    std::string last;
    for (const auto& l : s->stderrTail()) last += (last.empty() ? "" : " | ") + l;
    const PlannedHost& h = plan_.hosts[std::stoul(s->node())];
    std::string why = h.local
                          ? fmt::format("its agent (a child of the master) {}", s->describeExit())
                          : fmt::format("its ssh session {}", s->describeExit());
    if (!last.empty()) why += ": " + last;
    if (!h.local) {
      std::string hint = remote::sshFailureHint(h.entry.host, last, config_.ssh);
      if (!hint.empty()) why += "; " + hint;
    }
    master_.coordinator().nodeGone(s->node(), why);
  }
}

void FanOut::finishSessions() {
  const std::set<std::string> lost = master_.coordinator().lostNodes();
  for (auto& s : sessions_) {
    if (!s) continue;
    s->closeStdin();
    if (lost.count(s->node()) && !s->exited()) ::kill(-s->pid(), SIGTERM);
  }
  for (auto& s : sessions_) {
    if (s) s->finish(kSessionGraceSeconds);
  }
}

}  // namespace

int runFanOut(const LaunchConfig& config, const MultiNodePlan& plan, const EnvMap& environment,
              const store::TcpStoreServer* server) {
  return FanOut(config, plan, environment, server).run();
}

}  // namespace dtrain::launcher
