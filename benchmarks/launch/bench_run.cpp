#include "bench_run.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "free_port.h"

namespace dtrain::bench {

double timeRunAll(const std::vector<std::vector<std::string>>& argvs, std::string* failure,
                  int64_t* startNs) {
  char errPath[] = "/tmp/launch_bench_err_XXXXXX";
  int errFd = ::mkstemp(errPath);
  std::vector<std::vector<char*>> all;
  for (const auto& argv : argvs) {
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    all.push_back(args);
  }
  if (startNs) *startNs = monotonicNs();
  auto start = std::chrono::steady_clock::now();
  std::vector<pid_t> pids;
  for (auto& args : all) {
    pid_t pid = ::fork();
    if (pid == 0) {
      int nul = ::open("/dev/null", O_RDWR);
      ::dup2(nul, STDIN_FILENO);
      ::dup2(nul, STDOUT_FILENO);
      ::dup2(errFd, STDERR_FILENO);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  bool ok = true;
  int status = 0;
  for (pid_t pid : pids) {
    int st = 0;
    ::waitpid(pid, &st, 0);
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
      ok = false;
      status = st;
    }
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!ok && failure) {
    char buf[2048] = {};
    ::lseek(errFd, 0, SEEK_SET);
    ssize_t n = ::read(errFd, buf, sizeof buf - 1);
    *failure = fmt::format("{} -> status {}: {}", argvs[0][0], status,
                           n > 0 ? std::string(buf, static_cast<size_t>(n)) : "");
  }
  ::close(errFd);
  ::unlink(errPath);
  return ok ? seconds : -seconds;
}

double timeRun(const std::vector<std::string>& argv, std::string* failure, int copies) {
  return timeRunAll(std::vector<std::vector<std::string>>(static_cast<size_t>(copies), argv),
                    failure);
}

bool executable(const std::string& path) {
  return !path.empty() && ::access(path.c_str(), X_OK) == 0;
}

std::string shellOut(const std::string& command, int* rc) {
  std::string out;
  FILE* p = ::popen(command.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = ::pclose(p);
  if (rc) *rc = WIFEXITED(status) ? WEXITSTATUS(status) : 255;
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

int64_t monotonicNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

std::string loadAverage() {
  char load[128] = {};
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (!std::fgets(load, sizeof load, f)) load[0] = '\0';
    std::fclose(f);
  }
  float a = 0, b = 0, c = 0;
  if (std::sscanf(load, "%f %f %f", &a, &b, &c) != 3) return "?";
  return fmt::format("{:.1f} {:.1f} {:.1f}", a, b, c);
}

void execArgv(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execv(args[0], args.data());
  ::_exit(127);
}

std::string freeLocalEndpoint() {
  return "localhost:" + std::to_string(testing::freePortOn("127.0.0.1"));
}

Flags::Flags(std::string program, const char* usage, int argc, char** argv)
    : program_(std::move(program)), usage_(usage), argc_(argc), argv_(argv) {}

bool Flags::next() {
  if (++at_ >= argc_) return false;
  flag_ = argv_[at_];
  if (flag_ == "--help" || flag_ == "-h") {
    std::fputs(usage_, stdout);
    std::exit(0);
  }
  return true;
}

std::string Flags::value() {
  if (at_ + 1 >= argc_) usageError(flag_ + " needs a value");
  return argv_[++at_];
}

void Flags::usageError(const std::string& what) const {
  std::fprintf(stderr, "%s: %s\n%s", program_.c_str(), what.c_str(), usage_);
  std::exit(2);
}

}  // namespace dtrain::bench
