#include "launcher/supervisor/supervisor.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <limits>
#include <sstream>

#include "dtrain/base/error.h"
#include "dtrain/base/fault.h"
#include "dtrain/base/logging.h"
#include "launcher/seconds.h"
#include "launcher/supervisor/guardian.h"
#include "launcher/supervisor/oom.h"
#include "launcher/supervisor/output.h"
#include "launcher/supervisor/process_info.h"

namespace dtrain::launcher {

namespace {

using Clock = std::chrono::steady_clock;

enum FdKind : uint64_t { kStatusFd = 0, kStdoutFd = 1, kStderrFd = 2 };
constexpr uint64_t kSignalTag = ~uint64_t{0};
constexpr uint64_t kStopTag = ~uint64_t{1};
constexpr uint64_t kDeadlineTag = ~uint64_t{2};
constexpr size_t kReadChunk = 64 * 1024;

uint64_t tagOf(size_t slot, FdKind kind) { return (static_cast<uint64_t>(slot) << 2) | kind; }

void makeDirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  DTRAIN_CHECK(!ec, "launch: cannot create directory {}: {}; HINT: check --log-dir and free space",
               path, ec.message());
}

std::string describeWaitStatus(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by " + fault::signalName(WTERMSIG(status));
  return fmt::format("ended with wait status {}", status);
}

void addToEpoll(int epollFd, int fd, uint64_t tag) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = tag;
  DTRAIN_CHECK(::epoll_ctl(epollFd, EPOLL_CTL_ADD, fd, &ev) == 0, "launch: epoll_ctl failed: {}",
               std::strerror(errno));
}

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

struct Supervisor::Slot {
  int rank = 0;
  int localRank = 0;
  GuardedWorker guarded;
  std::unique_ptr<WorkerStream> out;
  std::unique_ptr<WorkerStream> err;
  bool stdoutOpen = false;
  bool stderrOpen = false;
  bool statusOpen = false;
  bool exitReported = false;
  bool askedToStop = false;
  int execErrno = 0;
  std::string errorFile;
  WorkerOutcome outcome;
};

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

// Note [Attempt steps]
// ~~~~~~~~~~~~~~~~~~~~
// One attempt of this node's workers, as named steps that the one-node job (Supervisor::run) and
// a multi-node agent (launcher/cluster/agent.h, one attempt per round) share: spawnWorkers(), then
// superviseUntilEveryWorkerEnded() -- the event loop of Note [One event loop], dispatching to
// onSignals(), onStatus(), pump() and the stop request of AttemptHooks, with the deadlines of
// nextTimeoutMs() -- then drainOutput() and gatherFacts() for the report. The state the steps
// share is this class's members; the Supervisor keeps what outlives an attempt (epoll set,
// signalfd, plan).
class Supervisor::Attempt {
 public:
  Attempt(Supervisor& sup, int attempt, const AttemptHooks& hooks)
      : sup_(sup), config_(sup.plan_.config), node_(sup.plan_.node), hooks_(hooks),
        observer_(sup.plan_.observer),
        attempt_(attempt), start_(Clock::now()), oomBefore_(readOomKillCount()),
        slots_(static_cast<size_t>(sup.plan_.node.localWorldSize)), buffer_(kReadChunk) {
    result_.attempt = attempt;
  }

  AttemptResult run() {
    {
      // A deadline stop asked for during the previous attempt belongs to it.
      uint64_t pending = 0;
      (void)!::read(sup_.deadlineFd_, &pending, sizeof pending);
      std::lock_guard<std::mutex> lock(sup_.deadlineMutex_);
      sup_.deadlineReason_.clear();
    }
    if (observer_) observer_->attemptStarted(attempt_, node_.worldSize);
    spawnWorkers();
    // The stop fd is in the Supervisor's epoll set for this attempt only, also when a step throws
    // (the next attempt adds it again).
    struct StopFdIn {
      int epollFd;
      int fd;
      StopFdIn(int e, int f) : epollFd(e), fd(f) {
        if (fd >= 0) addToEpoll(epollFd, fd, kStopTag);
      }
      ~StopFdIn() {
        if (fd >= 0) ::epoll_ctl(epollFd, EPOLL_CTL_DEL, fd, nullptr);
      }
    } stopFdIn(sup_.epollFd_, hooks_.stopFd);
    superviseUntilEveryWorkerEnded();
    if (observer_) observer_->attemptEnded(attempt_);
    drainOutput();
    gatherFacts();
    return result_;
  }

