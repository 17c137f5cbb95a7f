#include "launcher/supervisor/guardian.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dtrain/base/error.h"
#include "launcher/dirents.h"

namespace dtrain::launcher {

namespace {

// ---- Child side: async-signal-safe only (see Note [Guardians]) -------------------------------

void sendMessage(int fd, int32_t kind, int32_t value) {
  GuardianMessage m;
  m.kind = kind;
  m.value = value;
  while (::write(fd, &m, sizeof m) < 0 && errno == EINTR) {
  }
}

// Closes every descriptor >= 3 except the sorted `keep` ones.
void closeAllExcept(int* keep, int n) {
  for (int i = 1; i < n; ++i) {  // insertion sort: n is 4
    for (int j = i; j > 0 && keep[j - 1] > keep[j]; --j) {
      int t = keep[j];
      keep[j] = keep[j - 1];
      keep[j - 1] = t;
    }
  }
  unsigned lo = 3;
  for (int i = 0; i <= n; ++i) {
    unsigned hi = i < n ? static_cast<unsigned>(keep[i]) : ~0U;
    if (i < n && keep[i] < 3) continue;
    if (hi > lo) {
      unsigned last = i < n ? hi - 1 : ~0U;
      if (::syscall(SYS_close_range, lo, last, 0) != 0) {
        unsigned stop = i < n ? hi : 65536;
        for (unsigned fd = lo; fd < stop; ++fd) ::close(static_cast<int>(fd));
      }
    }
    if (i < n) lo = hi + 1;
  }
}

// SIGKILLs every child of this (single-threaded) process, as listed by the kernel.
void killChildren() {
  int fd = ::open("/proc/thread-self/children", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  char buf[512];
  long pid = 0;
  bool inNumber = false;
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) {
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] >= '0' && buf[i] <= '9') {
        pid = pid * 10 + (buf[i] - '0');
        inNumber = true;
      } else if (inNumber) {
        ::kill(static_cast<pid_t>(pid), SIGKILL);
        pid = 0;
        inNumber = false;
      }
    }
  }
  if (inNumber) ::kill(static_cast<pid_t>(pid), SIGKILL);
  ::close(fd);
}

// Kills the worker's group and every descendant left (reparented to us as subreaper), reaping
// them all. Returns once this process has no children.
void killEverything(pid_t worker, bool* workerReaped, int* workerStatus) {
  if (!*workerReaped) ::kill(-worker, SIGKILL);
  while (true) {
    killChildren();
    int status = 0;
    pid_t r = ::waitpid(-1, &status, __WALL);
    if (r < 0) {
      if (errno == EINTR) continue;
      return;  // ECHILD: nothing left
    }
    if (r == worker && !*workerReaped) {
      *workerReaped = true;
      *workerStatus = status;
    }
  }
}

// Removes `name` (relative to directory `parent`) and everything under it, without following
// symbolic links; gives up below kMaxRemoveDepth levels. Raw system calls only: it runs in the
// forked guardian (see Note [Temporary job directory]). ENOENT anywhere counts as done.
constexpr int kMaxRemoveDepth = 16;

void removeTree(int parent, const char* name, int depth) {
  if (::unlinkat(parent, name, 0) == 0 || errno == ENOENT) return;  // not a directory
  if (errno != EISDIR || depth >= kMaxRemoveDepth) return;
  int fd = ::openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  // Read from the start again after each pass that removed something: entries removed while a
  // directory is being read may make the kernel skip others.
  alignas(8) char buf[2048];
  for (int pass = 0; pass < 8; ++pass) {
    if (::lseek(fd, 0, SEEK_SET) != 0) break;
    bool removed = false;
    auto remove = [&](const char* entry) {
      if (entry[0] == '.' && (entry[1] == 0 || (entry[1] == '.' && entry[2] == 0))) return;
      removeTree(fd, entry, depth + 1);
      removed = true;
    };
    while (readDirents(fd, buf, sizeof buf, remove) > 0) {
    }
    if (!removed) break;
  }
  ::close(fd);
  ::unlinkat(parent, name, AT_REMOVEDIR);
}

