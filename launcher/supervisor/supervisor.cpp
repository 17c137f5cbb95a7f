#include "launcher/supervisor/supervisor.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dtrain/base/error.h"
#include "launcher/supervisor/attempt.h"
#include "launcher/supervisor/output.h"

namespace dtrain::launcher {

namespace {

sigset_t launcherSignalSet() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : kForwardedSignals) sigaddset(&set, s);
  for (int s : kJobControlSignals) sigaddset(&set, s);
  return set;
}

}  // namespace

void blockLauncherSignals() {
  sigset_t set = launcherSignalSet();
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
  ::signal(SIGPIPE, SIG_IGN);  // a guardian or the console gone: EPIPE, not death
}

Supervisor::Supervisor(JobPlan plan) : plan_(std::move(plan)) {
  sigset_t set = launcherSignalSet();
  signalFd_ = ::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  DTRAIN_CHECK(signalFd_ >= 0, "launch: signalfd failed: {}", std::strerror(errno));
  epollFd_ = ::epoll_create1(EPOLL_CLOEXEC);
  DTRAIN_CHECK(epollFd_ >= 0, "launch: epoll_create1 failed: {}", std::strerror(errno));
  addToEpoll(epollFd_, signalFd_, kSignalTag);
  deadlineFd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  DTRAIN_CHECK(deadlineFd_ >= 0, "launch: eventfd failed: {}", std::strerror(errno));
  addToEpoll(epollFd_, deadlineFd_, kDeadlineTag);
}

Supervisor::~Supervisor() {
  if (deadlineFd_ >= 0) ::close(deadlineFd_);
  if (epollFd_ >= 0) ::close(epollFd_);
  if (signalFd_ >= 0) ::close(signalFd_);
}

void Supervisor::stopForDeadline(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(deadlineMutex_);
    if (deadlineReason_.empty()) deadlineReason_ = reason;
  }
  uint64_t one = 1;
  (void)!::write(deadlineFd_, &one, sizeof one);
}

int Supervisor::run() {
  const LaunchConfig& config = plan_.config;
  std::vector<AttemptResult> attempts;
  for (int attempt = 0;; ++attempt) {
    attempts.push_back(runAttempt(attempt));
    const AttemptResult& r = attempts.back();
    // A timed-out exit barrier ends the job without a restart: see Note [Exit barrier]; so do
    // processes that survived SIGKILL (see Note [Last deadline]) and a deadline an observer
    // enforced (--stall-action stop).
    if (r.launcherSignal != 0 || r.exitBarrier.timedOut || !r.survivors.empty() ||
        !r.deadlineStop.empty() || rootCauseIndex(r.workers) < 0) {
      break;
    }
    if (attempt >= config.maxRestarts) break;
    std::string line = formatRestartLine(r, attempt + 1, config.maxRestarts);
    writeAll(STDERR_FILENO, line.data(), line.size());
  }
  const int code = launcherExitCode(attempts.back());
  if (code != 0) {
    ReportContext ctx;
    ctx.host = plan_.node.host;
    ctx.runId = plan_.node.runId;
    ctx.maxRestarts = config.maxRestarts;
    ctx.gracePeriod = config.gracePeriod;
    ctx.logHint = plan_.logHint;
    ctx.exitBarrierOption = optionLabel(config, "exit-barrier-timeout");
    ctx.killTimeoutOption = optionLabel(config, "kill-timeout");
    std::string report = formatFailureReport(ctx, attempts);
    writeAll(STDERR_FILENO, report.data(), report.size());
  }
  return code;
}

AttemptResult Supervisor::runAttempt(int attempt, const AttemptHooks& hooks) {
  return Attempt(*this, attempt, hooks).run();
}

}  // namespace dtrain::launcher
