// launch_bench: wall time from start to exit of a whole job -- `launch --nproc-per-node N`
// beside `torchrun --standalone` -- for N in {1, 2, 4}, every configuration interleaved in the
// same run (so load drifts hit all alike), medians and minima, and the ratio printed.
//
// Workloads (each joins the job's store and passes one barrier, then exits):
//   worker    the torch-free test worker (tests/worker/worker --steps 0 --quiet), C++
//   libtorch  a minimal libtorch worker (benchmarks/launch/torch_worker.cpp); "bare" is N copies
//             of the same binary started at once without a launcher (and without the store): the
//             floor every N-process libtorch job pays on this machine
//   python    benchmarks/launch/bench_worker.py (torch.distributed.TCPStore at MASTER_ADDR:PORT),
//             under launch and under torchrun (default, and --monitor_interval 0.1); torchrun
//             runs what --standalone means (c10d rendezvous on localhost, one node) on a free port
//
//   launch_bench [--reps N] [--nprocs 1,2,4] [--no-torchrun] [--smoke] [--multinode]
//                [--launch PATH] [--worker PATH] [--torch-worker PATH]
//                [--python /usr/bin/python3] [--torchrun /usr/bin/torchrun] [--script PATH]
// --smoke: one rep of the torch-free worker with N = 1, 2 (CI: checks it runs, < 15 s).
// --multinode (root): instead, 3 nodes x 2 workers of the torch-free worker in a simulated
//   cluster (scripts/netns-cluster.sh): launch's fan-out from outside the nodes, the same 6
//   workers by launch on one node, and torchrun started by hand in each namespace with c10d
//   rendezvous (--nnodes 3, --no-python) -- interleaved, medians -- then the time a silent node
//   (its cable out) takes to be noticed, against --heartbeat-timeout.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace {

struct Options {
  int reps = 7;
  std::vector<int> nprocs = {1, 2, 4};
  bool torchrun = true;
  bool smoke = false;
  std::string launch = DTRAIN_BENCH_LAUNCH;
  std::string worker = DTRAIN_BENCH_WORKER;
  std::string torchWorker = DTRAIN_BENCH_TORCH_WORKER;  // empty when not built
  std::string python = "/usr/bin/python3";
  std::string torchrunPath = "/usr/bin/torchrun";
  std::string script = DTRAIN_BENCH_SCRIPT;
  bool multinode = false;
  std::string clusterScript = DTRAIN_BENCH_CLUSTER_SCRIPT;
};

constexpr const char* kUsage =
    "usage: launch_bench [--reps N] [--nprocs 1,2,4] [--no-torchrun] [--smoke] [--multinode]\n"
    "                    [--launch PATH] [--worker PATH] [--torch-worker PATH]\n"
    "                    [--python /usr/bin/python3] [--torchrun /usr/bin/torchrun] [--script PATH]\n"
    "Start-to-exit wall time of `launch --nproc-per-node N` (torch-free worker, libtorch worker,\n"
    "Python script) beside torchrun; see benchmarks/README.md.\n";

[[noreturn]] void usage(const std::string& what) {
  std::fprintf(stderr, "launch_bench: %s\n%s", what.c_str(), kUsage);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (a == "--reps") o.reps = std::max(1, std::atoi(value().c_str()));
    else if (a == "--nprocs") {
      o.nprocs.clear();
      std::string list = value();
      size_t start = 0;
      while (start < list.size()) {
        size_t comma = list.find(',', start);
        o.nprocs.push_back(std::atoi(list.substr(start, comma - start).c_str()));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else if (a == "--no-torchrun") o.torchrun = false;
    else if (a == "--smoke") o.smoke = true;
    else if (a == "--multinode") o.multinode = true;
    else if (a == "--launch") o.launch = value();
    else if (a == "--worker") o.worker = value();
    else if (a == "--torch-worker") o.torchWorker = value();
    else if (a == "--python") o.python = value();
    else if (a == "--torchrun") o.torchrunPath = value();
    else if (a == "--script") o.script = value();
    else usage("unknown flag " + a);
  }
  if (o.smoke) {
    o.reps = 1;
    o.nprocs = {1, 2};
    o.torchrun = false;
    o.torchWorker.clear();
  }
  return o;
}

// Runs every command of `argvs` at once, to completion, output discarded (stderr kept in a file
// for failures); returns seconds until the last exited, negative when any did not exit 0.
double timeRunAll(const std::vector<std::vector<std::string>>& argvs, std::string* failure) {
  char errPath[] = "/tmp/launch_bench_err_XXXXXX";
  int errFd = ::mkstemp(errPath);
  std::vector<std::vector<char*>> all;
  for (const auto& argv : argvs) {
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    all.push_back(args);
  }
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
                           n > 0 ? std::string(buf, n) : "");
  }
  ::close(errFd);
  ::unlink(errPath);
  return ok ? seconds : -seconds;
}

