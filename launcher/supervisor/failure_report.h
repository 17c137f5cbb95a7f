#pragma once
// What happened to each worker, which failure was the root cause, the launcher's exit code
// (docs/design.md#exit-codes) and the report printed when a job fails -- root cause first: host,
// global and local rank, pid, exit code or signal name (with OOM evidence), log path, the last
// stderr lines and the message of its TORCHELASTIC_ERROR_FILE; then the other workers.
//
// Everything here is a pure function of plain structs, so the report is tested by tables; the
// supervisor gathers the facts (wait statuses, tails, error files, kernel log) and calls in.

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::launcher {

struct WorkerOutcome {
  enum class State { Running, Exited, Signaled, ExecFailed, Lost };

  int rank = 0;
  int localRank = 0;
  pid_t pid = -1;
  State state = State::Running;
  int exitCode = 0;  // Exited
  int signal = 0;    // Signaled
  bool coreDumped = false;
  int execErrno = 0;             // ExecFailed
  std::string lostReason;        // Lost: what happened to its guardian
  double endSeconds = 0;         // when it ended, seconds after the attempt started
  bool stoppedByLaunch = false;  // it ended after launch asked it to stop (not a root cause)
  bool wasStopped = false;       // it was in state T (SIGSTOP) when the teardown began
  std::string stderrLog;         // path, or empty when no log file was kept
  std::vector<std::string> stderrTail;
  std::string errorFileMessage;  // summary of its error file; empty when it wrote none
  std::string oomNote;           // "likely killed by the OOM killer (...)"; empty when no evidence
  std::string host;              // its node, in a multi-node job; empty: the report's host
  bool lostToDeadline = false;   // Lost because its node stopped answering heartbeats (exit 124)
  // Lost with its node, and the job went on without it (--on-node-loss continue; Note [Node
  // loss] in launcher/cluster/master/node_loss.h): reported, never the root cause.
  bool leftBehind = false;

  bool failed() const;  // non-zero exit, signal, exec failure, lost
};

// The exit barrier of one attempt when it timed out (see Note [Exit barrier] in supervisor.h):
// a rank exited 0 and others were still running `timeoutSeconds` later.
struct ExitBarrierTimeout {
  struct Straggler {
    int rank = 0;
    int localRank = 0;
    pid_t pid = -1;
    double runningFor = 0;  // seconds after the first rank exited 0
  };
  bool timedOut = false;
  double timeoutSeconds = 0;
  int firstRank = -1;                   // the first rank that exited 0
  double firstExitSeconds = 0;          // when, seconds after the attempt started
  std::vector<Straggler> stillRunning;  // when the barrier timed out
};

// A process of a worker that still existed --kill-timeout seconds after launch SIGKILLed it: in
// uninterruptible sleep (state D), or held by something outside the job (see Note [Last
// deadline] in supervisor.h).
struct Survivor {
  int rank = 0;
  int localRank = 0;
  pid_t pid = -1;
  bool isWorker = false;  // the worker itself; else a process under it (or its guardian)
  std::string state;      // "D (disk sleep)"
  std::string waitingIn;  // the kernel function it sleeps in; may be empty
  std::string command;
};

struct AttemptResult {
  int attempt = 0;
  std::vector<WorkerOutcome> workers;
  int launcherSignal = 0;            // a signal launch received during this attempt
  bool signalBeforeFailure = false;  // it arrived before any worker failed
  ExitBarrierTimeout exitBarrier;
  std::vector<Survivor> survivors;  // non-empty: launch gave up on them and exits 125
  double killTimeout = 0;           // how long it waited after SIGKILL
  // An observer stopped the job because a deadline passed (--stall-action stop): what it said.
  std::string deadlineStop;
  // --on-node-loss continue: this node's workers were killed by a signal launch did not send;
  // the agent stopped the others without stopping the round, and the master takes the node as
  // lost (Note [Node loss]). What happened, e.g. "rank 5 (pid 812) was killed by SIGKILL".
  std::string nodeLost;
};

// Index into `workers` of the root cause: the earliest failure launch did not cause itself
// (stopping the others after it is not a failure of theirs). -1 when none.
int rootCauseIndex(const std::vector<WorkerOutcome>& workers);

// The exit code of one failed worker: its own code, 128+N for signal N, 126/127 for exec
// failures, 125 when its guardian was lost.
int workerExitCode(const WorkerOutcome& w);

// The launcher's exit code after its last attempt (docs/design.md#exit-codes).
int launcherExitCode(const AttemptResult& last);

// "launch: exit barrier timed out: ..." -- the line printed when it happens, before the teardown.
std::string formatExitBarrierLine(const ExitBarrierTimeout& barrier, const std::string& option,
                                  double gracePeriod);

// "exited with code 3", "was killed by SIGSEGV (signal 11, core dumped)", ...
std::string describeOutcome(const WorkerOutcome& w);

// The category of an exit code of launch, for the first line of the report.
std::string exitCodeMeaning(int code, const AttemptResult& last);

struct ReportContext {
  std::string host;
  std::string runId;
  int maxRestarts = 0;
  double gracePeriod = 0;
  std::string logHint;                                       // where logs are, or how to keep them
  std::string exitBarrierOption = "--exit-barrier-timeout";  // as the user gave it
  std::string killTimeoutOption = "--kill-timeout";          // as the user gave it
};

// "launch: gave up on ..." -- the line printed when the last deadline passes.
std::string formatSurvivorsLine(const std::vector<Survivor>& survivors, double killTimeout);

// The failure report of the whole job: `attempts` in order, the last one decides.
std::string formatFailureReport(const ReportContext& ctx,
                                const std::vector<AttemptResult>& attempts);

// One line for a failed attempt that will be restarted.
std::string formatRestartLine(const AttemptResult& attempt, int restart, int maxRestarts);

// Summary of a TORCHELASTIC_ERROR_FILE's content (`fileSize` the whole file, `content` what was
// read of it, possibly cut short). Never throws: garbage, truncation or a missing message give a
// note saying so and a printable excerpt.
std::string summarizeErrorFile(const std::string& content, int64_t fileSize);

// Reads and summarises the error file at `path`: empty when there is none.
std::string readErrorFile(const std::string& path);

// Printable: control characters escaped, at most `max` bytes.
std::string printable(const std::string& text, size_t max);

}  // namespace dtrain::launcher
