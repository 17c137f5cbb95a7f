#pragma once
// One node's agent process as the fan-out master sees it: `ssh ... HOST 'exec launch --agent ...'`
// for another host, or `launch --agent` as a child on the master's own host -- the same agent
// either way, its plan written to its stdin, which then stays open: when the master dies, the
// pipe (or the ssh channel) closes and the agent stops its workers. Its stdout and stderr reach
// the master's console as whole lines; the last stderr lines are kept to explain a failed ssh.

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "launcher/supervisor/output.h"

namespace dtrain::launcher::remote {

class Session {
 public:
  // Starts `argv` (argv[0] looked up on PATH) with `env` ("KEY=VALUE") in a process group of its
  // own (a Ctrl-C on the master's terminal reaches the master only, which stops the job in
  // order), dying with the master (PR_SET_PDEATHSIG), and writes `stdinData` to its stdin.
  // Throws dtrain::Error naming the host when the fork or a pipe fails, or when `stdinData` does
  // not fit the pipe (checked before anything starts).
  // `captureStdout`: keep its stdout lines (stdoutLines()) instead of showing them.
  Session(std::string node, std::string host, const std::vector<std::string>& argv,
          const std::vector<std::string>& env, const std::string& stdinData,
          bool captureStdout = false);
  ~Session();  // SIGKILLs the process group if still running, reaps it
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const std::string& node() const { return node_; }
  const std::string& host() const { return host_; }
  pid_t pid() const { return pid_; }

  // Descriptors to poll (stdout, stderr; -1 once closed).
  int stdoutFd() const { return outFd_; }
  int stderrFd() const { return errFd_; }
  // Readable once the process exited (a pidfd); -1 after reap() or where the kernel has no
  // pidfd_open (then poll reap() on a timer).
  int exitFd() const { return pidFd_; }
  // Reads what is ready on `fd` and forwards whole lines: 1 read some, 0 nothing ready, -1 the
  // stream ended (fd closed).
  int pump(int fd);
  // Pumps both streams until nothing is ready.
  void drain();
  // Reaps the process if it exited (non-blocking). True once it has.
  bool reap();
  bool exited() const { return exited_; }
  int waitStatus() const { return status_; }
  // "exited with code 255" / "was killed by SIGKILL".
  std::string describeExit() const;
  const std::deque<std::string>& stderrTail() const;
  const std::deque<std::string>& stdoutLines() const;
  // Closes stdin (the agent then stops its workers and exits) and, after `graceSeconds`,
  // SIGTERMs the process group, after as long again SIGKILLs it; returns once it is reaped, or
  // `graceSeconds` after the SIGKILL (a process that outlives SIGKILL is not waited for).
  void finish(double graceSeconds);
  // Closes stdin: the agent's signal that the master is done.
  void closeStdin();

 private:
  using Clock = std::chrono::steady_clock;
  // Reaps the process, pumping its output meanwhile, until `deadline`; false if still running.
  bool waitExit(Clock::time_point deadline);

  std::string node_;
  std::string host_;
  pid_t pid_ = -1;
  int inFd_ = -1;
  int outFd_ = -1;
  int errFd_ = -1;
  int pidFd_ = -1;
  std::unique_ptr<WorkerStream> out_;
  std::unique_ptr<WorkerStream> err_;
  bool exited_ = false;
  int status_ = 0;
};

}  // namespace dtrain::launcher::remote
