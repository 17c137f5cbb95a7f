#include "launcher/monitor/command.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "launcher/node/program.h"

extern char** environ;

namespace dtrain::launcher::monitor {

namespace {

using Clock = std::chrono::steady_clock;

struct Pipe {
  int fds[2] = {-1, -1};
  ~Pipe() {
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  }
};

}  // namespace

bool commandExists(const std::string& name) {
  auto executable = [](const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
           ::access(path.c_str(), X_OK) == 0;
  };
  if (name.find('/') != std::string::npos) return executable(name);
  const char* path = std::getenv("PATH");
  for (const std::string& dir : pathDirectories(path != nullptr ? path : "/usr/bin:/bin")) {
    if (executable(dir + "/" + name)) return true;
  }
  return false;
}

namespace {

// Spawns `argv` on the pipes (see runCommand()); its pid, or -1 with `result->error` set.
pid_t spawnCommand(const std::vector<std::string>& argv, Pipe& out, Pipe& err,
                   CommandResult* result) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out.fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err.fds[1], STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  sigset_t defaults;
  sigemptyset(&defaults);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE}) sigaddset(&defaults, s);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    result->error = fmt::format("cannot run {}: {}", argv[0], std::strerror(rc));
    return -1;
  }
  return pid;
}

// Reads stdout and stderr (at most `maxOutput` bytes of each) until both end or `timeout` passes.
void collectOutput(int outFd, int errFd, std::chrono::milliseconds timeout, size_t maxOutput,
                   CommandResult* result) {
  const auto deadline = Clock::now() + timeout;
  bool outOpen = true;
  bool errOpen = true;
  char buf[16384];
  while (outOpen || errOpen) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      result->timedOut = true;
      break;
    }
    pollfd fds[2] = {{outFd, POLLIN, 0}, {errFd, POLLIN, 0}};
    if (!outOpen) fds[0].fd = -1;
    if (!errOpen) fds[1].fd = -1;
    int ready = ::poll(fds, 2, static_cast<int>(left.count()) + 1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        (i == 0 ? outOpen : errOpen) = false;
        continue;
      }
      std::string& sink = i == 0 ? result->out : result->err;
      if (sink.size() < maxOutput) {
        sink.append(buf, std::min(static_cast<size_t>(n), maxOutput - sink.size()));
      }
    }
  }
}

}  // namespace

CommandResult runCommand(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                         size_t maxOutput) {
  CommandResult result;
  if (argv.empty()) {
    result.error = "no command";
    return result;
  }
  Pipe out;
  Pipe err;
  if (::pipe2(out.fds, O_CLOEXEC) != 0 || ::pipe2(err.fds, O_CLOEXEC) != 0) {
    result.error = fmt::format("pipe: {}", std::strerror(errno));
    return result;
  }
  const pid_t pid = spawnCommand(argv, out, err, &result);
  if (pid < 0) return result;
  result.started = true;
  ::close(out.fds[1]);
  out.fds[1] = -1;
  ::close(err.fds[1]);
  err.fds[1] = -1;
  collectOutput(out.fds[0], err.fds[0], timeout, maxOutput, &result);
  if (result.timedOut) ::kill(-pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!result.timedOut && WIFEXITED(status)) {
    result.exitCode = WEXITSTATUS(status);
    // posix_spawnp reports a missing program as exit 127 of the child.
    if (result.exitCode == 127 && result.out.empty()) {
      result.started = false;
      result.error = fmt::format("{}: not found in PATH", argv[0]);
    }
  } else if (!result.timedOut && WIFSIGNALED(status)) {
    result.error = fmt::format("{} was killed by signal {}", argv[0], WTERMSIG(status));
  }
  if (result.timedOut) {
    result.error = fmt::format("{} did not finish within {} ms and was killed", argv[0],
                               timeout.count());
  }
  return result;
}

}  // namespace dtrain::launcher::monitor
