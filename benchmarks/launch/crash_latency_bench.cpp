// crash_latency_bench: how soon after a worker crashes do the other workers hear of it? For
// `launch` and, as the peer, torchrun, interleaved crash by crash, on an idle machine and on one
// whose every CPU is busy.
//
// Each run starts N test workers (testing/worker/worker --no-store --on-sigterm 0) under the
// launcher; the last rank SIGKILLs itself at step 20 (DTRAIN_FAULT=signal:KILL), printing its
// CLOCK_MONOTONIC time just before; every other rank prints the CLOCK_MONOTONIC time at which
// the launcher's SIGTERM reached it. One sample is the time until the *last* of them was told:
// the crash is noticed, the job's teardown is under way, every survivor knows. The clock is the
// same in every process, so no launcher log or pipe latency is in the number.
//
// torchrun polls its workers every --monitor_interval seconds (0.1 by default in PyTorch 2.x,
// spelled out here: 5 s in 1.x).
//
//   crash_latency_bench [--crashes N] [--nproc N] [--no-torchrun] [--no-load] [--smoke]
//                       [--launch PATH] [--worker PATH] [--python PATH] [--torchrun PATH]
// --python, --torchrun: by default the build's DTRAIN_PYTHON (the project's .venv) and the
//   torchrun beside it.
// Load: one busy-looping process per online CPU, at the same priority, for the loaded half.
// --smoke: 3 crashes, idle, launch only (CI: checks it runs).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_run.h"

namespace {

using namespace dtrain::bench;

struct Options {
  int crashes = 50;
  int nproc = 4;
  bool torchrun = true;
  bool load = true;
  bool smoke = false;
  std::string launch = DTRAIN_BENCH_LAUNCH;
  std::string worker = DTRAIN_BENCH_WORKER;
  std::string python = DTRAIN_PYTHON;
  std::string torchrunPath = DTRAIN_TORCHRUN;
};

constexpr const char* kUsage =
    "usage: crash_latency_bench [--crashes N] [--nproc N] [--no-torchrun] [--no-load] [--smoke]\n"
    "                           [--launch PATH] [--worker PATH] [--python PATH] [--torchrun PATH]\n"
    "Crash of one worker -> SIGTERM at every other worker, in ms, under launch and torchrun,\n"
    "idle and with every CPU busy; see benchmarks/README.md.\n";

Options parse(int argc, char** argv) {
  Options o;
  Flags flags("crash_latency_bench", kUsage, argc, argv);
  while (flags.next()) {
    const std::string& a = flags.flag();
    if (a == "--crashes") o.crashes = std::max(1, std::atoi(flags.value().c_str()));
    else if (a == "--nproc") o.nproc = std::max(2, std::atoi(flags.value().c_str()));
    else if (a == "--no-torchrun") o.torchrun = false;
    else if (a == "--no-load") o.load = false;
    else if (a == "--smoke") o.smoke = true;
    else if (a == "--launch") o.launch = flags.value();
    else if (a == "--worker") o.worker = flags.value();
    else if (a == "--python") o.python = flags.value();
    else if (a == "--torchrun") o.torchrunPath = flags.value();
    else flags.usageError("unknown argument " + a);
  }
  if (o.smoke) {
    o.crashes = 3;
    o.torchrun = false;
    o.load = false;
  }
  return o;
}

// Runs argv with `env` added, stdout captured, until it exits or `seconds` pass (then SIGKILL).
// Returns the output; *ok is false on a timeout.
std::string runCapture(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                       double seconds, bool* ok) {
  int out[2];
  if (::pipe(out) != 0) std::abort();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    int nul = ::open("/dev/null", O_RDWR);
    ::dup2(nul, STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(nul, STDERR_FILENO);
    ::close(out[0]);
    for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
    execArgv(argv);
  }
  ::close(out[1]);
  std::string text;
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  *ok = true;
  while (true) {
    int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                    until - std::chrono::steady_clock::now())
                                    .count());
    if (left <= 0) {
      *ok = false;
      ::kill(-pid, SIGKILL);
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    if (::poll(&p, 1, left) <= 0) continue;
    char buf[65536];
    ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  ::waitpid(pid, nullptr, 0);
  return text;
}

// Crash -> last SIGTERM among the other ranks, in ms; negative when the output lacks a time.
double latencyMs(const std::string& out, int nproc) {
  static const std::regex kCrash(
      R"(rank (\d+): step \d+: injecting signal:KILL[^\n]*\(t=([0-9.]+)\))");
  static const std::regex kTerm(
      R"(rank (\d+): SIGTERM: checkpointing and exiting \(t=([0-9.]+)\))");
  std::smatch m;
  if (!std::regex_search(out, m, kCrash)) return -1;
  const double crash = std::stod(m[2].str());
  double last = -1;
  int told = 0;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), kTerm); it != std::sregex_iterator();
       ++it) {
    last = std::max(last, std::stod((*it)[2].str()));
    ++told;
  }
  if (told != nproc - 1) return -1;
  return (last - crash) * 1e3;
}

