#include "launcher/supervisor/attempt.h"

#include <sys/epoll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "fault.h"
#include "launcher/supervisor/oom.h"

namespace dtrain::launcher {

namespace {

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

}  // namespace

void addToEpoll(int epollFd, int fd, uint64_t tag) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = tag;
  DTRAIN_CHECK(::epoll_ctl(epollFd, EPOLL_CTL_ADD, fd, &ev) == 0, "launch: epoll_ctl failed: {}",
               std::strerror(errno));
}

Supervisor::Attempt::Attempt(Supervisor& sup, int attempt, const AttemptHooks& hooks)
    : sup_(sup),
      config_(sup.plan_.config),
      node_(sup.plan_.node),
      hooks_(hooks),
      observer_(sup.plan_.observer),
      attempt_(attempt),
      start_(Clock::now()),
      oomBefore_(readOomKillCount()),
      slots_(static_cast<size_t>(sup.plan_.node.localWorldSize)),
      buffer_(kReadChunk) {
  result_.attempt = attempt;
}

AttemptResult Supervisor::Attempt::run() {
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

void Supervisor::Attempt::spawnWorkers() {
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i) spawnWorker(i);
  DTRAIN_LOG(Info, "launch: attempt {}: started {} workers in {:.1f} ms", attempt_, slots_.size(),
             seconds() * 1e3);
}

void Supervisor::Attempt::spawnWorker(int i) {
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
    const std::string prefix = expandLinePrefix(config_.linePrefixTemplate, s.rank, i, config_.role,
                                                attempt_, node_.nodeRank);
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

bool Supervisor::Attempt::pump(Slot& s, FdKind kind) {
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

void Supervisor::Attempt::onStatus(Slot& s) {
  bool eof = false;
  for (const auto& m : readGuardianMessages(s.guarded.statusFd, &eof)) {
    switch (m.kind) {
      case GuardianMessage::kStarted:
        s.outcome.pid = m.value;
        if (observer_) observer_->workerStarted(s.rank, s.localRank, s.outcome.pid);
        break;
      case GuardianMessage::kExecFailed: s.execErrno = m.value; break;
      case GuardianMessage::kSpawnFailed:
        s.outcome.lostReason = fmt::format("its guardian could not fork the worker: {}",
                                           std::strerror(m.value));
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
          // A signal launch did not send, under --on-node-loss continue: this node is lost, the
          // round is not stopped (Note [Node loss]); a non-zero exit stops it as always.
          const bool nodeLost = hooks_.signalLosesNode && !s.askedToStop &&
                                s.outcome.state == WorkerOutcome::State::Signaled;
          beginTeardown(fmt::format("rank {} (pid {}) on {} {}", s.rank, s.outcome.pid, node_.host,
                                    describeOutcome(s.outcome)),
                        nodeLost);
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

int Supervisor::Attempt::nextTimeoutMs() const {
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

bool Supervisor::Attempt::anyStatusOpen() const {
  return std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.statusOpen; });
}

void Supervisor::Attempt::superviseUntilEveryWorkerEnded() {
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

void Supervisor::Attempt::drainOutput() {
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

void Supervisor::Attempt::gatherFacts() {
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

}  // namespace dtrain::launcher
