#pragma once
// Fault injection, off unless DTRAIN_FAULT / DTRAIN_IO_FAULT is set. One parser for the launcher's
// test worker, the runtime and the checkpointer. Grammar (docs/design.md#fault-injection says
// which kinds are implemented where):
//
//   DTRAIN_FAULT    = fault (";" fault)*
//   fault           = kind [":" arg] ["@" cond ("," cond)*]
//   cond            = ("rank" | "step" | "attempt") "=" integer        (absent = any)
//   kind            = exit:CODE | signal:NAME | abort | hang | stop | slow:MS | nan-grad
//                   | skip-collective | wrong-shape
//                     and, obeyed by the test worker only:
//                   | flood:LINES | grandchild | error-file:CODE
//
//   DTRAIN_IO_FAULT = iofault (";" iofault)*
//   iofault         = (open|write|fsync|rename) ":" ERRNO "@" N    (the N-th call of that op fails)
//                   | "crash@io=" K                                 (SIGKILL after the K-th I/O call)
//
// Example: DTRAIN_FAULT="signal:KILL@rank=3,step=17,attempt=0".

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::fault {

enum class Kind {
  Exit,            // exit(arg)
  Signal,          // raise(arg)
  Abort,           // abort()
  Hang,            // sleep forever (busy in a collective-free loop)
  Stop,            // raise(SIGSTOP)
  Slow,            // sleep arg milliseconds, then continue
  NanGrad,         // the runtime poisons a gradient with NaN
  SkipCollective,  // the runtime skips one collective (desync)
  WrongShape,      // the runtime passes a wrong-sized buffer to one collective
  Flood,           // test worker: print arg lines to stdout and stderr
  Grandchild,      // test worker: fork a grandchild that outlives its parent unless killed
  ErrorFile,       // test worker: write TORCHELASTIC_ERROR_FILE, then exit(arg)
};

struct Fault {
  Kind kind = Kind::Exit;
  int64_t arg = 0;   // exit code, signal number, milliseconds, lines
  int rank = -1;     // -1: any
  int64_t step = -1;
  int attempt = -1;

  bool matches(int rank, int64_t step, int attempt) const;
  std::string describe() const;  // back in the grammar above
};

// Throws InvalidArgument naming the variable, the offending part and the accepted forms.
std::vector<Fault> parseFaults(const std::string& spec);

// DTRAIN_FAULT of this process, parsed once (empty when unset). Throws on a bad spec.
const std::vector<Fault>& activeFaults();

// The first fault of `kind` that matches, or nullptr. `attempt` -1 reads DTRAIN_RESTART_COUNT.
const Fault* findFault(Kind kind, int rank, int64_t step, int attempt = -1);

// Runs every process-level fault (exit, signal, abort, hang, stop, slow) that matches this point.
// Call it where a step begins; kinds that the runtime interprets are left alone.
void injectAt(int rank, int64_t step, int attempt = -1);

// Executes one process-level fault; returns only for Slow (and for kinds it does not execute).
void execute(const Fault& fault);

enum class IoOp { Open, Write, Fsync, Rename };

struct IoFault {
  bool crash = false;  // crash@io=K: SIGKILL after the K-th I/O call of any kind
  IoOp op = IoOp::Write;
  int error = 0;       // errno to fail with
  int64_t nth = 0;     // 1-based: which call (of `op`, or of any op when crash)
  std::string describe() const;
};

std::vector<IoFault> parseIoFaults(const std::string& spec);

// Counts I/O calls and says when one must fail. The checkpointer owns one per save.
class IoFaultInjector {
 public:
  explicit IoFaultInjector(std::vector<IoFault> faults) : faults_(std::move(faults)) {}
  // From DTRAIN_IO_FAULT (no faults when unset).
  static IoFaultInjector fromEnv();

  // Call before each I/O call: returns the errno to fail it with, or 0 to go ahead.
  int before(IoOp op);
  // Call after each successful I/O call: SIGKILLs the process at a crash point.
  void after();

 private:
  std::vector<IoFault> faults_;
  int64_t counts_[4] = {0, 0, 0, 0};
  int64_t total_ = 0;
};

// "SIGKILL", "KILL", "kill" or "9" -> 9; -1 when unknown.
int parseSignal(const std::string& name);
// 9 -> "SIGKILL"; "signal 77" when unknown.
std::string signalName(int signo);
// "ENOSPC" or "28" -> 28; -1 when unknown.
int parseErrno(const std::string& name);
std::string errnoName(int error);

}  // namespace dtrain::fault
