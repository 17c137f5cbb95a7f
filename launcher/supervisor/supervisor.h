#pragma once
// The Supervisor runs one node's workers: spawns them (each under a guardian, see Note
// [Guardians]), multiplexes their output, notices the first failure within milliseconds, stops
// the others (SIGTERM, SIGKILL after the grace period), restarts the whole group while the
// restart budget lasts, and finally prints the root-cause report and returns launch's exit code.
//
// One thread does it all: a single epoll loop over every worker's stdout, stderr and status pipe
// and a signalfd for the launcher's own signals. See Note [One event loop].

#include <csignal>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "launcher/config/launch_config.h"
#include "launcher/node/program.h"
#include "launcher/node/worker_env.h"
#include "launcher/supervisor/failure_report.h"
#include "launcher/supervisor/job_observer.h"

namespace dtrain::launcher {

// Note [One event loop]
// ~~~~~~~~~~~~~~~~~~~~~
// A thread per pipe would cost 2N+ threads on a 2-core machine and still need a lock around the
// console to keep lines whole. Instead one epoll set holds every pipe (level-triggered, one read
// of at most 64 KiB per ready pipe per turn, so a flooding worker cannot starve the others or the
// status pipes), the signalfd, and a timeout for the SIGKILL deadline. Crash detection latency is
// the guardian's pidfd wake-up plus one pipe write: milliseconds, with no polling interval.

// Note [Exit barrier]
// ~~~~~~~~~~~~~~~~~~~
// A worker exiting 0 while others run is not a failure (ranks finish seconds apart), but waiting
// for the rest without a bound turns one rank stuck after the end of training -- in a loop, in
// I/O, on a lock of its own threads, outside any collective that would time out -- into a job
// that never ends. torchrun bounds the same wait with its agent's exit barrier
// (exit_barrier_timeout, 300 s). So: once the first worker of an attempt exits 0, every other
// worker of that attempt must end within --exit-barrier-timeout seconds (default 300, 0: no
// limit); otherwise launch prints which ranks were still running and how long after the first
// success, tears the job down like after a failure (SIGTERM, SIGKILL after the grace period) and
// exits 124 ("a deadline passed", docs/design.md#exit-codes). The deadline is the event loop's
// epoll timeout, like the SIGKILL deadline: no polling. A failure (non-zero exit, signal) before
// the deadline stops the job as usual and the barrier no longer matters.
//
// A timed-out exit barrier does not consume a restart under --max-restarts: like torchrun, whose
// agent never retries a worker group after it has started its exit barrier, launch ends the job.
// Some ranks have finished -- their final checkpoint, metrics and outputs are written -- and a
// restart would run all of them again (redoing the last epoch, overwriting results) to probably
// get stuck in the same place; the restart budget is for failures, which a rank stuck after
// success is not yet. The report says so, and the user decides.

// Note [Last deadline]
// ~~~~~~~~~~~~~~~~~~~~
// SIGKILL ends a process only when it next returns towards user space. One in uninterruptible
// sleep (state D: blocked in the kernel on a hung NFS or FUSE mount, a wedged device or GPU
// driver, a frozen cgroup) does not, however long it takes -- and its guardian, which reports a
// worker's end only once nothing of it is left, would keep launch waiting for ever. So SIGKILL
// starts the last deadline, --kill-timeout seconds (60: ample for a process that is merely slow
// to exit, such as one freeing a large GPU context). When it passes, launch names every process
// still there -- rank, pid, its state and where in the kernel it waits, its command line -- closes
// its side of their guardians' pipes, and exits 125 (launcher or infrastructure error) whatever
// else happened: it could not end the job, and what the survivors hold (GPU memory, ports) is
// not free for the next one. No restart follows. Each guardian stays with its survivor, kills
// what is left and removes the temporary job directory once the survivor finally ends (Note
// [Guardians]). The tests hold a worker past SIGKILL in two honest ways: a real state D, by
// putting it in a frozen cgroup-v1 freezer (where the machine has one), and a ptrace exit stop
// (the test traces the worker with PTRACE_O_TRACEEXIT and never lets it finish exiting), which
// any Linux allows a root or same-user tracer.

// Note [Job control]
// ~~~~~~~~~~~~~~~~~~
// Workers run in process groups of their own (so a signal to one worker's group reaches its
// children and nobody else's), which puts them outside the terminal's foreground group: Ctrl-Z
// would stop launch and leave the workers training unsupervised, and a worker reading the
// terminal would be stopped by SIGTTIN (and N workers would race for the keyboard). So workers'
// stdin is /dev/null, and launch handles job control itself: on SIGTSTP (Ctrl-Z, or kill -TSTP)
// it sends SIGSTOP to
// every worker's group and then stops itself with SIGSTOP; the shell sees a stopped job. On
// SIGCONT (fg, bg, kill -CONT) it sends SIGCONT to every worker's group, and the time spent
// stopped does not count against --grace-period, --exit-barrier-timeout or --kill-timeout.
// Guardians ignore SIGTSTP, SIGTTIN and SIGTTOU (they share launch's process group, so the
// terminal sends them Ctrl-Z too) so they can pass SIGCONT on. The workers' own timeouts (a
// store wait, a collective) run on the clock, which does not stop: a wait in flight when the job
// was stopped for longer than its timeout fails on resume.

// The signals launch forwards and then tears the job down for.
constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// The job-control signals launch handles itself (see Note [Job control]).
constexpr int kJobControlSignals[] = {SIGTSTP, SIGCONT};

// Blocks kForwardedSignals and kJobControlSignals in the calling thread (and so in threads it
// starts later, such as the
// store server's) so the supervisor can read them from a signalfd; ignores SIGPIPE. Call before
// starting any thread.
void blockLauncherSignals();

// Everything resolved before the first worker starts.
struct JobPlan {
  LaunchConfig config;
  WorkerCommand command;
  NodeContext node;            // with localWorldSize, ports, token, jobDir, inherited environment
  bool logAllStreams = false;  // --log-dir: every stream of every rank gets a log file
  std::string logHint;         // for the report when a stream has no log file
  // node.jobDir is launch's temporary directory, removed when the job ends -- by the guardians
  // if launch is killed (see Note [Temporary job directory]).
  bool temporaryJobDir = false;
  JobObserver* observer = nullptr;  // told what starts and ends (the monitor); may be null
};

// What a node's agent adds to one attempt in a multi-node job (launcher/cluster/agent/agent.h).
struct AttemptHooks {
  // Readable (an eventfd): stop the workers -- another node failed, or the master said so.
  int stopFd = -1;
  // Called once, when this node begins stopping its workers for a reason of its own (a worker
  // failed, launch was signalled, the exit barrier timed out), so the other nodes stop too.
  std::function<void(const std::string& why)> onTeardown;
  // --on-node-loss continue (Note [Node loss] in launcher/cluster/master/node_loss.h): a worker
  // killed by a signal launch did not send stops this node's other workers as a failure does, but
  // without onTeardown -- the round goes on elsewhere; the result says why (nodeLost).
  bool signalLosesNode = false;
};

class Supervisor : public JobControl {
 public:
  explicit Supervisor(JobPlan plan);
  ~Supervisor() override;
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Runs attempts until every worker exits 0, a failure outlasts the restart budget, or launch is
  // signalled. Prints the failure report (stderr) and returns launch's exit code.
  int run();

  // JobControl: any thread; the event loop picks it up at once (an eventfd in its epoll set).
  void stopForDeadline(const std::string& reason) override;

  // One attempt of this node's workers (the agent of a multi-node job runs them one by one, as
  // the master decides): spawn, supervise, stop, gather the facts.
  AttemptResult runAttempt(int attempt, const AttemptHooks& hooks = {});
  // The node's context for the next attempt (a multi-node round may renumber it).
  void setNode(const NodeContext& node) { plan_.node = node; }

 private:
  struct Slot;
  class Attempt;  // the steps of one attempt: see Note [Attempt steps] in attempt.h

  JobPlan plan_;
  int signalFd_ = -1;
  int epollFd_ = -1;
  int deadlineFd_ = -1;  // eventfd: stopForDeadline() was called
  std::mutex deadlineMutex_;
  std::string deadlineReason_;  // guarded by deadlineMutex_
};

}  // namespace dtrain::launcher