struct Runner {
  std::string name;
  std::vector<std::string> argv;  // the launcher's part; the worker follows
  std::vector<double> samples;
  int failures = 0;
};

// One busy-looping process per online CPU; killed by stopLoad().
std::vector<pid_t> startLoad() {
  std::vector<pid_t> pids;
  long cpus = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  for (long i = 0; i < cpus; ++i) {
    pid_t pid = ::fork();
    if (pid == 0) {
      volatile unsigned long spin = 0;
      while (true) spin = spin + 1;
    }
    pids.push_back(pid);
  }
  return pids;
}

void stopLoad(const std::vector<pid_t>& pids) {
  for (pid_t p : pids) ::kill(p, SIGKILL);
  for (pid_t p : pids) ::waitpid(p, nullptr, 0);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const std::string n = std::to_string(o.nproc);
  const std::vector<std::string> workerArgs = {o.worker,  "--no-store",   "--steps",
                                               "100000",  "--step-ms",    "10",
                                               "--quiet", "--on-sigterm", "0"};
  const std::string fault = "DTRAIN_FAULT=signal:KILL@rank=" + std::to_string(o.nproc - 1) +
                            ",step=20";

  int failures = 0;
  std::string lastFailure;
  fmt::print("# crash_latency_bench: one worker of {} SIGKILLs itself; ms until the last other "
             "worker got SIGTERM; {} crashes per cell, runners interleaved\n",
             o.nproc, o.crashes);
  fmt::print("{:>7} {:>16} {:>8} {:>8} {:>8} {:>8} {:>8} {:>12}\n", "machine", "runner", "n",
             "median", "p90", "worst", "best", "tr/launch");
  std::vector<bool> conditions = {false};
  if (o.load) conditions.push_back(true);
  for (bool loaded : conditions) {
    std::vector<Runner> runners;
    runners.push_back({"launch", {o.launch, "--nproc-per-node", n, "--grace-period", "5"}, {}, 0});
    if (o.torchrun && executable(o.python) && executable(o.torchrunPath)) {
      runners.push_back(
          {"torchrun mi=0.1",
           {o.python, o.torchrunPath, "--nnodes", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint",
            "@endpoint@", "--nproc_per_node", n, "--monitor_interval", "0.1", "--no_python"},
           {},
           0});
    }
    std::vector<pid_t> load;
    if (loaded) load = startLoad();
    for (int crash = 0; crash < o.crashes; ++crash) {
      for (auto& r : runners) {
        std::vector<std::string> args = r.argv;
        for (auto& a : args) {
          if (a == "@endpoint@") a = freeLocalEndpoint();
        }
        args.insert(args.end(), workerArgs.begin(), workerArgs.end());
        bool ok = false;
        std::string out = runCapture(args, {fault}, 120, &ok);
        double ms = ok ? latencyMs(out, o.nproc) : -1;
        if (ms < 0) {
          ++r.failures;
          ++failures;
          lastFailure = fmt::format("{} ({}): {}", r.name,
                                    ok ? "no times in its output" : "timed out",
                                    out.substr(0, 600));
          continue;
        }
        r.samples.push_back(ms);
      }
    }
    stopLoad(load);
    // No sample (every crash of a runner failed): "nan" in its cells.
    const double launchMedian = median(runners[0].samples, NAN);
    for (const auto& r : runners) {
      const double med = median(r.samples, NAN);
      const Spread range = spread(r.samples, NAN);
      std::string ratio = "-";
      if (&r != &runners[0] && !r.samples.empty()) {
        ratio = fmt::format("{:.1f}x", med / launchMedian);
      }
      fmt::print("{:>7} {:>16} {:>8} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>12}\n",
                 loaded ? "loaded" : "idle", r.name, r.samples.size(), med,
                 percentile(r.samples, 0.9, NAN), range.max, range.min, ratio);
    }
  }
  if (failures > 0) {
    fmt::print(stderr, "crash_latency_bench: {} run(s) failed; last: {}\n", failures, lastFailure);
  }
  return failures == 0 ? 0 : 1;
}
