#include "launcher/cluster/remote/session.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "dtrain/base/error.h"
#include "fault.h"
#include "launcher/node/program.h"
#include "launcher/seconds.h"

namespace dtrain::launcher::remote {

namespace {

constexpr int kPipeBytes = 1 << 20;  // the plan fits whole: see openPipes()
// How long the destructor waits for a SIGKILLed session to be reaped.
constexpr std::chrono::seconds kKilledGrace{2};

// argv[0] as execve needs it: a path, found on PATH before fork (no allocation after it).
std::string findProgram(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  for (const std::string& dir : pathDirectories(path ? path : "/usr/bin:/bin")) {
    std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  DTRAIN_THROW(Error, "launch: {} not found on PATH; HINT: install openssh-client", name);
}

void closePair(int fds[2]) {
  if (fds[0] >= 0) ::close(fds[0]);
  if (fds[1] >= 0) ::close(fds[1]);
}

// The session's stdin, stdout and stderr pipes.
struct Pipes {
  int in[2] = {-1, -1};
  int out[2] = {-1, -1};
  int err[2] = {-1, -1};
  void closeAll() {
    closePair(in);
    closePair(out);
    closePair(err);
  }
};

// The pipes, the stdin one large enough for all of `stdinData`: the whole plan goes into it at
// once (the agent reads it before anything else), so it must fit -- checked before anything
// starts.
Pipes openPipes(size_t stdinBytes, const std::string& host) {
  Pipes p;
  if (::pipe2(p.in, O_CLOEXEC) != 0 || ::pipe2(p.out, O_CLOEXEC) != 0 ||
      ::pipe2(p.err, O_CLOEXEC) != 0) {
    int e = errno;
    p.closeAll();
    DTRAIN_THROW(Error, "launch: cannot start the agent for {}: pipe: {}", host, std::strerror(e));
  }
  const int capacity = ::fcntl(p.in[1], F_SETPIPE_SZ, kPipeBytes);
  const size_t room = static_cast<size_t>(capacity > 0 ? capacity : ::fcntl(p.in[1], F_GETPIPE_SZ));
  if (stdinBytes > room) {
    p.closeAll();
    DTRAIN_THROW(Error,
                 "launch: the agent plan for {} ({} bytes) does not fit its pipe ({} bytes); "
                 "HINT: fewer or shorter --env / forwarded variables",
                 host, stdinBytes, room);
  }
  return p;
}

std::vector<char*> cStrings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// Forks the session's process: `file` with `argv` and `env` on the pipes, in a process group of
// its own, dying with the master. Returns its pid; the pipes' child ends are the caller's to close.
pid_t forkSession(const std::string& file, std::vector<char*>& argv, std::vector<char*>& env,
                  Pipes& p, const std::string& host) {
  sigset_t none;
  sigemptyset(&none);
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    p.closeAll();
    DTRAIN_THROW(Error, "launch: cannot start the agent for {}: fork: {}", host, std::strerror(e));
  }
  if (pid == 0) {
    // Async-signal-safe calls only: the master has other threads.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(125);
    ::dup2(p.in[0], 0);
    ::dup2(p.out[1], 1);
    ::dup2(p.err[1], 2);
    ::signal(SIGPIPE, SIG_DFL);
    ::pthread_sigmask(SIG_SETMASK, &none, nullptr);
    ::execve(file.c_str(), argv.data(), env.data());
    ::_exit(127);
  }
  return pid;
}

}  // namespace

Session::Session(std::string node, std::string host, const std::vector<std::string>& argv,
                 const std::vector<std::string>& env, const std::string& stdinData,
                 bool captureStdout)
    : node_(std::move(node)), host_(std::move(host)) {
  const std::string file = findProgram(argv.at(0));
  std::vector<char*> cargv = cStrings(argv);
  std::vector<char*> cenv = cStrings(env);
  Pipes p = openPipes(stdinData.size(), host_);
  pid_ = forkSession(file, cargv, cenv, p, host_);
  ::close(p.in[0]);
  ::close(p.out[1]);
  ::close(p.err[1]);
  inFd_ = p.in[1];
  outFd_ = p.out[0];
  errFd_ = p.err[0];
  ::fcntl(outFd_, F_SETFL, O_NONBLOCK);
  ::fcntl(errFd_, F_SETFL, O_NONBLOCK);
  ::fcntl(inFd_, F_SETFL, O_NONBLOCK);
  pidFd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  size_t done = 0;
  while (done < stdinData.size()) {
    ssize_t n = ::write(inFd_, stdinData.data() + done, stdinData.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EPIPE: the agent is gone already, and its exit says why
    done += static_cast<size_t>(n);
  }

  StreamSinks o;
  o.consoleFd = captureStdout ? -1 : STDOUT_FILENO;
  o.tailLines = captureStdout ? 10000 : 0;
  StreamSinks e;
  e.consoleFd = STDERR_FILENO;
  e.tailLines = 20;
  out_ = std::make_unique<WorkerStream>(o);
  err_ = std::make_unique<WorkerStream>(e);
}

Session::~Session() {
  if (!exited_ && pid_ > 0) {
    ::kill(-pid_, SIGKILL);
    waitExit(Clock::now() + kKilledGrace);
  }
  for (int fd : {inFd_, outFd_, errFd_, pidFd_}) {
    if (fd >= 0) ::close(fd);
  }
}

bool Session::waitExit(Clock::time_point deadline) {
  while (!reap()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                            Clock::now());
    if (left.count() <= 0) return false;
    std::vector<pollfd> fds;
    for (int fd : {pidFd_, outFd_, errFd_}) {
      if (fd >= 0) fds.push_back({fd, POLLIN, 0});
    }
    // Without a pidfd, look again every 10 ms.
    const int64_t ms = pidFd_ >= 0 ? left.count() + 1 : std::min<int64_t>(left.count() + 1, 10);
    ::poll(fds.data(), fds.size(), static_cast<int>(ms));
    drain();
  }
  return true;
}

int Session::pump(int fd) {
  if (fd < 0) return -1;
  char buf[65536];
  ssize_t n = ::read(fd, buf, sizeof buf);
  WorkerStream& s = fd == outFd_ ? *out_ : *err_;
  if (n > 0) {
    s.consume(buf, static_cast<size_t>(n));
    return 1;
  }
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
  s.finish();
  ::close(fd);
  (fd == outFd_ ? outFd_ : errFd_) = -1;
  return -1;
}

void Session::drain() {
  while (pump(outFd_) > 0) {
  }
  while (pump(errFd_) > 0) {
  }
}

bool Session::reap() {
  if (exited_) return true;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) != pid_) return false;
  exited_ = true;
  status_ = status;
  if (pidFd_ >= 0) {
    ::close(pidFd_);
    pidFd_ = -1;
  }
  drain();  // the last of its output: ssh's error message
  return true;
}

std::string Session::describeExit() const {
  if (WIFEXITED(status_)) return fmt::format("exited with code {}", WEXITSTATUS(status_));
  if (WIFSIGNALED(status_)) return "was killed by " + fault::signalName(WTERMSIG(status_));
  return fmt::format("ended with wait status {}", status_);
}

const std::deque<std::string>& Session::stderrTail() const { return err_->tail(); }
const std::deque<std::string>& Session::stdoutLines() const { return out_->tail(); }

void Session::closeStdin() {
  if (inFd_ >= 0) {
    ::close(inFd_);
    inFd_ = -1;
  }
}

void Session::finish(double graceSeconds) {
  closeStdin();
  if (waitExit(after(Clock::now(), graceSeconds))) return;
  ::kill(-pid_, SIGTERM);
  if (waitExit(after(Clock::now(), graceSeconds))) return;
  ::kill(-pid_, SIGKILL);
  waitExit(after(Clock::now(), graceSeconds));
}

}  // namespace dtrain::launcher::remote
