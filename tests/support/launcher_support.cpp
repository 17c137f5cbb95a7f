#include "launcher_support.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "child_env.h"
#include "test_support.h"

namespace dtrain::testing {

namespace {

// Launches under test, by pid, and the statuses reapOrphans() collected for them.
std::set<pid_t>& tracked() {
  static std::set<pid_t> pids;
  return pids;
}

// Subreaper for the whole test process, set before the first launch starts.
void becomeSubreaper() {
  static bool done = [] {
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    return true;
  }();
  (void)done;
}

}  // namespace

std::string launchPath() { return binaryPath("launch"); }
std::string workerPath() { return binaryPath("testing/worker/worker"); }

LaunchProcess::LaunchProcess(const std::vector<std::string>& args,
                             const std::vector<std::string>& env,
                             const std::vector<std::string>& wrapper) {
  becomeSubreaper();
  // The child's environment: ours, minus launcher options a developer may have set, plus `env`.
  std::vector<std::string> envStrings = childEnvironment(env, "DTRAIN_");
  std::vector<std::string> argvStrings = wrapper;
  argvStrings.push_back(launchPath());
  argvStrings.insert(argvStrings.end(), args.begin(), args.end());
  std::vector<char*> argv, envp;
  for (auto& s : argvStrings) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (auto& s : envStrings) envp.push_back(s.data());
  envp.push_back(nullptr);

  int out[2], err[2];
  EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
  EXPECT_EQ(::pipe2(err, O_CLOEXEC), 0);
  start_ = std::chrono::steady_clock::now();
  pid_ = ::fork();
  if (pid_ == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    int nul = ::open("/dev/null", O_RDONLY);
    ::dup2(nul, STDIN_FILENO);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  tracked().insert(pid_);
  ::close(out[1]);
  ::close(err[1]);
  outFd_ = out[0];
  errFd_ = err[0];
  ::fcntl(outFd_, F_SETFL, O_NONBLOCK);
  ::fcntl(errFd_, F_SETFL, O_NONBLOCK);
}

LaunchProcess::~LaunchProcess() {
  if (!exited_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    wait(10);
  }
  if (outFd_ >= 0) ::close(outFd_);
  if (errFd_ >= 0) ::close(errFd_);
  tracked().erase(pid_);
}

double LaunchProcess::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void LaunchProcess::pump(int timeoutMs) {
  pollfd fds[2] = {{outFd_, POLLIN, 0}, {errFd_, POLLIN, 0}};
  int n = ::poll(fds, 2, timeoutMs);
  if (n <= 0) return;
  char buf[65536];
  bool got = false;
  for (int i = 0; i < 2; ++i) {
    if (fds[i].fd < 0) continue;
    while (true) {
      ssize_t r = ::read(fds[i].fd, buf, sizeof buf);
      if (r <= 0) break;
      (i == 0 ? out_ : err_).append(buf, static_cast<size_t>(r));
      got = true;
    }
  }
  if (got) outTimes_.push_back({out_.size(), err_.size(), elapsed()});
}

double LaunchProcess::firstSeen(const std::string& needle) const {
  // outTimes_ records, after each read, how far each stream had got and when: the first record
  // covering the end of the needle's first occurrence is when it arrived, to within one read.
  size_t atOut = out_.find(needle);
  size_t atErr = err_.find(needle);
  for (const auto& t : outTimes_) {
    if ((atOut != std::string::npos && t.outSize >= atOut + needle.size()) ||
        (atErr != std::string::npos && t.errSize >= atErr + needle.size())) {
      return t.when;
    }
  }
  return -1;
}

bool LaunchProcess::waitFor(const std::function<bool(const std::string&, const std::string&)>& pred,
                            double seconds) {
  const double deadline = elapsed() + seconds;
  while (!pred(out_, err_)) {
    if (exited_ || elapsed() > deadline) return false;
    pump(20);
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      status_ = status;
      pump(0);
    }
  }
  return true;
}

bool LaunchProcess::waitForOutput(const std::string& needle, double seconds) {
  return waitFor(
      [&](const std::string& o, const std::string& e) {
        return o.find(needle) != std::string::npos || e.find(needle) != std::string::npos;
      },
      seconds);
}

LaunchResult LaunchProcess::wait(double seconds) {
  LaunchResult r;
  const double deadline = elapsed() + seconds;
  while (!exited_) {
    pump(20);
    int status = 0;
    pid_t got = ::waitpid(pid_, &status, WNOHANG);
    if (got == pid_) {
      exited_ = true;
      status_ = status;
      r.seconds = elapsed();
      break;
    }
    if (elapsed() > deadline) {
      r.timedOut = true;
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status_, 0);
      exited_ = true;
      r.seconds = elapsed();
      break;
    }
  }
  if (r.seconds == 0) r.seconds = elapsed();
  // The rest of the output: the pipes close when launch (and everything it started) is gone;
  // do not wait for stray writers longer than a moment.
  for (int i = 0; i < 50; ++i) {
    size_t before = out_.size() + err_.size();
    pump(i == 0 ? 50 : 10);
    if (out_.size() + err_.size() == before) break;
  }
  r.exitCode = WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
  r.out = out_;
  r.err = err_;
  return r;
}

void LaunchProcess::signal(int signo) {
  if (!exited_) ::kill(pid_, signo);
}

LaunchResult runLaunch(const std::vector<std::string>& args, const std::vector<std::string>& env,
                       double seconds) {
  LaunchProcess p(args, env);
  return p.wait(seconds);
}

