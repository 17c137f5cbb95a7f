#include "launcher/supervisor/attempt.h"

#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <csignal>
#include <mutex>
#include <optional>

#include "fault.h"
#include "launcher/supervisor/process_info.h"

namespace dtrain::launcher {

void Supervisor::Attempt::beginTeardown(const std::string& why, bool nodeLost) {
  if (stopping_) return;
  stopping_ = true;
  if (observer_) observer_->teardownStarted();
  if (nodeLost) {
    result_.nodeLost = why;
  } else if (!why.empty() && hooks_.onTeardown) {
    hooks_.onTeardown(why);
  }
  killAt_ = after(Clock::now(), config_.gracePeriod);
  for (auto& s : slots_) {
    if (!s.statusOpen || s.exitReported) continue;
    if (!jobStopped_ && s.outcome.pid > 0 && processState(s.outcome.pid) == 'T') {
      s.outcome.wasStopped = true;  // by someone else than launch's job control
    }
    s.askedToStop = true;
    signalGuarded(s.guarded.controlFd, SIGTERM);
  }
}

void Supervisor::Attempt::killAll() {
  killed_ = true;
  giveUpAt_ = after(Clock::now(), config_.killTimeout);
  for (auto& s : slots_) {
    if (s.statusOpen) {
      s.askedToStop = true;
      signalGuarded(s.guarded.controlFd, SIGKILL);
    }
  }
}

void Supervisor::Attempt::forwardToAll(int sig) {
  for (auto& s : slots_) {
    if (s.statusOpen && !s.exitReported) signalGuarded(s.guarded.controlFd, sig);
  }
}

void Supervisor::Attempt::onStop() {
  if (jobStopped_) return;
  jobStopped_ = true;
  stoppedAt_ = Clock::now();
  forwardToAll(SIGSTOP);
  ::kill(::getpid(), SIGSTOP);  // returns once launch is continued; SIGCONT waits in the signalfd
}

void Supervisor::Attempt::onContinue() {
  if (!jobStopped_) return;
  jobStopped_ = false;
  forwardToAll(SIGCONT);
  // Time spent stopped does not count against the deadlines.
  const auto stopped = Clock::now() - stoppedAt_;
  killAt_ += stopped;
  barrierAt_ += stopped;
  giveUpAt_ += stopped;
}

void Supervisor::Attempt::onSignals() {
  signalfd_siginfo si{};
  while (::read(sup_.signalFd_, &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
    const int sig = static_cast<int>(si.ssi_signo);
    if (sig == SIGTSTP) {
      onStop();
    } else if (sig == SIGCONT) {
      onContinue();
    } else if (result_.launcherSignal == 0) {
      result_.launcherSignal = sig;
      result_.signalBeforeFailure = !stopping_;
      std::string line = fmt::format(
          "launch: received {}; stopping the workers (SIGTERM, SIGKILL after {:g} s)\n",
          fault::signalName(sig), config_.gracePeriod);
      writeAll(STDERR_FILENO, line.data(), line.size());
      beginTeardown(fmt::format("launch on {} received {}", node_.host, fault::signalName(sig)));
    } else if (!killed_) {
      std::string line = fmt::format("launch: received {} again; killing the workers now\n",
                                     fault::signalName(sig));
      writeAll(STDERR_FILENO, line.data(), line.size());
      killAll();
    }
  }
}

void Supervisor::Attempt::onDeadlineStop() {
  uint64_t count = 0;
  (void)!::read(sup_.deadlineFd_, &count, sizeof count);
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(sup_.deadlineMutex_);
    reason = sup_.deadlineReason_;
  }
  if (stopping_ || reason.empty()) return;
  result_.deadlineStop = reason;
  beginTeardown(fmt::format("a deadline passed on {}: {}", node_.host, reason));
}

void Supervisor::Attempt::onBarrierTimeout() {
  barrierArmed_ = false;  // it fires once
  ExitBarrierTimeout& b = result_.exitBarrier;
  const double now = seconds();
  for (const auto& s : slots_) {
    if (!s.statusOpen || s.exitReported) continue;
    ExitBarrierTimeout::Straggler straggler;
    straggler.rank = s.rank;
    straggler.localRank = s.localRank;
    straggler.pid = s.outcome.pid;
    straggler.runningFor = now - b.firstExitSeconds;
    b.stillRunning.push_back(straggler);
  }
  if (b.stillRunning.empty()) return;  // the last ones are only being reaped
  b.timedOut = true;
  std::string line = formatExitBarrierLine(b, optionLabel(config_, "exit-barrier-timeout"),
                                           config_.gracePeriod);
  writeAll(STDERR_FILENO, line.data(), line.size());
  beginTeardown(fmt::format("the exit barrier timed out on {}", node_.host));
}

void Supervisor::Attempt::onKillTimeout() {
  const double waited = config_.killTimeout;
  result_.killTimeout = waited;
  for (auto& s : slots_) {
    if (!s.statusOpen) continue;
    std::vector<pid_t> pids = childProcesses(s.guarded.guardianPid);
    if (pids.empty()) pids.push_back(s.guarded.guardianPid);  // the guardian itself is stuck
    for (pid_t pid : pids) {
      std::optional<ProcessInfo> info = inspectProcess(pid);
      if (!info) continue;
      Survivor survivor;
      survivor.rank = s.rank;
      survivor.localRank = s.localRank;
      survivor.pid = pid;
      survivor.isWorker = pid == s.outcome.pid;
      survivor.state = info->state;
      survivor.waitingIn = info->waitingIn;
      survivor.command = info->command;
      result_.survivors.push_back(survivor);
    }
    if (!s.exitReported) {
      s.outcome.state = WorkerOutcome::State::Lost;
      s.outcome.lostReason = fmt::format("it survived SIGKILL for {:g} s", waited);
      s.outcome.endSeconds = seconds();
      s.outcome.stoppedByLaunch = s.askedToStop;
    }
    // Its guardian sees the control pipe close, kills what is left once it can, and ends.
    ::epoll_ctl(sup_.epollFd_, EPOLL_CTL_DEL, s.guarded.statusFd, nullptr);
    ::close(s.guarded.statusFd);
    ::close(s.guarded.controlFd);
    s.statusOpen = false;
  }
  if (result_.survivors.empty()) return;
  std::string line = formatSurvivorsLine(result_.survivors, waited);
  writeAll(STDERR_FILENO, line.data(), line.size());
}

}  // namespace dtrain::launcher
