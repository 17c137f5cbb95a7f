#pragma once
// Fault injection, off unless DTRAIN_FAULT / DTRAIN_IO_FAULT is set. One parser for the launcher's
// test worker, the runtime and the checkpointer. A test seam, not API: internal to this tree
// (launch, the runtime, test workers and tests include it; it is not installed). Grammar
// (docs/design.md#fault-injection says which kinds are implemented where):
//
//   DTRAIN_FAULT    = fault (";" fault)*
//   fault           = kind [":" arg] ["@" cond ("," cond)*]
//   cond            = ("rank" | "step" | "attempt") "=" integer        (absent = any)
//                   | "phase=" ("before" | "after")                    (nan-grad only)
//   kind            = exit:CODE | signal:NAME | abort | hang | stop | slow:MS
//                   | nan-grad [":" ("nan" | "inf")] | skip-collective | wrong-shape
//                     and, obeyed by the test worker only:
//                   | flood:LINES | grandchild | error-file:CODE
//
//   DTRAIN_IO_FAULT = iofault (";" iofault)*
//   iofault         = (open|write|fsync|rename) ":" ERRNO "@" N ["," iocond]*
//                                                  (the N-th call of that op fails with ERRNO)
//                   | (open|write|fsync|rename) ":slow:" MS ["@" N] ["," iocond]*
//                                                  (that call, or every call of the op without
//                                                   "@N", sleeps MS milliseconds first: a slow
//                                                   disk)
//                   | "crash@io=" K ["," iocond]*  (SIGKILL right after the K-th I/O call)
//   iocond          = ("rank" | "attempt") "=" integer                  (absent = any)
// I/O calls are counted per process, over all of its checkpoint saves and copies.
//
// Example: DTRAIN_FAULT="signal:KILL@rank=3,step=17,attempt=0".
//
// nan-grad: at DDP's synchronised backward number `step` (0-based), rank `rank` writes NaN (or
// +inf) into one element of one gradient -- before the gradient enters its bucket's allreduce
// (phase=before, the default: the poison then reaches every rank), or into that rank's .grad
// after the allreduce wrote it back (phase=after: that rank alone sees it). The second is what a
// test of GradScaler's cross-rank agreement needs.

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
  int64_t arg = 0;  // exit code, signal number, milliseconds, lines; nan-grad: 1 for inf
  int rank = -1;    // -1: any
  int64_t step = -1;
  int attempt = -1;
  bool after = false;  // nan-grad: phase=after

  bool matches(int rank, int64_t step, int attempt) const;
  std::string describe() const;  // back in the grammar above
};

// Throws InvalidArgument naming the variable, the offending part and the accepted forms.
std::vector<Fault> parseFaults(const std::string& spec);

// DTRAIN_FAULT of this process, parsed once (empty when unset). Throws on a bad spec.
const std::vector<Fault>& activeFaults();

// The first fault of `kind` that matches, or nullptr. `attempt` -1 reads DTRAIN_RESTART_COUNT.
const Fault* findFault(Kind kind, int rank, int64_t step, int attempt = -1);

// This process's restart attempt: DTRAIN_RESTART_COUNT, 0 when unset.
int currentAttempt();

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
  int64_t slowMs = 0;  // OP:slow:MS: sleep this long before the call (error stays 0)
  int64_t nth = 0;     // 1-based: which call (of `op`, or of any op when crash); 0: every call
  int rank = -1;       // -1: any
  int attempt = -1;
  std::string describe() const;
};

std::vector<IoFault> parseIoFaults(const std::string& spec);

// Counts I/O calls and says when one must fail. The checkpointer owns one per save.
class IoFaultInjector {
 public:
  explicit IoFaultInjector(std::vector<IoFault> faults) : faults_(std::move(faults)) {}
  // From DTRAIN_IO_FAULT (no faults when unset): those whose conditions match `rank` (-1: only
  // those without a rank condition) and this restart attempt (DTRAIN_RESTART_COUNT).
  static IoFaultInjector fromEnv(int rank = -1);
  bool empty() const { return faults_.empty(); }
  // I/O calls completed so far (what crash@io=K counts).
  int64_t calls() const { return total_; }

  // Call before each I/O call: sleeps for a matching slow fault, then returns the errno to fail
  // it with, or 0 to go ahead.
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