[[noreturn]] void workerMain(const char* file, char* const* argv, char* const* envp, int outFd,
                             int errFd, int controlFd, int statusFd, pid_t guardian) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != guardian) ::_exit(125);  // the guardian died before we got here
  if (::dup2(outFd, STDOUT_FILENO) < 0 || ::dup2(errFd, STDERR_FILENO) < 0) {
    sendMessage(statusFd, GuardianMessage::kExecFailed, errno);
    ::_exit(125);
  }
  ::close(controlFd);
  // stdin is /dev/null: a worker outside the terminal's foreground group that read it would be
  // stopped by SIGTTIN (see Note [Job control] in supervisor.h). open(2) is async-signal-safe.
  int nul = ::open("/dev/null", O_RDONLY);
  if (nul < 0 || ::dup2(nul, STDIN_FILENO) < 0) {
    sendMessage(statusFd, GuardianMessage::kExecFailed, errno);
    ::_exit(125);
  }
  if (nul != STDIN_FILENO) ::close(nul);
  // A worker starts with default signal handling, whatever the launcher blocked or ignored.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; ++s) {
    if (s != SIGKILL && s != SIGSTOP) ::sigaction(s, &dfl, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  // Every descriptor but stdio closes at exec; the status pipe stays open until then so an exec
  // failure can be reported.
  if (::syscall(SYS_close_range, 3U, ~0U, 4U /* CLOSE_RANGE_CLOEXEC */) != 0) {
    for (int fd = 3; fd < 65536; ++fd) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  ::execve(file, argv, envp);
  int err = errno;
  sendMessage(statusFd, GuardianMessage::kExecFailed, err);
  ::_exit(err == ENOENT || err == ENOTDIR ? 127 : 126);
}

[[noreturn]] void guardianMain(const char* file, char* const* argv, char* const* envp,
                               int controlFd, int statusFd, int outFd, int errFd,
                               const char* removeOnLauncherDeath) {
  int keep[4] = {controlFd, statusFd, outFd, errFd};
  closeAllExcept(keep, 4);
  ::prctl(PR_SET_NAME, "dtrain-guard");
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  // The terminal's Ctrl-Z reaches launch's whole process group, guardians included: a stopped
  // guardian could not pass on the SIGCONT that resumes its worker (Note [Job control]).
  for (int s : {SIGTSTP, SIGTTIN, SIGTTOU}) ::signal(s, SIG_IGN);
  const pid_t self = ::getpid();

  // vfork: the worker shares this address space -- a copy of the launcher's -- until its execve,
  // instead of copying its page tables first (launch's own fork takes about half a millisecond).
  // The guardian is single-threaded and waits meanwhile; workerMain never returns and makes only
  // async-signal-safe calls.
  pid_t worker = ::vfork();
  if (worker < 0) {
    sendMessage(statusFd, GuardianMessage::kSpawnFailed, errno);
    ::_exit(125);
  }
  if (worker == 0) workerMain(file, argv, envp, outFd, errFd, controlFd, statusFd, self);

  ::setpgid(worker, worker);  // also done by the worker: whichever runs first wins the race
  sendMessage(statusFd, GuardianMessage::kStarted, worker);
  ::close(outFd);
  ::close(errFd);

  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, worker, 0));
  bool reaped = false;
  int status = 0;
  bool launcherGone = false;
  bool launcherDied = false;  // its end of the control pipe closed: it exited or was killed
  while (!reaped && !launcherGone) {
    struct pollfd fds[2] = {{controlFd, POLLIN, 0}, {pidfd, POLLIN, 0}};
    // Without pidfd (old kernels) poll the worker every 20 ms.
    int n = ::poll(fds, pidfd >= 0 ? 2 : 1, pidfd >= 0 ? -1 : 20);
    if (n < 0 && errno != EINTR) launcherGone = true;
    if (n > 0 && fds[0].revents != 0) {
      unsigned char sigs[64];
      ssize_t r = ::read(controlFd, sigs, sizeof sigs);
      if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
        launcherGone = true;
        launcherDied = r == 0;
      } else {
        for (ssize_t i = 0; i < r; ++i) {
          ::kill(-worker, sigs[i]);
          // Wake a stopped worker so it acts on the signal -- unless the signal is a stop.
          if (sigs[i] != SIGKILL && sigs[i] != SIGCONT && sigs[i] != SIGSTOP &&
              sigs[i] != SIGTSTP) {
            ::kill(-worker, SIGCONT);
          }
        }
      }
    }
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(worker), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == worker) {
      // Kill what is left of the group while the worker is a zombie: its pid, and so its group
      // id, cannot be reused before we reap it.
      ::kill(-worker, SIGKILL);
      while (::waitpid(worker, &status, 0) < 0 && errno == EINTR) {
      }
      reaped = true;
    }
  }
  // The worker is done (or the launcher is): its report goes first, then nothing of it survives.
  if (reaped) sendMessage(statusFd, GuardianMessage::kExited, status);
  killEverything(worker, &reaped, &status);
  if (launcherDied && removeOnLauncherDeath != nullptr) {
    removeTree(AT_FDCWD, removeOnLauncherDeath, 0);
  }
  ::_exit(0);
}