 private:
  double seconds() const { return secondsSince(start_); }

  // Spawns every worker; a failure part-way stops the ones already running.
  void spawnWorkers() {
    for (int i = 0; i < static_cast<int>(slots_.size()); ++i) spawnWorker(i);
    DTRAIN_LOG(Info, "launch: attempt {}: started {} workers in {:.1f} ms", attempt_, slots_.size(),
               seconds() * 1e3);
  }

  void spawnWorker(int i) {
    Slot& s = slots_[static_cast<size_t>(i)];
    s.localRank = i;
    s.rank = node_.rankOffset + i;
    s.outcome.rank = s.rank;
    s.outcome.localRank = i;
    if (stopping_) {
      s.outcome.state = WorkerOutcome::State::Lost;
      s.outcome.lostReason = "it was not started: the job was already stopping";
      s.outcome.stoppedByLaunch = true;
      return;
    }
    try {
      const std::string dir = workerDir(node_.jobDir, attempt_, s.rank);
      makeDirs(dir);
      s.errorFile = errorFilePath(node_.jobDir, attempt_, s.rank);
      ::unlink(s.errorFile.c_str());  // a rerun with the same run id must not see an old one
      const bool shown = config_.localRanksFilter.empty() ||
                         std::find(config_.localRanksFilter.begin(), config_.localRanksFilter.end(),
                                   i) != config_.localRanksFilter.end();
      const int redirected = config_.redirects.streamsFor(i);
      const int logged = sup_.plan_.logAllStreams ? (kStdoutBit | kStderrBit)
                                             : (redirected | config_.tee.streamsFor(i));
      const std::string prefix = expandLinePrefix(config_.linePrefixTemplate, s.rank, i,
                                                  config_.role, attempt_, node_.nodeRank);
      StreamSinks out;
      out.consoleFd = shown && !(redirected & kStdoutBit) ? STDOUT_FILENO : -1;
      out.prefix = prefix;
      out.logPath = logged & kStdoutBit ? dir + "/stdout.log" : "";
      out.logMaxBytes = config_.logMaxBytes;
      StreamSinks err = out;
      err.consoleFd = shown && !(redirected & kStderrBit) ? STDERR_FILENO : -1;
      err.logPath = logged & kStderrBit ? dir + "/stderr.log" : "";
      err.tailLines = kDefaultTailLines;
      s.out = std::make_unique<WorkerStream>(out);
      s.err = std::make_unique<WorkerStream>(err);

      SpawnSpec spec;
      spec.file = sup_.plan_.command.file;
      spec.argv = sup_.plan_.command.argv;
      spec.env = toEnvStrings(workerEnv(config_, node_, i, attempt_));
      if (sup_.plan_.temporaryJobDir) spec.removeOnLauncherDeath = node_.jobDir;
      s.guarded = spawnGuarded(spec);
    } catch (const Error& e) {
      s.outcome.state = WorkerOutcome::State::Lost;
      s.outcome.lostReason = std::string("could not be started: ") + e.what();
      s.outcome.endSeconds = seconds();
      beginTeardown(fmt::format("rank {} could not be started on {}", s.rank, node_.host));
      return;
    }
    s.statusOpen = s.stdoutOpen = s.stderrOpen = true;
    addToEpoll(sup_.epollFd_, s.guarded.statusFd, tagOf(static_cast<size_t>(i), kStatusFd));
    addToEpoll(sup_.epollFd_, s.guarded.stdoutFd, tagOf(static_cast<size_t>(i), kStdoutFd));
    addToEpoll(sup_.epollFd_, s.guarded.stderrFd, tagOf(static_cast<size_t>(i), kStderrFd));
  }

