#include "launcher/cluster/fan_out.h"

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
#include "dtrain/base/fault.h"
#include "env_contract.h"
#include "launcher/cluster/master.h"
#include "launcher/cluster/plan_codec.h"
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
int runFanOut(const LaunchConfig& config, const MultiNodePlan& plan, const EnvMap& environment) {
  std::unique_ptr<monitor::Monitor> watcher = masterMonitor(config, plan);
  const std::vector<std::string> childEnv = environmentFor(environment);
  std::vector<std::unique_ptr<remote::Session>> sessions(plan.hosts.size());
  auto start = [&](size_t i) {
    const std::string records = remote::encodePlan(
        agentPlanRecords(agentSetupFor(config, plan, static_cast<int>(i))));
    sessions[i] = std::make_unique<remote::Session>(
        std::to_string(i), plan.hosts[i].entry.host,
        agentCommand(config, plan, static_cast<int>(i)), childEnv, records);
  };
  for (size_t i = 0; i < plan.hosts.size(); ++i) start(i);

  const int wakeFd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  DTRAIN_CHECK(wakeFd >= 0, "launch: eventfd failed: {}", std::strerror(errno));
  auto wake = [wakeFd] {
    uint64_t one = 1;
    (void)!::write(wakeFd, &one, sizeof one);
  };
  CoordinatorOptions co = coordinatorOptions(config, plan);
  co.wake = wake;
  co.observer = watcher.get();
  Coordinator coordinator(masterStoreClient(plan), co);
  watcher->start(&coordinator);

  std::atomic<bool> done{false};
  int code = 125;
  std::thread thread([&] {
    try {
      code = coordinator.run();
    } catch (const Error& e) {
      say(fmt::format("launch: error: {} (exit 125)", e.what()));
    }
    done = true;
    wake();
  });

  sigset_t set;
  sigemptyset(&set);
  for (int s : kForwardedSignals) sigaddset(&set, s);
  int sfd = ::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  int signals = 0;
  while (!done) {
    std::vector<pollfd> fds{{sfd, POLLIN, 0}, {wakeFd, POLLIN, 0}};
    bool timer = false;
    for (const auto& s : sessions) {
      if (!s || s->exited()) continue;
      for (int fd : {s->stdoutFd(), s->stderrFd(), s->exitFd()}) {
        if (fd >= 0) fds.push_back({fd, POLLIN, 0});
      }
      timer = timer || s->exitFd() < 0;
    }
    ::poll(fds.data(), fds.size(), timer ? 20 : -1);
    uint64_t woken = 0;
    (void)!::read(wakeFd, &woken, sizeof woken);
    signalfd_siginfo si{};
    while (sfd >= 0 && ::read(sfd, &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
      const int sig = static_cast<int>(si.ssi_signo);
      say(++signals == 1
          ? fmt::format("launch: received {}; stopping the workers on every node (SIGTERM, "
                        "SIGKILL after {:g} s)", fault::signalName(sig), config.gracePeriod)
          : fmt::format("launch: received {} again; ending every node's agent now",
                        fault::signalName(sig)));
      coordinator.requestStop(sig);
      if (signals > 1) {
        for (auto& s : sessions) {
          if (s && !s->exited()) ::kill(-s->pid(), SIGTERM);
        }
      }
    }
    for (auto& s : sessions) {
      if (!s) continue;
      s->drain();
      if (s->exited() || !s->reap()) continue;
      std::string last;
      for (const auto& l : s->stderrTail()) last += (last.empty() ? "" : " | ") + l;
      const PlannedHost& h = plan.hosts[std::stoul(s->node())];
      std::string why = h.local ? fmt::format("its agent (a child of the master) {}", s->describeExit())
                                : fmt::format("its ssh session {}", s->describeExit());
      if (!last.empty()) why += ": " + last;
      if (!h.local) {
        std::string hint = remote::sshFailureHint(h.entry.host, last, config.ssh);
        if (!hint.empty()) why += "; " + hint;
      }
      coordinator.nodeGone(s->node(), why);
    }
    for (const auto& node : coordinator.takeGoneNodes()) {
      try {
        start(std::stoul(node));
      } catch (const Error& e) {
        coordinator.nodeGone(node, fmt::format("its agent could not be started again: {}", e.what()));
      }
    }
  }
  thread.join();
  watcher->stop();
  if (sfd >= 0) ::close(sfd);
  ::close(wakeFd);
  // The agents have the decision and go; a lost node's session is not waited for.
  const std::set<std::string> lost = coordinator.lostNodes();
  for (auto& s : sessions) {
    if (!s) continue;
    s->closeStdin();
    if (lost.count(s->node()) && !s->exited()) ::kill(-s->pid(), SIGTERM);
  }
  for (auto& s : sessions) {
    if (s) s->finish(kSessionGraceSeconds);
  }
  return code;
}

}  // namespace dtrain::launcher
