#include "fault.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "dtrain/base/error.h"
#include "parse_int.h"
#include "text.h"

namespace dtrain::fault {

namespace {

constexpr const char* kFaultForms =
    "exit:CODE, signal:NAME, abort, hang, stop, slow:MS, nan-grad[:inf], skip-collective, "
    "wrong-shape, "
    "flood:LINES, grandchild, error-file:CODE";

struct KindInfo {
  const char* name;
  Kind kind;
  bool hasArg;
};

constexpr KindInfo kKinds[] = {
    {"exit", Kind::Exit, true},
    {"signal", Kind::Signal, true},
    {"abort", Kind::Abort, false},
    {"hang", Kind::Hang, false},
    {"stop", Kind::Stop, false},
    {"slow", Kind::Slow, true},
    {"nan-grad", Kind::NanGrad, false},
    {"skip-collective", Kind::SkipCollective, false},
    {"wrong-shape", Kind::WrongShape, false},
    {"flood", Kind::Flood, true},
    {"grandchild", Kind::Grandchild, false},
    {"error-file", Kind::ErrorFile, true},
};

const KindInfo& infoOf(Kind kind) {
  for (const auto& k : kKinds) {
    if (k.kind == kind) return k;
  }
  return kKinds[0];
}

// The part before '@' of fault `text`: "kind" or "kind:arg", the argument checked.
Fault parseKind(const std::string& what, const std::string& text) {
  std::string name = what;
  std::string arg;
  bool hasArg = false;
  if (size_t colon = what.find(':'); colon != std::string::npos) {
    name = what.substr(0, colon);
    arg = what.substr(colon + 1);
    hasArg = true;
  }
  const KindInfo* info = nullptr;
  for (const auto& k : kKinds) {
    if (name == k.name) info = &k;
  }
  DTRAIN_CHECK_ARG(info, "DTRAIN_FAULT: unknown fault kind \"{}\" in \"{}\"; HINT: use one of {}",
                   name, text, kFaultForms);
  Fault f;
  f.kind = info->kind;
  if (f.kind == Kind::NanGrad) {
    // An optional value: nan (the default) or inf.
    DTRAIN_CHECK_ARG(!hasArg || arg == "nan" || arg == "inf",
                     "DTRAIN_FAULT: nan-grad takes nan or inf, not \"{}\", in \"{}\"", arg, text);
    f.arg = arg == "inf" ? 1 : 0;
    hasArg = false;
  }
  DTRAIN_CHECK_ARG(hasArg == info->hasArg,
                   "DTRAIN_FAULT: \"{}\" {} an argument in \"{}\"; HINT: use one of {}", name,
                   info->hasArg ? "needs" : "takes no", text, kFaultForms);
  if (f.kind == Kind::Signal) {
    f.arg = parseSignal(arg);
    DTRAIN_CHECK_ARG(f.arg > 0,
                     "DTRAIN_FAULT: unknown signal \"{}\" in \"{}\"; HINT: KILL, SEGV, "
                     "TERM, or a number",
                     arg, text);
  } else if (info->hasArg) {
    DTRAIN_CHECK_ARG(parseInt64(arg, &f.arg) && f.arg >= 0,
                     "DTRAIN_FAULT: \"{}\" is not a non-negative integer in \"{}\"", arg, text);
    DTRAIN_CHECK_ARG(!(f.kind == Kind::Exit || f.kind == Kind::ErrorFile) || f.arg <= 255,
                     "DTRAIN_FAULT: exit code {} is out of range 0..255 in \"{}\"", f.arg, text);
  }
  return f;
}

// The part after '@' of fault `text` ("rank=R,step=S,attempt=A,phase=P"), into `f`.
void parseConditions(const std::string& conds, const std::string& text, Fault& f) {
  for (const auto& cond : splitAt(conds, ',')) {
    size_t eq = cond.find('=');
    std::string key = eq == std::string::npos ? cond : cond.substr(0, eq);
    if (key == "phase") {
      std::string phase = eq == std::string::npos ? "" : cond.substr(eq + 1);
      DTRAIN_CHECK_ARG(f.kind == Kind::NanGrad,
                       "DTRAIN_FAULT: phase= applies to nan-grad only, in \"{}\"", text);
      DTRAIN_CHECK_ARG(phase == "before" || phase == "after",
                       "DTRAIN_FAULT: bad condition \"{}\" in \"{}\"; HINT: phase=before or "
                       "phase=after",
                       cond, text);
      f.after = phase == "after";
      continue;
    }
    int64_t value = 0;
    DTRAIN_CHECK_ARG(eq != std::string::npos && parseInt64(cond.substr(eq + 1), &value) &&
                         value >= 0,
                     "DTRAIN_FAULT: bad condition \"{}\" in \"{}\"; HINT: rank=R, step=S, "
                     "attempt=A with non-negative integers",
                     cond, text);
    if (key == "rank") {
      f.rank = static_cast<int>(value);
    } else if (key == "step") {
      f.step = value;
    } else if (key == "attempt") {
      f.attempt = static_cast<int>(value);
    } else {
      DTRAIN_THROW(InvalidArgument,
                   "DTRAIN_FAULT: unknown condition \"{}\" in \"{}\"; HINT: rank=, step=, "
                   "attempt=, phase= (nan-grad)",
                   key, text);
    }
  }
}

Fault parseOne(const std::string& text) {
  std::string what = text;
  std::string conds;
  if (size_t at = text.find('@'); at != std::string::npos) {
    what = text.substr(0, at);
    conds = text.substr(at + 1);
  }
  Fault f = parseKind(what, text);
  if (conds.empty()) {
    DTRAIN_CHECK_ARG(text.find('@') == std::string::npos,
                     "DTRAIN_FAULT: empty condition after '@' in \"{}\"", text);
    return f;
  }
  parseConditions(conds, text, f);
  return f;
}

int envAttempt() {
  const char* v = std::getenv("DTRAIN_RESTART_COUNT");
  int64_t n = 0;
  return v && parseInt64(v, &n) ? static_cast<int>(n) : 0;
}

struct NamedNumber {
  const char* name;
  int number;
};

constexpr NamedNumber kSignals[] = {
    {"SIGHUP", SIGHUP},   {"SIGINT", SIGINT},   {"SIGQUIT", SIGQUIT}, {"SIGILL", SIGILL},
    {"SIGTRAP", SIGTRAP}, {"SIGABRT", SIGABRT}, {"SIGBUS", SIGBUS},   {"SIGFPE", SIGFPE},
    {"SIGKILL", SIGKILL}, {"SIGUSR1", SIGUSR1}, {"SIGSEGV", SIGSEGV}, {"SIGUSR2", SIGUSR2},
    {"SIGPIPE", SIGPIPE}, {"SIGALRM", SIGALRM}, {"SIGTERM", SIGTERM}, {"SIGCHLD", SIGCHLD},
    {"SIGCONT", SIGCONT}, {"SIGSTOP", SIGSTOP}, {"SIGTSTP", SIGTSTP}, {"SIGTTIN", SIGTTIN},
    {"SIGTTOU", SIGTTOU}, {"SIGXCPU", SIGXCPU}, {"SIGXFSZ", SIGXFSZ}, {"SIGSYS", SIGSYS},
};

constexpr NamedNumber kErrnos[] = {
    {"EPERM", EPERM},   {"ENOENT", ENOENT}, {"EINTR", EINTR},     {"EIO", EIO},
    {"EBADF", EBADF},   {"EAGAIN", EAGAIN}, {"ENOMEM", ENOMEM},   {"EACCES", EACCES},
    {"EEXIST", EEXIST}, {"EXDEV", EXDEV},   {"ENOTDIR", ENOTDIR}, {"EISDIR", EISDIR},
    {"EINVAL", EINVAL}, {"EMFILE", EMFILE}, {"EFBIG", EFBIG},     {"ENOSPC", ENOSPC},
    {"EROFS", EROFS},   {"EDQUOT", EDQUOT},
};

std::string upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

constexpr const char* kOpNames[] = {"open", "write", "fsync", "rename"};

}  // namespace

bool Fault::matches(int r, int64_t s, int a) const {
  return (rank < 0 || rank == r) && (step < 0 || step == s) && (attempt < 0 || attempt == a);
}

std::string Fault::describe() const {
  const KindInfo& info = infoOf(kind);
  std::string out = info.name;
  if (kind == Kind::Signal) {
    out += ":" + signalName(static_cast<int>(arg)).substr(3);
  } else if (info.hasArg) {
    out += ":" + std::to_string(arg);
  } else if (kind == Kind::NanGrad && arg == 1) {
    out += ":inf";
  }
  std::vector<std::string> conds;
  if (rank >= 0) conds.push_back("rank=" + std::to_string(rank));
  if (step >= 0) conds.push_back("step=" + std::to_string(step));
  if (attempt >= 0) conds.push_back("attempt=" + std::to_string(attempt));
  if (after) conds.push_back("phase=after");
  for (size_t i = 0; i < conds.size(); ++i) out += (i == 0 ? "@" : ",") + conds[i];
  return out;
}

std::vector<Fault> parseFaults(const std::string& spec) {
  std::vector<Fault> faults;
  for (const auto& part : splitAt(spec, ';')) {
    std::string text = trim(part);
    if (text.empty()) continue;
    faults.push_back(parseOne(text));
  }
  return faults;
}

const std::vector<Fault>& activeFaults() {
  // Never destroyed, like dtrain_base's other lookup tables: a thread that asks while the
  // process's exit handlers run finds it whole.
  static const auto* const faults = [] {
    const char* spec = std::getenv("DTRAIN_FAULT");
    return new std::vector<Fault>(spec ? parseFaults(spec) : std::vector<Fault>{});
  }();
  return *faults;
}

const Fault* findFault(Kind kind, int rank, int64_t step, int attempt) {
  if (attempt < 0) attempt = envAttempt();
  for (const auto& f : activeFaults()) {
    if (f.kind == kind && f.matches(rank, step, attempt)) return &f;
  }
  return nullptr;
}

int currentAttempt() { return envAttempt(); }

void injectAt(int rank, int64_t step, int attempt) {
  if (activeFaults().empty()) return;
  if (attempt < 0) attempt = envAttempt();
  for (const auto& f : activeFaults()) {
    if (f.matches(rank, step, attempt)) execute(f);
  }
}

void execute(const Fault& fault) {
  switch (fault.kind) {
    case Kind::Exit: std::fflush(nullptr); ::_exit(static_cast<int>(fault.arg));
    case Kind::Signal:
      std::fflush(nullptr);
      ::signal(static_cast<int>(fault.arg), SIG_DFL);
      ::raise(static_cast<int>(fault.arg));
      ::pause();  // a blocked or ignored signal: wait to be killed rather than run on
      return;
    case Kind::Abort: std::fflush(nullptr); std::abort();
    case Kind::Hang:
      while (true) ::pause();
    case Kind::Stop:
      std::fflush(nullptr);
      ::raise(SIGSTOP);
      return;
    case Kind::Slow: std::this_thread::sleep_for(std::chrono::milliseconds(fault.arg)); return;
    default: return;  // interpreted by the runtime or the test worker
  }
}

std::string IoFault::describe() const {
  std::string out;
  if (crash) {
    out = "crash@io=" + std::to_string(nth);
  } else if (slowMs > 0) {
    out = std::string(kOpNames[static_cast<int>(op)]) + ":slow:" + std::to_string(slowMs) +
          (nth > 0 ? "@" + std::to_string(nth) : "");
  } else {
    out = std::string(kOpNames[static_cast<int>(op)]) + ":" + errnoName(error) + "@" +
          std::to_string(nth);
  }
  if (rank >= 0) out += ",rank=" + std::to_string(rank);
  if (attempt >= 0) out += ",attempt=" + std::to_string(attempt);
  return out;
}

std::vector<IoFault> parseIoFaults(const std::string& spec) {
  std::vector<IoFault> faults;
  for (const auto& part : splitAt(spec, ';')) {
    std::string text = trim(part);
    if (text.empty()) continue;
    IoFault f;
    // OP:slow:MS may go without "@N" (every call): its conditions then follow MS directly.
    const bool slow = text.find(":slow:") != std::string::npos;
    size_t at = text.find('@');
    DTRAIN_CHECK_ARG(at != std::string::npos || slow,
                     "DTRAIN_IO_FAULT: \"{}\" has no '@'; HINT: OP:ERRNO@N (OP = open, write, "
                     "fsync, rename), OP:slow:MS[@N] or crash@io=K",
                     text);
    std::string head = at == std::string::npos ? text : text.substr(0, at);
    std::string tail = at == std::string::npos ? "" : text.substr(at + 1);
    if (at == std::string::npos && head.find(',') != std::string::npos) {
      tail = head.substr(head.find(','));
      head = head.substr(0, head.find(','));
    }
    // Conditions after the count: ",rank=R,attempt=A".
    auto parts = splitAt(tail, ',');
    tail = parts.empty() ? "" : parts[0];
    for (size_t i = 1; i < parts.size(); ++i) {
      size_t eq = parts[i].find('=');
      std::string key = parts[i].substr(0, eq);
      int64_t value = 0;
      DTRAIN_CHECK_ARG(eq != std::string::npos && (key == "rank" || key == "attempt") &&
                           parseInt64(parts[i].substr(eq + 1), &value) && value >= 0,
                       "DTRAIN_IO_FAULT: bad condition \"{}\" in \"{}\"; HINT: rank=R or attempt=A "
                       "with non-negative integers",
                       parts[i], text);
      (key == "rank" ? f.rank : f.attempt) = static_cast<int>(value);
    }
    if (head == "crash") {
      DTRAIN_CHECK_ARG(tail.rfind("io=", 0) == 0 && parseInt64(tail.substr(3), &f.nth) && f.nth > 0,
                       "DTRAIN_IO_FAULT: bad crash point \"{}\"; HINT: crash@io=K with K >= 1",
                       text);
      f.crash = true;
      faults.push_back(f);
      continue;
    }
    size_t colon = head.find(':');
    std::string op = head.substr(0, colon);
    int opIndex = -1;
    for (int i = 0; i < 4; ++i) {
      if (op == kOpNames[i]) opIndex = i;
    }
    DTRAIN_CHECK_ARG(opIndex >= 0 && colon != std::string::npos,
                     "DTRAIN_IO_FAULT: bad operation \"{}\" in \"{}\"; HINT: OP:ERRNO@N with OP = "
                     "open, write, fsync or rename",
                     head, text);
    f.op = static_cast<IoOp>(opIndex);
    if (slow) {
      const bool form = head.size() > colon + 6 && head.compare(colon, 6, ":slow:") == 0;
      DTRAIN_CHECK_ARG(form && parseInt64(head.substr(colon + 6), &f.slowMs) && f.slowMs > 0 &&
                           f.slowMs <= 3600000,
                       "DTRAIN_IO_FAULT: bad slow fault \"{}\"; HINT: OP:slow:MS with 1 <= MS <= "
                       "3600000, optionally @N for the N-th call only",
                       text);
      DTRAIN_CHECK_ARG(tail.empty() || (parseInt64(tail, &f.nth) && f.nth > 0),
                       "DTRAIN_IO_FAULT: \"{}\" is not a call number >= 1 in \"{}\"", tail, text);
      faults.push_back(f);
      continue;
    }
    f.error = parseErrno(head.substr(colon + 1));
    DTRAIN_CHECK_ARG(f.error > 0,
                     "DTRAIN_IO_FAULT: unknown errno \"{}\" in \"{}\"; HINT: ENOSPC, "
                     "EIO, EXDEV, ... or a number",
                     head.substr(colon + 1), text);
    DTRAIN_CHECK_ARG(parseInt64(tail, &f.nth) && f.nth > 0,
                     "DTRAIN_IO_FAULT: \"{}\" is not a call number >= 1 in \"{}\"", tail, text);
    faults.push_back(f);
  }
  return faults;
}

IoFaultInjector IoFaultInjector::fromEnv(int rank) {
  const char* spec = std::getenv("DTRAIN_IO_FAULT");
  std::vector<IoFault> faults;
  if (!spec) return IoFaultInjector(faults);
  int attempt = envAttempt();
  for (const auto& f : parseIoFaults(spec)) {
    if ((f.rank < 0 || f.rank == rank) && (f.attempt < 0 || f.attempt == attempt))
      faults.push_back(f);
  }
  return IoFaultInjector(std::move(faults));
}

int IoFaultInjector::before(IoOp op) {
  int64_t n = ++counts_[static_cast<int>(op)];
  for (const auto& f : faults_) {
    if (!f.crash && f.slowMs > 0 && f.op == op && (f.nth == 0 || f.nth == n)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(f.slowMs));
    }
  }
  for (const auto& f : faults_) {
    if (!f.crash && f.slowMs == 0 && f.op == op && f.nth == n) return f.error;
  }
  return 0;
}

void IoFaultInjector::after() {
  ++total_;
  for (const auto& f : faults_) {
    if (f.crash && f.nth == total_) ::kill(::getpid(), SIGKILL);
  }
}

int parseSignal(const std::string& name) {
  int64_t n = 0;
  if (parseInt64(name, &n)) return n > 0 && n < 65 ? static_cast<int>(n) : -1;
  std::string up = upper(name);
  if (up.rfind("SIG", 0) != 0) up = "SIG" + up;
  for (const auto& s : kSignals) {
    if (up == s.name) return s.number;
  }
  return -1;
}

std::string signalName(int signo) {
  for (const auto& s : kSignals) {
    if (s.number == signo) return s.name;
  }
  return "signal " + std::to_string(signo);
}

int parseErrno(const std::string& name) {
  int64_t n = 0;
  if (parseInt64(name, &n)) return n > 0 && n < 4096 ? static_cast<int>(n) : -1;
  std::string up = upper(name);
  for (const auto& e : kErrnos) {
    if (up == e.name) return e.number;
  }
  return -1;
}

std::string errnoName(int error) {
  for (const auto& e : kErrnos) {
    if (e.number == error) return e.name;
  }
  return std::to_string(error);
}

}  // namespace dtrain::fault