  // `why`: this node's own reason, passed to the hooks (empty: asked from outside).
  void beginTeardown(const std::string& why) {
    if (stopping_) return;
    stopping_ = true;
    if (observer_) observer_->teardownStarted();
    if (!why.empty() && hooks_.onTeardown) hooks_.onTeardown(why);
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

  void killAll() {
    killed_ = true;
    giveUpAt_ = after(Clock::now(), config_.killTimeout);
    for (auto& s : slots_) {
      if (s.statusOpen) {
        s.askedToStop = true;
        signalGuarded(s.guarded.controlFd, SIGKILL);
      }
    }
  }

  bool pump(Slot& s, FdKind kind) {
    int& fd = kind == kStdoutFd ? s.guarded.stdoutFd : s.guarded.stderrFd;
    bool& open = kind == kStdoutFd ? s.stdoutOpen : s.stderrOpen;
    WorkerStream& stream = kind == kStdoutFd ? *s.out : *s.err;
    if (!open) return false;
    ssize_t got = ::read(fd, buffer_.data(), buffer_.size());
    if (got > 0) {
      stream.consume(buffer_.data(), static_cast<size_t>(got));
      return true;
    }
    if (got < 0 && (errno == EAGAIN || errno == EINTR)) return false;
    stream.finish();
    ::epoll_ctl(sup_.epollFd_, EPOLL_CTL_DEL, fd, nullptr);
    ::close(fd);
    fd = -1;
    open = false;
    return false;
  }

  void onStatus(Slot& s) {
    bool eof = false;
    for (const auto& m : readGuardianMessages(s.guarded.statusFd, &eof)) {
      switch (m.kind) {
        case GuardianMessage::kStarted:
          s.outcome.pid = m.value;
          if (observer_) observer_->workerStarted(s.rank, s.localRank, s.outcome.pid);
          break;
        case GuardianMessage::kExecFailed: s.execErrno = m.value; break;
        case GuardianMessage::kSpawnFailed:
          s.outcome.lostReason =
              fmt::format("its guardian could not fork the worker: {}", std::strerror(m.value));
          break;
        case GuardianMessage::kExited: {
          s.exitReported = true;
          s.outcome.endSeconds = seconds();
          if (s.execErrno != 0) {
            s.outcome.state = WorkerOutcome::State::ExecFailed;
            s.outcome.execErrno = s.execErrno;
          } else if (WIFSIGNALED(m.value)) {
            s.outcome.state = WorkerOutcome::State::Signaled;
            s.outcome.signal = WTERMSIG(m.value);
            s.outcome.coreDumped = WCOREDUMP(m.value);
          } else {
            s.outcome.state = WorkerOutcome::State::Exited;
            s.outcome.exitCode = WEXITSTATUS(m.value);
          }
          s.outcome.stoppedByLaunch = s.askedToStop;
          if (observer_) observer_->workerEnded(s.rank);
          DTRAIN_LOG(Info, "launch: rank {} (pid {}) {} after {:.3f} s", s.rank, s.outcome.pid,
                     describeOutcome(s.outcome), s.outcome.endSeconds);
          if (s.outcome.failed()) {
            beginTeardown(fmt::format("rank {} (pid {}) on {} {}", s.rank, s.outcome.pid,
                                      node_.host, describeOutcome(s.outcome)));
          } else if (!barrierArmed_ && !stopping_ && config_.exitBarrierTimeout > 0) {
            barrierArmed_ = true;
            barrierAt_ = after(Clock::now(), config_.exitBarrierTimeout);
            result_.exitBarrier.timeoutSeconds = config_.exitBarrierTimeout;
            result_.exitBarrier.firstRank = s.rank;
            result_.exitBarrier.firstExitSeconds = s.outcome.endSeconds;
          }
          break;
        }
        default: break;
      }
    }
    if (!eof) return;
    ::epoll_ctl(sup_.epollFd_, EPOLL_CTL_DEL, s.guarded.statusFd, nullptr);
    ::close(s.guarded.statusFd);
    ::close(s.guarded.controlFd);
    s.statusOpen = false;
    int status = 0;
    while (::waitpid(s.guarded.guardianPid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!s.exitReported) {
      // The guardian died before reporting (someone killed it): its worker got PDEATHSIG; make
      // sure of its group too.
      if (s.outcome.pid > 0) ::kill(-s.outcome.pid, SIGKILL);
      s.outcome.state = WorkerOutcome::State::Lost;
      if (s.outcome.lostReason.empty()) {
        s.outcome.lostReason = "its guardian process " + describeWaitStatus(status) +
                               " before the worker ended";
      }
      s.outcome.endSeconds = seconds();
      s.outcome.stoppedByLaunch = s.askedToStop;
      if (observer_) observer_->workerEnded(s.rank);
      beginTeardown(fmt::format("rank {} on {} {}", s.rank, node_.host, describeOutcome(s.outcome)));
    }
  }

  // Ctrl-Z: stop every worker, then launch itself; SIGCONT resumes them (Note [Job control]).
  void forwardToAll(int sig) {
    for (auto& s : slots_) {
      if (s.statusOpen && !s.exitReported) signalGuarded(s.guarded.controlFd, sig);
    }
  }

  void onStop() {
    if (jobStopped_) return;
    jobStopped_ = true;
    stoppedAt_ = Clock::now();
    forwardToAll(SIGSTOP);
    ::kill(::getpid(), SIGSTOP);  // returns once launch is continued; SIGCONT waits in the signalfd
  }

  void onContinue() {
    if (!jobStopped_) return;
    jobStopped_ = false;
    forwardToAll(SIGCONT);
    // Time spent stopped does not count against the deadlines.
    const auto stopped = Clock::now() - stoppedAt_;
    killAt_ += stopped;
    barrierAt_ += stopped;
    giveUpAt_ += stopped;
  }

  void onSignals() {
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

  // JobControl::stopForDeadline (--stall-action stop): the job ends with 124, without a restart.
  void onDeadlineStop() {
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

  // Workers still running when the barrier's deadline passes: the job ends with 124.
  void onBarrierTimeout() {
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

  // The last deadline passed: name what is left of each worker, and stop waiting for it.
  void onKillTimeout() {
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

  // The event loop's one timer (epoll_wait's timeout): the last deadline after SIGKILL, the
  // SIGKILL deadline while stopping, else the exit barrier's once armed; none while stopped.
  int nextTimeoutMs() const {
    auto msUntil = [](Clock::time_point at) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at - Clock::now());
      return static_cast<int>(
          std::clamp<int64_t>(left.count() + 1, 0, std::numeric_limits<int>::max()));
    };
    if (jobStopped_) return -1;  // resumed by SIGCONT (a signal) only
    if (killed_) return msUntil(giveUpAt_);
    if (stopping_) return msUntil(killAt_);
    if (barrierArmed_) return msUntil(barrierAt_);
    return -1;
  }

  bool anyStatusOpen() const {
    return std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.statusOpen; });
  }

  void superviseUntilEveryWorkerEnded() {
    while (anyStatusOpen()) {
      const int timeoutMs = nextTimeoutMs();
      epoll_event events[64];
      int ready = ::epoll_wait(sup_.epollFd_, events, 64, timeoutMs);
      if (ready < 0 && errno != EINTR) {
        DTRAIN_THROW(Error, "launch: epoll_wait failed: {}", std::strerror(errno));
      }
      for (int e = 0; e < ready; ++e) {
        const uint64_t tag = events[e].data.u64;
        if (tag == kSignalTag) {
          onSignals();
          continue;
        }
        if (tag == kStopTag) {
          uint64_t count = 0;
          (void)!::read(hooks_.stopFd, &count, sizeof count);
          beginTeardown("");
          continue;
        }
        if (tag == kDeadlineTag) {
          onDeadlineStop();
          continue;
        }
        Slot& s = slots_[tag >> 2];
        const auto kind = static_cast<FdKind>(tag & 3);
        if (kind == kStatusFd) {
          if (s.statusOpen) onStatus(s);
        } else {
          pump(s, kind);
        }
      }
      if (jobStopped_) continue;
      if (!stopping_ && barrierArmed_ && Clock::now() >= barrierAt_) onBarrierTimeout();
      if (stopping_ && !killed_ && Clock::now() >= killAt_) killAll();
      if (killed_ && Clock::now() >= giveUpAt_) onKillTimeout();
    }
  }

  // Every worker and everything under it is gone: what is left in the pipes is the end of
  // their output. Take it (the report wants the last stderr lines) and close.
  void drainOutput() {
    for (auto& s : slots_) {
      while (pump(s, kStdoutFd)) {
      }
      while (pump(s, kStderrFd)) {
      }
      if (s.stdoutOpen || s.stderrOpen) {
        for (FdKind kind : {kStdoutFd, kStderrFd}) {
          int& fd = kind == kStdoutFd ? s.guarded.stdoutFd : s.guarded.stderrFd;
          if (fd < 0) continue;
          (kind == kStdoutFd ? *s.out : *s.err).finish();
          ::epoll_ctl(sup_.epollFd_, EPOLL_CTL_DEL, fd, nullptr);
          ::close(fd);
          fd = -1;
        }
        s.stdoutOpen = s.stderrOpen = false;
      }
    }
  }

  // The facts for the report.
  void gatherFacts() {
    std::string kernelLog;
    bool kernelLogRead = false;
    const int64_t oomAfter = readOomKillCount();
    for (auto& s : slots_) {
      WorkerOutcome& o = s.outcome;
      if (s.err) {
        o.stderrTail.assign(s.err->tail().begin(), s.err->tail().end());
        o.stderrLog = s.err->logPath();
      }
      if (o.failed() && !s.errorFile.empty()) o.errorFileMessage = readErrorFile(s.errorFile);
      if (o.state == WorkerOutcome::State::Signaled && o.signal == SIGKILL && !o.stoppedByLaunch) {
        if (!kernelLogRead) {
          kernelLog = readKernelLog();
          kernelLogRead = true;
        }
        o.oomNote = oomNote(o.pid, kernelLog, oomBefore_, oomAfter);
      }
      result_.workers.push_back(o);
    }
  }

  Supervisor& sup_;
  const LaunchConfig& config_;
  const NodeContext& node_;
  const AttemptHooks& hooks_;
  JobObserver* const observer_;
  const int attempt_;
  const Clock::time_point start_;
  const int64_t oomBefore_;
  AttemptResult result_;
  std::vector<Slot> slots_;
  std::vector<char> buffer_;
  bool stopping_ = false;
  bool killed_ = false;
  Clock::time_point killAt_;
  Clock::time_point giveUpAt_;  // the last deadline, once SIGKILL was sent (Note [Last deadline])
  bool jobStopped_ = false;     // by SIGTSTP (Note [Job control])
  Clock::time_point stoppedAt_;
  // The exit barrier: armed when the first worker exits 0 (see Note [Exit barrier]).
  bool barrierArmed_ = false;
  Clock::time_point barrierAt_;
};

AttemptResult Supervisor::runAttempt(int attempt, const AttemptHooks& hooks) {
  return Attempt(*this, attempt, hooks).run();
}

}  // namespace dtrain::launcher
