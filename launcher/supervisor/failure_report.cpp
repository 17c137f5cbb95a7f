#include "launcher/supervisor/failure_report.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "fault.h"
#include "launcher/exit_codes.h"

namespace dtrain::launcher {

namespace {

constexpr size_t kErrorFileReadLimit = 1 << 20;  // read at most this much of an error file
constexpr size_t kMessageLimit = 4000;
constexpr size_t kReportTailLines = 10;

std::string indentLines(const std::string& text, const std::string& indent) {
  std::string out;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    out += indent + text.substr(start, nl == std::string::npos ? nl : nl - start) + "\n";
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  return out;
}

std::string signalText(int sig) {
  return fmt::format("{} (signal {})", fault::signalName(sig), sig);
}

}  // namespace

bool WorkerOutcome::failed() const {
  switch (state) {
    case State::Exited: return exitCode != 0;
    case State::Signaled:
    case State::ExecFailed:
    case State::Lost: return true;
    case State::Running: return false;
  }
  return false;
}

int rootCauseIndex(const std::vector<WorkerOutcome>& workers) {
  int best = -1;
  for (size_t i = 0; i < workers.size(); ++i) {
    const auto& w = workers[i];
    if (!w.failed() || w.stoppedByLaunch || w.leftBehind) continue;
    if (best < 0 || w.endSeconds < workers[best].endSeconds) best = static_cast<int>(i);
  }
  return best;
}

int workerExitCode(const WorkerOutcome& w) {
  switch (w.state) {
    case WorkerOutcome::State::Exited: return w.exitCode;
    case WorkerOutcome::State::Signaled: return 128 + w.signal;
    case WorkerOutcome::State::ExecFailed:
      return w.execErrno == ENOENT || w.execErrno == ENOTDIR ? 127 : 126;
    case WorkerOutcome::State::Lost: return w.lostToDeadline ? kExitDeadline : 125;
    case WorkerOutcome::State::Running: return 125;
  }
  return 125;
}

int launcherExitCode(const AttemptResult& last) {
  // Processes of the job are left behind: whatever else happened, launch could not end the job.
  if (!last.survivors.empty()) return kExitInfrastructure;
  int root = rootCauseIndex(last.workers);
  // The barrier times out only while nothing failed and launch was not signalled (both stop the
  // job first); a signal during its teardown does not change what ended the job.
  if (last.exitBarrier.timedOut && root < 0 && !last.signalBeforeFailure) return kExitDeadline;
  if (!last.deadlineStop.empty() && root < 0 && !last.signalBeforeFailure) return kExitDeadline;
  if (last.launcherSignal != 0 && (root < 0 || last.signalBeforeFailure)) {
    // Preemption: launch got SIGTERM and every worker checkpointed and exited 75.
    bool allPreempted = !last.workers.empty();
    for (const auto& w : last.workers) {
      allPreempted = allPreempted && w.state == WorkerOutcome::State::Exited &&
                     w.exitCode == kExitPreempted;
    }
    if (last.launcherSignal == SIGTERM && allPreempted) return kExitPreempted;
    return 128 + last.launcherSignal;
  }
  if (root >= 0) return workerExitCode(last.workers[root]);
  return 0;
}

std::string describeOutcome(const WorkerOutcome& w) {
  switch (w.state) {
    case WorkerOutcome::State::Running: return "was still running";
    case WorkerOutcome::State::Exited:
      return w.exitCode == 0 ? "exited with code 0"
                             : fmt::format("exited with code {}", w.exitCode);
    case WorkerOutcome::State::Signaled: {
      std::string s = "was killed by " + signalText(w.signal);
      if (w.coreDumped) s += ", core dumped";
      if (!w.oomNote.empty()) s += " -- " + w.oomNote;
      return s;
    }
    case WorkerOutcome::State::ExecFailed:
      return fmt::format("could not be executed: {}", std::strerror(w.execErrno));
    case WorkerOutcome::State::Lost: return "was lost: " + w.lostReason;
  }
  return "?";
}

std::string exitCodeMeaning(int code, const AttemptResult& last) {
  int root = rootCauseIndex(last.workers);
  if (code == 0) return "every worker exited 0";
  if (code == kExitInfrastructure && !last.survivors.empty()) {
    return "launcher or infrastructure error: processes of the job survived SIGKILL";
  }
  if (code == kExitDeadline && last.exitBarrier.timedOut && root < 0) {
    return "a deadline passed: the exit barrier timed out";
  }
  if (code == kExitDeadline && !last.deadlineStop.empty() && root < 0) {
    return "a deadline passed: " + last.deadlineStop;
  }
  if (code == kExitPreempted && last.launcherSignal == SIGTERM) {
    return "preempted: every worker checkpointed on SIGTERM; requeue and rerun to resume";
  }
  if (last.launcherSignal != 0 && code == 128 + last.launcherSignal) {
    return fmt::format("launch itself received {}", signalText(last.launcherSignal));
  }
  if (root >= 0) {
    const auto& w = last.workers[root];
    switch (w.state) {
      case WorkerOutcome::State::Signaled:
        return fmt::format("128+{}: the root-cause worker was killed by {}", w.signal,
                           fault::signalName(w.signal));
      case WorkerOutcome::State::ExecFailed:
        return code == 127 ? "the program was not found" : "the program could not be executed";
      case WorkerOutcome::State::Lost:
        return w.lostToDeadline ? "a deadline passed: a node stopped answering heartbeats"
                                : "launcher or infrastructure error";
      default:
        return code >= 124 ? "the root-cause worker's own exit code, passed through (not a "
                             "launch error)"
                           : "the root-cause worker's own exit code";
    }
  }
  return "launcher or infrastructure error";
}

std::string printable(const std::string& text, size_t max) {
  std::string out;
  for (size_t i = 0; i < text.size() && out.size() < max; ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n' || c == '\t' || (c >= 0x20 && c != 0x7f)) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (out.size() >= max && text.size() > max) out += "...";
  return out;
}

std::string summarizeErrorFile(const std::string& content, int64_t fileSize) {
  const bool cut = fileSize > static_cast<int64_t>(content.size());
  std::string sizeNote = cut ? fmt::format(" (the file is {} bytes; read the first {})", fileSize,
                                           content.size())
                             : "";
  if (content.find_first_not_of(" \t\r\n") == std::string::npos) {
    return "the error file is empty" + sizeNote;
  }
  nlohmann::json doc = nlohmann::json::parse(content, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return fmt::format("the error file is not valid JSON{}; it begins: {}", sizeNote,
                       printable(content, 300));
  }
  // torchrun's format: {"message": {"message": "...", "extraInfo": {"py_callstack": ...}}},
  // or {"message": "..."}.
  const nlohmann::json* message = nullptr;
  if (doc.is_object() && doc.contains("message")) message = &doc["message"];
  std::string text;
  if (message && message->is_string()) {
    text = message->get<std::string>();
  } else if (message && message->is_object() && message->contains("message") &&
             (*message)["message"].is_string()) {
    text = (*message)["message"].get<std::string>();
    const auto& extra = message->value("extraInfo", nlohmann::json::object());
    if (extra.is_object() && extra.contains("py_callstack") && extra["py_callstack"].is_string()) {
      text += "\n" + extra["py_callstack"].get<std::string>();
    }
  } else {
    return fmt::format("the error file has no \"message\" string{}; it begins: {}", sizeNote,
                       printable(content, 300));
  }
  return printable(text, kMessageLimit) + sizeNote;
}

std::string readErrorFile(const std::string& path) {
  if (path.empty()) return "";
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return errno == ENOENT ? "" : fmt::format("cannot read {}: {}", path, std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return fmt::format("{} is not a regular file", path);
  }
  std::string content;
  content.resize(std::min<size_t>(kErrorFileReadLimit, static_cast<size_t>(st.st_size)));
  size_t got = 0;
  while (got < content.size()) {
    ssize_t n = ::read(fd, content.data() + got, content.size() - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  content.resize(got);
  return summarizeErrorFile(content, st.st_size);
}

std::string formatRestartLine(const AttemptResult& attempt, int restart, int maxRestarts) {
  int root = rootCauseIndex(attempt.workers);
  std::string what = root >= 0 ? fmt::format("rank {} (pid {}) {}", attempt.workers[root].rank,
                                             attempt.workers[root].pid,
                                             describeOutcome(attempt.workers[root]))
                               : "no root cause";
  return fmt::format("launch: attempt {} failed: {}; restarting all workers (restart {} of {})\n",
                     attempt.attempt, what, restart, maxRestarts);
}

std::string formatExitBarrierLine(const ExitBarrierTimeout& barrier, const std::string& option,
                                  double gracePeriod) {
  std::string ranks;
  for (const auto& s : barrier.stillRunning) {
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(s.rank);
  }
  return fmt::format("launch: exit barrier timed out: rank {} exited 0 {:g} s ago ({} {:g}) and "
                     "rank{} {} {} still running; stopping the workers (SIGTERM, SIGKILL after "
                     "{:g} s)\n",
                     barrier.firstRank, barrier.timeoutSeconds, option, barrier.timeoutSeconds,
                     barrier.stillRunning.size() == 1 ? "" : "s", ranks,
                     barrier.stillRunning.size() == 1 ? "is" : "are", gracePeriod);
}

namespace {

// The report's head when the exit barrier timed out: who was still running, and what to do.
std::string formatExitBarrierReport(const ReportContext& ctx, const AttemptResult& last, int code) {
  const ExitBarrierTimeout& b = last.exitBarrier;
  std::string out = fmt::format(
      "launch: job failed: exit barrier timed out: rank {} exited 0 at {:.2f} s, and {} rank{} "
      "{} still running {:g} s later (exit code {}: {})\n",
      b.firstRank, b.firstExitSeconds, b.stillRunning.size(), b.stillRunning.size() == 1 ? "" : "s",
      b.stillRunning.size() == 1 ? "was" : "were", b.timeoutSeconds, code,
      exitCodeMeaning(code, last));
  out += fmt::format("  still running when the exit barrier timed out ({} {:g}; attempt {}, "
                     "run {}, host {}):\n",
                     ctx.exitBarrierOption, b.timeoutSeconds, last.attempt, ctx.runId, ctx.host);
  for (const auto& s : b.stillRunning) {
    out += fmt::format("    rank {} (local rank {}, pid {}): still running {:.2f} s after rank {} "
                       "exited 0\n",
                       s.rank, s.localRank, s.pid > 0 ? std::to_string(s.pid) : "unknown",
                       s.runningFor, b.firstRank);
    for (const auto& w : last.workers) {
      if (w.rank != s.rank) continue;
      out += fmt::format("      stderr log:  {}\n",
                         w.stderrLog.empty() ? ctx.logHint : w.stderrLog);
      size_t from = w.stderrTail.size() > kReportTailLines ? w.stderrTail.size() - kReportTailLines
                                                           : 0;
      if (from < w.stderrTail.size()) out += "      last stderr lines:\n";
      for (size_t i = from; i < w.stderrTail.size(); ++i) {
        out += "        | " + printable(w.stderrTail[i], 600) + "\n";
      }
    }
  }
  out += fmt::format("  HINT: every rank should finish soon after the first one does; a rank that "
                     "keeps running is likely stuck outside collectives (a loop, I/O, a lock of "
                     "its own threads, a missing final barrier) -- see its last output. If ranks "
                     "legitimately finish far apart, raise {} (0: no limit).\n",
                     ctx.exitBarrierOption);
  return out;
}

}  // namespace

std::string formatSurvivorsLine(const std::vector<Survivor>& survivors, double killTimeout) {
  std::string pids;
  for (const auto& s : survivors) {
    pids += fmt::format("{}pid {} in state {}", pids.empty() ? "" : ", ", s.pid, s.state);
  }
  return fmt::format("launch: {} process{} of the job still exist{} {:g} s after SIGKILL: {}; "
                     "giving up on {}\n",
                     survivors.size(), survivors.size() == 1 ? "" : "es",
                     survivors.size() == 1 ? "s" : "", killTimeout, pids,
                     survivors.size() == 1 ? "it" : "them");
}

namespace {

// The report's head when processes survived SIGKILL: who, in which state, running what.
std::string formatSurvivorsReport(const ReportContext& ctx, const AttemptResult& last, int code) {
  std::string out = fmt::format(
      "launch: job failed: {} process{} of the job survived SIGKILL for {:g} s ({} {:g}; exit "
      "code {}: {})\n",
      last.survivors.size(), last.survivors.size() == 1 ? "" : "es", last.killTimeout,
      ctx.killTimeoutOption, last.killTimeout, code, exitCodeMeaning(code, last));
  out += fmt::format("  left behind (attempt {}, run {}, host {}):\n", last.attempt, ctx.runId,
                     ctx.host);
  for (const auto& s : last.survivors) {
    out += fmt::format("    rank {} (local rank {}): pid {}{}, state {}{}\n", s.rank, s.localRank,
                       s.pid, s.isWorker ? " (the worker)" : "", s.state,
                       s.waitingIn.empty() ? "" : ", waiting in " + s.waitingIn);
    out += fmt::format("      command: {}\n", s.command);
  }
  out += "  HINT: state D (uninterruptible sleep) is a process blocked in the kernel -- on a hung "
         "file system (NFS, FUSE), a device or its driver (a GPU), or a frozen cgroup -- and no "
         "signal ends it before that call returns; 't' is a process held by a debugger. Look at "
         "/proc/PID/stack (as root) and the kernel log (dmesg). Its guardian stays with it, kills "
         "whatever is left and cleans up once it ends; until then, what it holds (GPU memory, "
         "ports, files) is not free for a new job.\n";
  return out;
}

// The report's first lines: the root cause with everything known of it, or what ended the job.
std::string formatReportHead(const ReportContext& ctx, const AttemptResult& last, int code,
                             int root) {
  std::string out;
  if (last.exitBarrier.timedOut && root < 0 && !last.signalBeforeFailure) {
    out += formatExitBarrierReport(ctx, last, code);
  } else if (root >= 0 && !(last.launcherSignal != 0 && last.signalBeforeFailure)) {
    const auto& w = last.workers[root];
    out += fmt::format("launch: job failed: rank {} {} (exit code {}: {})\n", w.rank,
                       describeOutcome(w), code, exitCodeMeaning(code, last));
    out += fmt::format("  root cause (first failure; attempt {}, run {}, {:.2f} s after start):\n",
                       last.attempt, ctx.runId, w.endSeconds);
    out += fmt::format("    host:        {}\n", w.host.empty() ? ctx.host : w.host);
    out += fmt::format("    rank:        {} (local rank {})\n", w.rank, w.localRank);
    out += fmt::format("    pid:         {}\n",
                       w.pid > 0 ? std::to_string(w.pid) : "none (not started)");
    out += fmt::format("    cause:       {}\n", describeOutcome(w));
    if (!w.errorFileMessage.empty()) {
      out += "    error file:\n" + indentLines(w.errorFileMessage, "      ");
    }
    out += fmt::format("    stderr log:  {}\n", w.stderrLog.empty() ? ctx.logHint : w.stderrLog);
    if (!w.stderrTail.empty()) {
      size_t from = w.stderrTail.size() > kReportTailLines ? w.stderrTail.size() - kReportTailLines
                                                           : 0;
      out += "    last stderr lines:\n";
      for (size_t i = from; i < w.stderrTail.size(); ++i) {
        out += "      | " + printable(w.stderrTail[i], 600) + "\n";
      }
    }
  } else if (last.launcherSignal != 0) {
    out += fmt::format("launch: stopped: received {}; the workers were sent SIGTERM, then SIGKILL "
                       "after a {:g} s grace period (exit code {}: {})\n",
                       fault::signalName(last.launcherSignal), ctx.gracePeriod, code,
                       exitCodeMeaning(code, last));
  } else {
    out += fmt::format("launch: job ended with exit code {} ({})\n", code,
                       exitCodeMeaning(code, last));
  }
  return out;
}

// Every worker but the root cause, one line each.
std::string formatOtherWorkers(const AttemptResult& last, int root) {
  std::string out;
  bool header = false;
  for (size_t i = 0; i < last.workers.size(); ++i) {
    if (static_cast<int>(i) == root && !(last.launcherSignal != 0 && last.signalBeforeFailure)) {
      continue;
    }
    const auto& w = last.workers[i];
    if (!header) {
      out += root >= 0 ? "  other workers:\n" : "  workers:\n";
      header = true;
    }
    const std::string on = w.host.empty() ? "" : " on " + w.host;
    if (w.pid <= 0) {
      out += fmt::format("    rank {} (local rank {}{}) {}\n", w.rank, w.localRank, on,
                         describeOutcome(w));
      continue;
    }
    std::string note;
    if (w.wasStopped) note += " [it was stopped (SIGSTOP) when the teardown began: a hung rank?]";
    if (w.stoppedByLaunch) note += " after launch asked it to stop";
    out += fmt::format("    rank {} (local rank {}, pid {}{}) {}{} at {:.2f} s\n", w.rank,
                       w.localRank, w.pid, on, describeOutcome(w), note, w.endSeconds);
    if (w.failed() && !w.stoppedByLaunch && !w.errorFileMessage.empty()) {
      out += indentLines(printable(w.errorFileMessage, 600), "      error file: ");
    }
  }
  return out;
}

}  // namespace

std::string formatFailureReport(const ReportContext& ctx,
                                const std::vector<AttemptResult>& attempts) {
  if (attempts.empty()) return "";
  const AttemptResult& last = attempts.back();
  const int code = launcherExitCode(last);
  const int root = rootCauseIndex(last.workers);
  std::string out;
  if (!last.survivors.empty()) out += formatSurvivorsReport(ctx, last, code);
  out += formatReportHead(ctx, last, code, root);
  out += formatOtherWorkers(last, root);
  if (attempts.size() > 1 || ctx.maxRestarts > 0) {
    out += fmt::format("  attempts: {} ({} restart{} of at most {})\n", attempts.size(),
                       attempts.size() - 1, attempts.size() == 2 ? "" : "s", ctx.maxRestarts);
    for (size_t a = 0; a + 1 < attempts.size(); ++a) {
      int r = rootCauseIndex(attempts[a].workers);
      if (r >= 0) {
        const auto& w = attempts[a].workers[r];
        out += fmt::format("    attempt {}: rank {} {}\n", attempts[a].attempt, w.rank,
                           describeOutcome(w));
      }
    }
  }
  return out;
}

}  // namespace dtrain::launcher