// ---- Launcher side -----------------------------------------------------------------------------

struct Pipe {
  int read = -1;
  int write = -1;
};

Pipe makePipe(const char* what) {
  int fds[2];
  DTRAIN_CHECK(::pipe2(fds, O_CLOEXEC) == 0,
               "launch: cannot create the {} pipe of a worker: {}; "
               "HINT: raise the open-file limit (ulimit -n)",
               what, std::strerror(errno));
  return {fds[0], fds[1]};
}

void setNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

std::vector<char*> cStrings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

}  // namespace

GuardedWorker spawnGuarded(const SpawnSpec& spec) {
  std::vector<char*> argv = cStrings(spec.argv);
  std::vector<char*> envp = cStrings(spec.env);
  Pipe control, status, out, err;
  try {
    control = makePipe("control");
    status = makePipe("status");
    out = makePipe("stdout");
    err = makePipe("stderr");
  } catch (...) {
    for (const Pipe& p : {control, status, out, err}) {
      if (p.read >= 0) ::close(p.read);
      if (p.write >= 0) ::close(p.write);
    }
    throw;
  }

  pid_t pid = ::fork();
  if (pid == 0) {
    guardianMain(spec.file.c_str(), argv.data(), envp.data(), control.read, status.write, out.write,
                 err.write,
                 spec.removeOnLauncherDeath.empty() ? nullptr : spec.removeOnLauncherDeath.c_str());
  }
  int forkErrno = errno;
  for (int fd : {control.read, status.write, out.write, err.write}) ::close(fd);
  if (pid < 0) {
    for (int fd : {control.write, status.read, out.read, err.read}) ::close(fd);
    DTRAIN_THROW(Error,
                 "launch: fork failed while starting a worker: {}; HINT: check the process "
                 "limit (ulimit -u) and free memory",
                 std::strerror(forkErrno));
  }
  for (int fd : {status.read, out.read, err.read}) setNonBlocking(fd);
  GuardedWorker w;
  w.guardianPid = pid;
  w.controlFd = control.write;
  w.statusFd = status.read;
  w.stdoutFd = out.read;
  w.stderrFd = err.read;
  return w;
}

bool signalGuarded(int controlFd, int signo) {
  unsigned char b = static_cast<unsigned char>(signo);
  while (true) {
    ssize_t n = ::write(controlFd, &b, 1);
    if (n == 1) return true;
    if (n < 0 && errno == EINTR) continue;
    return false;  // EPIPE: the guardian is gone (SIGPIPE is ignored by the launcher)
  }
}

std::vector<GuardianMessage> readGuardianMessages(int statusFd, bool* eof) {
  std::vector<GuardianMessage> out;
  *eof = false;
  while (true) {
    GuardianMessage buf[16];
    ssize_t n = ::read(statusFd, buf, sizeof buf);
    if (n > 0) {
      out.insert(out.end(), buf, buf + n / static_cast<ssize_t>(sizeof(GuardianMessage)));
      continue;
    }
    if (n == 0) *eof = true;
    if (n < 0 && errno == EINTR) continue;
    return out;  // EAGAIN or EOF
  }
}

}  // namespace dtrain::launcher
