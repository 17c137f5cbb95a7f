#pragma once
// A guarded worker: the launcher forks one small guardian process per worker, and the guardian
// vforks the worker into a process group of its own. See Note [Guardians].
//
// The launcher talks to a guardian over two pipes. On the control pipe it writes one byte per
// signal to send to the worker's process group; when the control pipe closes -- the launcher
// exited, crashed or was SIGKILLed -- the guardian SIGKILLs the worker's group and every process
// left under it, reaps them all and exits. On the status pipe the guardian reports the worker's
// pid, an exec failure, and the worker's wait status, and then closes it when nothing of the
// worker is left.

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::launcher {

// Note [Guardians]
// ~~~~~~~~~~~~~~~~
// "No process outlives the job", even when the launcher is SIGKILLed. PR_SET_PDEATHSIG on the
// worker alone does not give that: the death signal is cleared in the worker's own children, and
// it fires when the *thread* that forked the worker exits, not the process. A guardian per worker
// does:
//   - it is forked (not exec'd) from the launcher and closes every inherited descriptor except
//     its own four, so the read end of its control pipe reaches EOF exactly when the launcher is
//     gone -- including SIGKILL, which no handler sees;
//   - it is a child subreaper (PR_SET_CHILD_SUBREAPER), so descendants of the worker that leave
//     its process group (setsid, double fork) are reparented to the guardian, which finds them in
//     /proc/thread-self/children and SIGKILLs them too;
//   - the worker is its child, so the guardian gets the worker's real wait status (a pidfd wakes
//     it at once: crash detection in milliseconds), and signals reach the worker's group through
//     the guardian, which kills what is left of the group while the worker is still an unreaped
//     zombie -- so a group id is never signalled after its number could have been reused;
//   - the worker carries PR_SET_PDEATHSIG(SIGKILL) towards its single-threaded guardian, for the
//     case that someone SIGKILLs the guardian itself.
// Between fork and exec only async-signal-safe calls run (the launcher has other threads: the
// store server's event loop), so everything the child needs is prepared before fork().

// Note [Temporary job directory]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Without --log-dir, launch keeps the workers' error files (TORCHELASTIC_ERROR_FILE) under a
// fresh $TMPDIR/dtrain-<run id>-XXXXXX and removes it when the job ends. A SIGKILLed launch runs
// no code, so that removal falls to the guardians, which outlive it by design: when a guardian's
// control pipe reaches EOF (the launcher is gone) it first kills everything of its worker, then
// removes the directory (SpawnSpec::removeOnLauncherDeath). Every live guardian does this; they
// may race, which is harmless (ENOENT is success), and the last one to start finds every worker
// already dead, so nothing can be written into the tree after it. The removal uses raw system
// calls only (openat, getdents64, unlinkat: async-signal-safe, see Note [Guardians]), never
// follows a symbolic link, and stops at a fixed depth.
//   The other way -- the next launch deletes dtrain-* directories whose owner pid is gone -- was
// rejected: the directory would stay until someone launches again (and on a node that never
// does, for ever), and "owner pid gone" is a guess that is wrong when /tmp is shared between pid
// namespaces (containers) or hosts, where it would delete a live job's files. The guardians know
// for certain that their launcher is dead, and act within milliseconds.
//   What is left: a directory whose logs the user asked for (--redirects/--tee without
// --log-dir: launch prints its path, and it is kept on purpose), and a launcher killed together
// with all its guardians (SIGKILL to the whole process group, or a cgroup kill), or in the
// milliseconds when no guardian runs (before the first spawn, between attempts, after the last
// worker ended) -- then an empty-ish directory of a few error files stays in $TMPDIR.

// One fixed-size record on the status pipe (atomic: smaller than PIPE_BUF).
struct GuardianMessage {
  enum Kind : int32_t {
    kStarted = 1,      // value: the worker's pid
    kExecFailed = 2,   // value: errno of execve (the worker then exits 127 or 126)
    kExited = 3,       // value: the worker's wait status
    kSpawnFailed = 4,  // value: errno of fork in the guardian
  };
  int32_t kind = 0;
  int32_t value = 0;
};

struct SpawnSpec {
  std::string file;  // path for execve
  std::vector<std::string> argv;
  std::vector<std::string> env;  // "KEY=VALUE"
  // A directory the guardian removes, with everything in it, if the launcher dies while the
  // worker runs; empty: none. See Note [Temporary job directory].
  std::string removeOnLauncherDeath;
};

struct GuardedWorker {
  pid_t guardianPid = -1;
  int controlFd = -1;  // write end; close it to make the guardian kill everything
  int statusFd = -1;   // read end, non-blocking
  int stdoutFd = -1;   // read end, non-blocking
  int stderrFd = -1;   // read end, non-blocking
};

// Forks the guardian (which forks the worker) and returns at once. Throws dtrain::Error naming
// the call and errno when a pipe or the fork fails.
GuardedWorker spawnGuarded(const SpawnSpec& spec);

// Asks the guardian to send `signo` to the worker's process group (followed by SIGCONT, so a
// stopped worker acts on it, unless `signo` stops it). False when the guardian is gone.
bool signalGuarded(int controlFd, int signo);

// Reads every complete record available on a non-blocking status fd. Sets *eof when the guardian
// closed it.
std::vector<GuardianMessage> readGuardianMessages(int statusFd, bool* eof);

}  // namespace dtrain::launcher