std::vector<pid_t> jobPids(const std::string& output) {
  std::vector<pid_t> pids;
  static const std::regex kPid(R"(\b(?:pid|ppid)=(\d+))");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), kPid);
       it != std::sregex_iterator(); ++it) {
    pid_t p = static_cast<pid_t>(std::stol((*it)[1].str()));
    if (p > 1 && std::find(pids.begin(), pids.end(), p) == pids.end()) pids.push_back(p);
  }
  return pids;
}

void reapOrphans() {
  // Children of every thread of this process (orphans are reparented to one of them).
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::string text = readFile(task.path().string() + "/children");
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find(' ', start);
      std::string word = text.substr(start, end == std::string::npos ? end : end - start);
      if (!word.empty()) {
        pid_t p = static_cast<pid_t>(std::stol(word));
        int status = 0;
        if (!tracked().count(p)) ::waitpid(p, &status, WNOHANG);
      }
      if (end == std::string::npos) break;
      start = end + 1;
    }
  }
}

std::vector<pid_t> waitGone(const std::vector<pid_t>& pids, double seconds) {
  auto start = std::chrono::steady_clock::now();
  while (true) {
    reapOrphans();
    std::vector<pid_t> left;
    for (pid_t p : pids) {
      if (processExists(p)) left.push_back(p);
    }
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (left.empty() || waited > seconds) return left;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

int countLines(const std::string& text, const std::string& needle) {
  int n = 0;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    std::string line = text.substr(start, nl == std::string::npos ? nl : nl - start);
    if (line.find(needle) != std::string::npos) ++n;
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  return n;
}

std::vector<std::string> workerStoreFlags() {
  return {"--connect-timeout-ms", "10000", "--barrier-timeout-ms", "20000"};
}

std::vector<std::string> launchArgs(const std::vector<std::string>& launchOptions,
                                    const std::vector<std::string>& workerFlags) {
  std::vector<std::string> args = launchOptions;
  args.push_back(workerPath());
  for (const auto& f : workerStoreFlags()) args.push_back(f);
  args.insert(args.end(), workerFlags.begin(), workerFlags.end());
  return args;
}

int metricsPort(LaunchProcess& p, double seconds) {
  static const std::regex re("launch: metrics on http://[^ ]*:([0-9]+)/metrics");
  if (!p.waitFor(
          [](const std::string&, const std::string& err) {
            return err.find("launch: metrics on") != std::string::npos;
          },
          seconds)) {
    return -1;
  }
  std::smatch m;
  const std::string err = p.err();
  return std::regex_search(err, m, re) ? std::stoi(m[1]) : -1;
}

bool waitForWorkers(LaunchProcess& p, int n, double seconds) {
  return p.waitFor(
      [n](const std::string& o, const std::string&) { return countLines(o, "worker rank=") >= n; },
      seconds);
}

void expectNoneLeft(const std::string& output) {
  std::vector<pid_t> pids = jobPids(output);
  EXPECT_FALSE(pids.empty()) << "the job printed no pids";
  std::vector<pid_t> left = waitGone(pids, 0.5);
  for (pid_t p : left) {
    ADD_FAILURE() << "pid " << p << " of the job is still there (state " << processStateOf(p)
                  << ")";
  }
}

std::vector<pid_t> childrenOf(pid_t pid) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::istringstream in(readFile(task.path().string() + "/children"));
    pid_t c;
    while (in >> c) out.push_back(c);
  }
  return out;
}

char processStateOf(pid_t pid) {
  std::string text = readFile("/proc/" + std::to_string(pid) + "/stat");
  size_t paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() ? 0 : text[paren + 2];
}

std::string signalNameOf(int signo) {
  switch (signo) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGQUIT: return "SIGQUIT";
    case SIGKILL: return "SIGKILL";
    default: return "SIG" + std::to_string(signo);
  }
}

std::unique_ptr<MemoryCgroup> MemoryCgroup::create(const std::string& name, size_t limitBytes,
                                                   std::string* why) {
  std::string dir = "/sys/fs/cgroup/memory/" + name;
  std::string limitFile = "memory.limit_in_bytes";
  if (!std::filesystem::exists("/sys/fs/cgroup/memory/cgroup.procs")) {
    dir = "/sys/fs/cgroup/" + name;  // cgroup v2
    limitFile = "memory.max";
  }
  std::error_code ec;
  if (!std::filesystem::create_directory(dir, ec)) {
    *why = "cannot create a memory cgroup (" + dir + ": " + ec.message() +
           "); needs root and a writable cgroup file system";
    return nullptr;
  }
  std::unique_ptr<MemoryCgroup> cgroup(new MemoryCgroup(dir));
  writeFile(dir + "/" + limitFile, std::to_string(limitBytes));
  if (readFile(dir + "/" + limitFile).empty()) {
    *why = "the memory controller is not available in " + dir;
    return nullptr;
  }
  return cgroup;
}

MemoryCgroup::~MemoryCgroup() {
  // Processes leave a cgroup when they are reaped; a moment for the last ones.
  std::error_code ec;
  for (int i = 0; i < 50 && !std::filesystem::remove(dir_, ec); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_FALSE(std::filesystem::exists(dir_)) << "cgroup " << dir_ << " left behind";
}

std::vector<std::string> MemoryCgroup::wrapper() const {
  return {"/bin/sh", "-c", "echo $$ > " + dir_ + "/cgroup.procs && exec \"$@\"", "sh"};
}

}  // namespace dtrain::testing
