#include "launcher/supervisor/supervisor.h"

#include <fcntl.h>
#include <sys/epoll.h>
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

#include "dtrain/error.h"
#include "dtrain/fault.h"
#include "dtrain/logging.h"
#include "launcher/supervisor/guardian.h"
#include "launcher/supervisor/oom.h"
#include "launcher/supervisor/output.h"
#include "launcher/supervisor/process_info.h"

namespace dtrain::launcher {

namespace {

using Clock = std::chrono::steady_clock;

enum FdKind : uint64_t { kStatusFd = 0, kStdoutFd = 1, kStderrFd = 2 };
constexpr uint64_t kSignalTag = ~uint64_t{0};
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
}

Supervisor::~Supervisor() {
  if (epollFd_ >= 0) ::close(epollFd_);
  if (signalFd_ >= 0) ::close(signalFd_);
}

int Supervisor::run() {
  const LaunchConfig& config = plan_.config;
  std::vector<AttemptResult> attempts;
  for (int attempt = 0;; ++attempt) {
    attempts.push_back(runAttempt(attempt));
    const AttemptResult& r = attempts.back();
    // A timed-out exit barrier ends the job without a restart: see Note [Exit barrier]; so do
    // processes that survived SIGKILL: see Note [Last deadline].
    if (r.launcherSignal != 0 || r.exitBarrier.timedOut || !r.survivors.empty() ||
        rootCauseIndex(r.workers) < 0) {
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

AttemptResult Supervisor::runAttempt(int attempt) {
  const LaunchConfig& config = plan_.config;
  const NodeContext& node = plan_.node;
  const int n = node.localWorldSize;
  const auto start = Clock::now();
  const int64_t oomBefore = readOomKillCount();
  auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };

  AttemptResult result;
  result.attempt = attempt;
  std::vector<Slot> slots(static_cast<size_t>(n));
  bool stopping = false;
  bool killed = false;
  Clock::time_point killAt;
  Clock::time_point giveUpAt;  // the last deadline, once SIGKILL was sent (Note [Last deadline])
  bool jobStopped = false;     // by SIGTSTP (Note [Job control])
  Clock::time_point stoppedAt;
  // The exit barrier: armed when the first worker exits 0 (see Note [Exit barrier]).
  bool barrierArmed = false;
  Clock::time_point barrierAt;

  auto beginTeardown = [&] {
    if (stopping) return;
    stopping = true;
    killAt = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(config.gracePeriod));
    for (auto& s : slots) {
      if (!s.statusOpen || s.exitReported) continue;
      if (!jobStopped && s.outcome.pid > 0 && processState(s.outcome.pid) == 'T') {
        s.outcome.wasStopped = true;  // by someone else than launch's job control
      }
      s.askedToStop = true;
      signalGuarded(s.guarded.controlFd, SIGTERM);
    }
  };
  auto killAll = [&] {
    killed = true;
    giveUpAt = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(config.killTimeout));
    for (auto& s : slots) {
      if (s.statusOpen) {
        s.askedToStop = true;
        signalGuarded(s.guarded.controlFd, SIGKILL);
      }
    }
  };

  // Spawn every worker; a failure part-way stops the ones already running.
  for (int i = 0; i < n; ++i) {
    Slot& s = slots[static_cast<size_t>(i)];
    s.localRank = i;
    s.rank = node.nodeRank * n + i;
    s.outcome.rank = s.rank;
    s.outcome.localRank = i;
    if (stopping) {
      s.outcome.state = WorkerOutcome::State::Lost;
      s.outcome.lostReason = "it was not started: the job was already stopping";
      s.outcome.stoppedByLaunch = true;
      continue;
    }
    try {
      const std::string dir = workerDir(node.jobDir, attempt, s.rank);
      makeDirs(dir);
      s.errorFile = errorFilePath(node.jobDir, attempt, s.rank);
      ::unlink(s.errorFile.c_str());  // a rerun with the same run id must not see an old one
      const bool shown = config.localRanksFilter.empty() ||
                         std::find(config.localRanksFilter.begin(), config.localRanksFilter.end(),
                                   i) != config.localRanksFilter.end();
      const int redirected = config.redirects.streamsFor(i);
      const int logged = plan_.logAllStreams ? (kStdoutBit | kStderrBit)
                                             : (redirected | config.tee.streamsFor(i));
      const std::string prefix =
          expandLinePrefix(config.linePrefixTemplate, s.rank, i, config.role, attempt);
      StreamSinks out;
      out.consoleFd = shown && !(redirected & kStdoutBit) ? STDOUT_FILENO : -1;
      out.prefix = prefix;
      out.logPath = logged & kStdoutBit ? dir + "/stdout.log" : "";
      out.logMaxBytes = config.logMaxBytes;
      StreamSinks err = out;
      err.consoleFd = shown && !(redirected & kStderrBit) ? STDERR_FILENO : -1;
      err.logPath = logged & kStderrBit ? dir + "/stderr.log" : "";
      err.tailLines = kDefaultTailLines;
      s.out = std::make_unique<WorkerStream>(out);
      s.err = std::make_unique<WorkerStream>(err);

      SpawnSpec spec;
      spec.file = plan_.command.file;
      spec.argv = plan_.command.argv;
      spec.env = toEnvStrings(workerEnv(config, node, i, attempt));
      if (plan_.temporaryJobDir) spec.removeOnLauncherDeath = node.jobDir;
      s.guarded = spawnGuarded(spec);
    } catch (const Error& e) {
      s.outcome.state = WorkerOutcome::State::Lost;
      s.outcome.lostReason = std::string("could not be started: ") + e.what();
      s.outcome.endSeconds = seconds();
      beginTeardown();
      continue;
    }
    s.statusOpen = s.stdoutOpen = s.stderrOpen = true;
    addToEpoll(epollFd_, s.guarded.statusFd, tagOf(static_cast<size_t>(i), kStatusFd));
    addToEpoll(epollFd_, s.guarded.stdoutFd, tagOf(static_cast<size_t>(i), kStdoutFd));
    addToEpoll(epollFd_, s.guarded.stderrFd, tagOf(static_cast<size_t>(i), kStderrFd));
  }
  DTRAIN_LOG(Info, "launch: attempt {}: started {} workers in {:.1f} ms", attempt, n,
             seconds() * 1e3);

  std::vector<char> buffer(kReadChunk);
  auto pump = [&](Slot& s, FdKind kind) {
    int& fd = kind == kStdoutFd ? s.guarded.stdoutFd : s.guarded.stderrFd;
    bool& open = kind == kStdoutFd ? s.stdoutOpen : s.stderrOpen;
    WorkerStream& stream = kind == kStdoutFd ? *s.out : *s.err;
    if (!open) return false;
    ssize_t got = ::read(fd, buffer.data(), buffer.size());
    if (got > 0) {
      stream.consume(buffer.data(), static_cast<size_t>(got));
      return true;
    }
    if (got < 0 && (errno == EAGAIN || errno == EINTR)) return false;
    stream.finish();
    ::epoll_ctl(epollFd_, EPOLL_CTL_DEL, fd, nullptr);
    ::close(fd);
    fd = -1;
    open = false;
    return false;
  };

  auto onStatus = [&](Slot& s) {
    bool eof = false;
    for (const auto& m : readGuardianMessages(s.guarded.statusFd, &eof)) {
      switch (m.kind) {
        case GuardianMessage::kStarted: s.outcome.pid = m.value; break;
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
          DTRAIN_LOG(Info, "launch: rank {} (pid {}) {} after {:.3f} s", s.rank, s.outcome.pid,
                     describeOutcome(s.outcome), s.outcome.endSeconds);
          if (s.outcome.failed()) {
            beginTeardown();
          } else if (!barrierArmed && !stopping && config.exitBarrierTimeout > 0) {
            barrierArmed = true;
            barrierAt = Clock::now() +
                        std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(config.exitBarrierTimeout));
            result.exitBarrier.timeoutSeconds = config.exitBarrierTimeout;
            result.exitBarrier.firstRank = s.rank;
            result.exitBarrier.firstExitSeconds = s.outcome.endSeconds;
          }
          break;
        }
        default: break;
      }
    }
    if (!eof) return;
    ::epoll_ctl(epollFd_, EPOLL_CTL_DEL, s.guarded.statusFd, nullptr);
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
      beginTeardown();
    }
  };

  // Ctrl-Z: stop every worker, then launch itself; SIGCONT resumes them (Note [Job control]).
  auto forwardToAll = [&](int sig) {
    for (auto& s : slots) {
      if (s.statusOpen && !s.exitReported) signalGuarded(s.guarded.controlFd, sig);
    }
  };
  auto onStop = [&] {
    if (jobStopped) return;
    jobStopped = true;
    stoppedAt = Clock::now();
    forwardToAll(SIGSTOP);
    ::kill(::getpid(), SIGSTOP);  // returns once launch is continued; SIGCONT waits in the signalfd
  };
  auto onContinue = [&] {
    if (!jobStopped) return;
    jobStopped = false;
    forwardToAll(SIGCONT);
    // Time spent stopped does not count against the deadlines.
    const auto stopped = Clock::now() - stoppedAt;
    killAt += stopped;
    barrierAt += stopped;
    giveUpAt += stopped;
  };

  auto onSignals = [&] {
    signalfd_siginfo si{};
    while (::read(signalFd_, &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
      const int sig = static_cast<int>(si.ssi_signo);
      if (sig == SIGTSTP) {
        onStop();
      } else if (sig == SIGCONT) {
        onContinue();
      } else if (result.launcherSignal == 0) {
        result.launcherSignal = sig;
        result.signalBeforeFailure = !stopping;
        std::string line = fmt::format(
            "launch: received {}; stopping the workers (SIGTERM, SIGKILL after {:g} s)\n",
            fault::signalName(sig), config.gracePeriod);
        writeAll(STDERR_FILENO, line.data(), line.size());
        beginTeardown();
      } else if (!killed) {
        std::string line = fmt::format("launch: received {} again; killing the workers now\n",
                                       fault::signalName(sig));
        writeAll(STDERR_FILENO, line.data(), line.size());
        killAll();
      }
    }
  };

  // Workers still running when the barrier's deadline passes: the job ends with 124.
  auto onBarrierTimeout = [&] {
    barrierArmed = false;  // it fires once
    ExitBarrierTimeout& b = result.exitBarrier;
    const double now = seconds();
    for (const auto& s : slots) {
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
    std::string line = formatExitBarrierLine(b, optionLabel(config, "exit-barrier-timeout"),
                                             config.gracePeriod);
    writeAll(STDERR_FILENO, line.data(), line.size());
    beginTeardown();
  };

  // The last deadline passed: name what is left of each worker, and stop waiting for it.
  auto onKillTimeout = [&] {
    const double waited = config.killTimeout;
    result.killTimeout = waited;
    for (auto& s : slots) {
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
        result.survivors.push_back(survivor);
      }
      if (!s.exitReported) {
        s.outcome.state = WorkerOutcome::State::Lost;
        s.outcome.lostReason = fmt::format("it survived SIGKILL for {:g} s", waited);
        s.outcome.endSeconds = seconds();
        s.outcome.stoppedByLaunch = s.askedToStop;
      }
      // Its guardian sees the control pipe close, kills what is left once it can, and ends.
      ::epoll_ctl(epollFd_, EPOLL_CTL_DEL, s.guarded.statusFd, nullptr);
      ::close(s.guarded.statusFd);
      ::close(s.guarded.controlFd);
      s.statusOpen = false;
    }
    if (result.survivors.empty()) return;
    std::string line = formatSurvivorsLine(result.survivors, waited);
    writeAll(STDERR_FILENO, line.data(), line.size());
  };

  auto anyStatusOpen = [&] {
    return std::any_of(slots.begin(), slots.end(), [](const Slot& s) { return s.statusOpen; });
  };
  // The event loop's one timer (epoll_wait's timeout): the SIGKILL deadline while stopping,
  // else the exit barrier's once armed.
  auto msUntil = [](Clock::time_point at) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at - Clock::now());
    return static_cast<int>(
        std::clamp<int64_t>(left.count() + 1, 0, std::numeric_limits<int>::max()));
  };
  while (anyStatusOpen()) {
    int timeoutMs = -1;
    if (jobStopped) {
      timeoutMs = -1;  // resumed by SIGCONT (a signal) only
    } else if (killed) {
      timeoutMs = msUntil(giveUpAt);
    } else if (stopping) {
      timeoutMs = msUntil(killAt);
    } else if (barrierArmed) {
      timeoutMs = msUntil(barrierAt);
    }
    epoll_event events[64];
    int ready = ::epoll_wait(epollFd_, events, 64, timeoutMs);
    if (ready < 0 && errno != EINTR) {
      DTRAIN_THROW(Error, "launch: epoll_wait failed: {}", std::strerror(errno));
    }
    for (int e = 0; e < ready; ++e) {
      const uint64_t tag = events[e].data.u64;
      if (tag == kSignalTag) {
        onSignals();
        continue;
      }
      Slot& s = slots[tag >> 2];
      const auto kind = static_cast<FdKind>(tag & 3);
      if (kind == kStatusFd) {
        if (s.statusOpen) onStatus(s);
      } else {
        pump(s, kind);
      }
    }
    if (jobStopped) continue;
    if (!stopping && barrierArmed && Clock::now() >= barrierAt) onBarrierTimeout();
    if (stopping && !killed && Clock::now() >= killAt) killAll();
    if (killed && Clock::now() >= giveUpAt) onKillTimeout();
  }

  // Every worker and everything under it is gone: what is left in the pipes is the end of their
  // output. Take it (the report wants the last stderr lines) and close.
  for (auto& s : slots) {
    while (pump(s, kStdoutFd)) {
    }
    while (pump(s, kStderrFd)) {
    }
    if (s.stdoutOpen || s.stderrOpen) {
      for (FdKind kind : {kStdoutFd, kStderrFd}) {
        int& fd = kind == kStdoutFd ? s.guarded.stdoutFd : s.guarded.stderrFd;
        if (fd < 0) continue;
        (kind == kStdoutFd ? *s.out : *s.err).finish();
        ::epoll_ctl(epollFd_, EPOLL_CTL_DEL, fd, nullptr);
        ::close(fd);
        fd = -1;
      }
      s.stdoutOpen = s.stderrOpen = false;
    }
  }

  // Gather the facts for the report.
  std::string kernelLog;
  bool kernelLogRead = false;
  const int64_t oomAfter = readOomKillCount();
  for (auto& s : slots) {
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
      o.oomNote = oomNote(o.pid, kernelLog, oomBefore, oomAfter);
    }
    result.workers.push_back(o);
  }
  return result;
}

}  // namespace dtrain::launcher