// `copies` instances of argv at once.
double timeRun(const std::vector<std::string>& argv, std::string* failure, int copies = 1) {
  return timeRunAll(std::vector<std::vector<std::string>>(static_cast<size_t>(copies), argv),
                    failure);
}

// Stands for "localhost:<a port free right now>" in a command line.
constexpr const char* kFreeEndpoint = "@free-endpoint@";

std::vector<std::string> withFreePort(std::vector<std::string> argv) {
  for (auto& a : argv) {
    if (a != kFreeEndpoint) continue;
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
    ::close(fd);
    a = "localhost:" + std::to_string(ntohs(sa.sin_port));
  }
  return argv;
}

struct Config {
  std::string workload;  // worker | libtorch | python
  std::string runner;    // launch | bare | torchrun | torchrun-mi0.1
  int nproc;
  std::vector<std::string> argv;
  int copies = 1;        // bare: nproc copies at once, no launcher
  std::vector<double> samples;
  int failures = 0;
  std::string lastFailure;
};

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

bool executable(const std::string& path) { return !path.empty() && ::access(path.c_str(), X_OK) == 0; }


std::string shellOut(const std::string& command, int* rc = nullptr) {
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

// Seconds from cutting a node's cable until launch says it stops the round (its stderr line),
// or -1. The job: 3 nodes x 2 long-running workers, heartbeat 0.5 s, timeout `timeout` s.
double detectionSeconds(const std::vector<std::string>& launchArgv, const std::string& script,
                        const std::string& name, int node) {
  int out[2];
  int err[2];
  if (::pipe(out) != 0 || ::pipe(err) != 0) return -1;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::close(out[0]);
    ::close(err[0]);
    std::vector<char*> args;
    for (const auto& a : launchArgv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  std::string o;
  std::string e;
  auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point cut{};
  double detected = -1;
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
    pollfd p[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
    ::poll(p, 2, 50);
    char buf[4096];
    for (int i = 0; i < 2; ++i) {
      if (!(p[i].revents & (POLLIN | POLLHUP))) continue;
      ssize_t n = ::read(p[i].fd, buf, sizeof buf);
      if (n > 0) (i == 0 ? o : e).append(buf, static_cast<size_t>(n));
    }
    size_t started = 0;
    for (size_t at = o.find("worker rank="); at != std::string::npos; at = o.find("worker rank=", at + 1)) {
      ++started;
    }
    if (cut == std::chrono::steady_clock::time_point{} && started >= 6) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      shellOut(script + " link " + name + " " + std::to_string(node) + " down");
      cut = std::chrono::steady_clock::now();
    }
    if (cut != std::chrono::steady_clock::time_point{} && e.find("stopping round") != std::string::npos) {
      detected = std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count();
      break;
    }
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(out[0]);
  ::close(err[0]);
  shellOut(script + " link " + name + " " + std::to_string(node) + " up");
  return detected;
}

int multinodeBench(const Options& o) {
  if (::geteuid() != 0) {
    std::fprintf(stderr, "launch_bench --multinode: needs root (network namespaces, sshd)\n");
    return 2;
  }
  const std::string name = "lb" + std::to_string(::getpid() % 100000);
  int rc = 0;
  const std::string dir = shellOut(o.clusterScript + " up 3 " + name + " 2>&1", &rc);
  if (rc != 0) {
    std::fprintf(stderr, "launch_bench: netns-cluster.sh up failed: %s\n", dir.c_str());
    shellOut(o.clusterScript + " down " + name);
    return 1;
  }
  std::vector<std::string> hosts;
  {
    std::string text = shellOut("cat " + dir + "/hosts");
    size_t start = 0;
    while (start < text.size()) {
      size_t nl = text.find('\n', start);
      hosts.push_back(text.substr(start, nl == std::string::npos ? nl : nl - start));
      if (nl == std::string::npos) break;
      start = nl + 1;
    }
  }
  const std::string ssh = dir + "/ssh_config";
  const std::vector<std::string> worker = {o.worker, "--steps", "0", "--quiet", "--no-store"};
  // The store on the bridge's address at a port free now (29400 may be held on every address by
  // another job on a shared machine).
  const std::string bridge = hosts[0].substr(0, hosts[0].rfind('.')) + ".254";
  const std::string endpoint = withFreePort({kFreeEndpoint})[0].replace(0, 9, bridge);
  struct Row {
    std::string label;
    std::vector<std::vector<std::string>> argvs;
    std::vector<double> samples;
    int failures = 0;
    std::string lastFailure;
  };
  std::vector<Row> rows;
  rows.push_back({"launch fan-out, 3 nodes x 2", {cat({o.launch, "--hosts",
      hosts[0] + "," + hosts[1] + "," + hosts[2], "--ssh-config", ssh, "--rdzv-endpoint", endpoint,
      "--nproc-per-node", "2"}, worker)}, {}, 0, {}});
  rows.push_back({"launch, one node x 6", {cat({o.launch, "--nproc-per-node", "6"}, worker)}, {}, 0, {}});
  rows.push_back({"launch, one node x 2", {cat({o.launch, "--nproc-per-node", "2"}, worker)}, {}, 0, {}});
  // The floor of any ssh fan-out on this machine: the three connections alone, in parallel.
  Row sshOnly{"ssh to the 3 hosts (true)", {}, {}, 0, {}};
  for (int k = 0; k < 3; ++k) sshOnly.argvs.push_back({"/usr/bin/ssh", "-F", ssh, hosts[k], "true"});
  rows.push_back(sshOnly);
  if (o.torchrun && executable(o.torchrunPath) && executable(o.python)) {
    Row t{"torchrun c10d, 3 nodes x 2", {}, {}, 0, {}};
    for (int k = 0; k < 3; ++k) {
      t.argvs.push_back(cat({o.clusterScript, "exec", name, std::to_string(k), o.python,
                             o.torchrunPath, "--nnodes", "3", "--nproc_per_node", "2",
                             "--rdzv_backend", "c10d", "--rdzv_endpoint", hosts[0] + ":29400",
                             "--rdzv_id", "bench",
                             // In a namespace the host name does not resolve to the namespace's
                             // address, so torchrun's guess of who hosts the store fails: say it.
                             "--rdzv_conf", k == 0 ? "is_host=1,join_timeout=60" : "is_host=0,join_timeout=60",
                             "--no_python", "--redirects", "9:0", "--tee", "9:0"},
                            worker));
    }
    rows.push_back(t);
  }
  for (auto& r : rows) timeRunAll(r.argvs, nullptr);  // warm-up
  for (int rep = 0; rep < o.reps; ++rep) {
    for (auto& r : rows) {
      std::string failure;
      double s = timeRunAll(r.argvs, &failure);
      if (s < 0) {
        ++r.failures;
        r.lastFailure = failure;
      } else {
        r.samples.push_back(s * 1e3);
      }
    }
  }
  char load[128] = {};
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (!std::fgets(load, sizeof load, f)) load[0] = '\0';
    std::fclose(f);
  }
  fmt::print("# launch_bench --multinode: wall time start->exit in ms, median (min) of {} "
             "interleaved reps; torch-free test worker (--no-store); load {}", o.reps,
             load[0] ? load : "?\n");
  fmt::print("{:<30} {:>18} {:>14}\n", "job", "ms", "vs fan-out");
  const double fan = median(rows[0].samples);
  for (const auto& r : rows) {
    std::string cell = r.samples.empty()
                           ? std::string("-")
                           : fmt::format("{:.1f} ({:.1f})", median(r.samples),
                                         *std::min_element(r.samples.begin(), r.samples.end()));
    std::string ratio = r.samples.empty() || fan <= 0 ? "-" : fmt::format("{:.2f}x", median(r.samples) / fan);
    fmt::print("{:<30} {:>18} {:>14}\n", r.label, cell, ratio);
  }
  if (!rows[0].samples.empty() && !rows[1].samples.empty()) {
    fmt::print("# fan-out adds {:+.1f} ms to the same 6 workers on one node (aim: <= 500)\n",
               fan - median(rows[1].samples));
  }
  if (!rows[3].samples.empty()) {
    fmt::print("# of which the ssh connections alone take {:.1f} ms: launch's own part of the "
               "fan-out is {:+.1f} ms over one node\n",
               median(rows[3].samples), fan - median(rows[3].samples) - median(rows[1].samples));
  }
  if (rows.size() > 4 && !rows[4].samples.empty() && fan > 0) {
    fmt::print("# torchrun / launch fan-out: {:.1f}x (aim: >= 5x)\n", median(rows[4].samples) / fan);
  }
  std::vector<double> detections;
  for (int rep = 0; rep < std::min(o.reps, 3); ++rep) {
    double d = detectionSeconds(
        {o.launch, "--hosts", hosts[0] + "," + hosts[1] + "," + hosts[2], "--ssh-config", ssh,
         "--rdzv-endpoint", endpoint, "--ssh-option", "ServerAliveInterval=60", "--nproc-per-node", "2", "--heartbeat-interval",
         "0.5", "--heartbeat-timeout", "3", "--grace-period", "1", o.worker, "--steps", "100000",
         "--step-ms", "50", "--no-store"},
        o.clusterScript, name, 1);
    if (d >= 0) detections.push_back(d);
  }
  if (!detections.empty()) {
    fmt::print("# a silent node (cable out) noticed after {:.2f} s median of {} (min {:.2f}, max "
               "{:.2f}); --heartbeat-timeout 3 (aim: <= timeout + 1 s)\n",
               median(detections), detections.size(),
               *std::min_element(detections.begin(), detections.end()),
               *std::max_element(detections.begin(), detections.end()));
  }
  shellOut(o.clusterScript + " down " + name);
  int failures = 0;
  for (const auto& r : rows) {
    if (r.failures) {
      failures += r.failures;
      fmt::print(stderr, "launch_bench: {} failed {} time(s); last: {}\n", r.label, r.failures,
                 r.lastFailure);
    }
  }
  return failures == 0 && !detections.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  if (o.multinode) return multinodeBench(o);
  std::vector<Config> configs;
  const std::string np = "--nproc-per-node";
  for (int n : o.nprocs) {
    const std::string ns = std::to_string(n);
    configs.push_back({"worker", "launch", n,
                       {o.launch, np, ns, o.worker, "--steps", "0", "--quiet"}, 1, {}, 0, {}});
    if (executable(o.torchWorker)) {
      configs.push_back({"libtorch", "launch", n, {o.launch, np, ns, o.torchWorker}, 1, {}, 0, {}});
      configs.push_back({"libtorch", "bare", n, {o.torchWorker, "--bare"}, n, {}, 0, {}});
    }
    if (o.torchrun && executable(o.python)) {
      configs.push_back({"python", "launch", n,
                         {o.launch, np, ns, "--python", o.python, o.script}, 1, {}, 0, {}});
    }
    if (o.torchrun && executable(o.torchrunPath)) {
      // Debian's torchrun 1.13 crashes at start without a --redirects/--tee value: 9:0 names a
      // local rank that does not exist, so nothing is redirected. Its --standalone always uses
      // port 29400 (busy on a shared machine), so spell out what it means with a free port.
      std::vector<std::string> base = {o.python, o.torchrunPath, "--nnodes", "1", "--rdzv_backend",
                                       "c10d", "--rdzv_endpoint", kFreeEndpoint, "--nproc_per_node",
                                       ns, "--redirects", "9:0", "--tee", "9:0"};
      std::vector<std::string> mi = base;
      mi.insert(mi.end(), {"--monitor_interval", "0.1"});
      base.push_back(o.script);
      mi.push_back(o.script);
      configs.push_back({"python", "torchrun", n, base, 1, {}, 0, {}});
      configs.push_back({"python", "torchrun-mi0.1", n, mi, 1, {}, 0, {}});
    }
  }

  // Warm-up: page cache, dynamic loader caches.
  for (auto& c : configs) timeRun(withFreePort(c.argv), nullptr, c.copies);
  for (int rep = 0; rep < o.reps; ++rep) {
    for (auto& c : configs) {
      std::string failure;
      double s = timeRun(withFreePort(c.argv), &failure, c.copies);
      if (s < 0) {
        ++c.failures;
        c.lastFailure = failure;
      } else {
        c.samples.push_back(s * 1e3);
      }
    }
  }

  auto find = [&](const std::string& workload, const std::string& runner, int n) -> const Config* {
    for (const auto& c : configs) {
      if (c.workload == workload && c.runner == runner && c.nproc == n) return &c;
    }
    return nullptr;
  };
  auto cell = [](const Config* c) {
    if (!c || c->samples.empty()) return std::string("-");
    return fmt::format("{:.1f} ({:.1f})", median(c->samples), *std::min_element(c->samples.begin(), c->samples.end()));
  };

  char load[128] = {};
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (!std::fgets(load, sizeof load, f)) load[0] = '\0';
    std::fclose(f);
  }
  fmt::print("# launch_bench: wall time start->exit in ms, median (min) of {} interleaved reps; "
             "load {}", o.reps, load[0] ? load : "?\n");
  fmt::print("# worker: C++ test worker, join store + barrier; libtorch: minimal libtorch worker "
             "(bare = N copies at once, no launcher);\n# python: TCPStore join + barrier with torch imported\n");
  fmt::print("{:>6} {:>9} {:>16} {:>16} {:>16} {:>18} {:>10}\n", "nproc", "workload", "launch",
             "bare", "torchrun", "torchrun mi=0.1", "tr/launch");
  for (int n : o.nprocs) {
    for (const char* w : {"worker", "libtorch", "python"}) {
      const Config* l = find(w, "launch", n);
      if (!l) continue;
      const Config* t = find(w, "torchrun", n);
      const Config* tm = find(w, "torchrun-mi0.1", n);
      std::string ratio = "-";
      if (t && !t->samples.empty() && !l->samples.empty()) {
        ratio = fmt::format("{:.1f}x", median(t->samples) / median(l->samples));
      }
      fmt::print("{:>6} {:>9} {:>16} {:>16} {:>16} {:>18} {:>10}\n", n, w, cell(l),
                 cell(find(w, "bare", n)), cell(t), cell(tm), ratio);
    }
  }
  for (int n : o.nprocs) {
    const Config* l = find("libtorch", "launch", n);
    const Config* bare = find("libtorch", "bare", n);
    if (l && bare && !l->samples.empty() && !bare->samples.empty()) {
      fmt::print("# libtorch nproc={}: launch adds {:+.1f} ms to {} bare start-up(s) at once "
                 "(aim: < 100)\n", n, median(l->samples) - median(bare->samples), n);
    }
  }
  int failures = 0;
  for (const auto& c : configs) {
    if (c.failures) {
      failures += c.failures;
      fmt::print(stderr, "launch_bench: {} {} nproc={} failed {} time(s); last: {}\n", c.workload,
                 c.runner, c.nproc, c.failures, c.lastFailure);
    }
  }
  // Smoke mode is a check: every run must have worked.
  return failures == 0 ? 0 : 1;
}
