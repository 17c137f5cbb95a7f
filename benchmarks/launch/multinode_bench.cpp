// launch_bench --multinode: 3 nodes x 2 workers in a simulated cluster (scripts/netns-cluster.sh),
// every job running the same torch-free worker (testing/worker/worker --steps 0), so that the
// launchers, not the workers' start-up, are measured:
//   - launch's fan-out from outside the nodes (the master on the bridge, ssh to each node);
//   - the same 6 workers by launch on one node, and 2 (one node's share);
//   - ssh to the 3 hosts at once, running `true`: the floor of any ssh fan-out here;
//   - torchrun with c10d rendezvous started by hand in each namespace (--nnodes 3, --no_python).
// Two phases per job: from the start to every worker past a barrier, then from there to the
// launchers' exit. The barrier is on a store this benchmark hosts on the bridge (the worker's
// --store), so it is the same under every launcher; each worker records when it passed it
// (CLOCK_MONOTONIC, one clock for every namespace of the machine), and the last of them ends
// phase one. Jobs are interleaved rep by rep (load drifts hit all alike); medians and minima.
// Then: the time a silent node (its cable out) takes to be noticed, against --heartbeat-timeout.
#include "multinode_bench.h"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "bench_run.h"
#include "dtrain/base/store.h"
#include "dtrain/base/tcp_store.h"
#include "free_port.h"

namespace dtrain::bench {

namespace {

constexpr int kNodes = 3;
constexpr int kPerNode = 2;

std::string randomToken() {
  unsigned char raw[16] = {};
  if (FILE* f = std::fopen("/dev/urandom", "rb")) {
    if (std::fread(raw, 1, sizeof raw, f) != sizeof raw) raw[0] = 1;
    std::fclose(f);
  }
  std::string out;
  for (unsigned char c : raw) out += fmt::format("{:02x}", c);
  return out;
}

// Seconds from cutting a node's cable until launch says it stops the round (its stderr line),
// or -1. The job: 3 nodes x 2 long-running workers.
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
    execArgv(launchArgv);
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
    for (size_t at = o.find("worker rank="); at != std::string::npos;
         at = o.find("worker rank=", at + 1)) {
      ++started;
    }
    if (cut == std::chrono::steady_clock::time_point{} && started >= kNodes * kPerNode) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      shellOut(script + " link " + name + " " + std::to_string(node) + " down");
      cut = std::chrono::steady_clock::now();
    }
    if (cut != std::chrono::steady_clock::time_point{} &&
        e.find("stopping round") != std::string::npos) {
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

using Argvs = std::function<std::vector<std::vector<std::string>>(const std::string& prefix)>;

struct Row {
  Row(std::string l, int w, Argvs a) : label(std::move(l)), world(w), argvs(std::move(a)) {}
  std::string label;
  int world = 0;                  // workers that pass the barrier; 0: no barrier (ssh alone)
  Argvs argvs;                    // the commands of one run, started at once, keys under the prefix
  std::vector<double> total;      // ms, start -> exit
  std::vector<double> toBarrier;  // ms, start -> the last worker past the barrier
  std::vector<double> after;      // ms, from there -> exit
  int failures = 0;
  std::string lastFailure;
};

// One run of `row` with its keys under `prefix` on `store`; records its samples.
void runOnce(Row& row, const std::string& prefix, store::Store& store, bool record) {
  std::string failure;
  int64_t startNs = 0;
  const double seconds = timeRunAll(row.argvs(prefix), &failure, &startNs);
  if (!record) return;
  if (seconds < 0) {
    ++row.failures;
    row.lastFailure = failure;
    return;
  }
  int64_t lastPassed = 0;
  for (int r = 0; r < row.world; ++r) {
    const std::string key = fmt::format("{}/passed/rank{}", prefix, r);
    if (!store.check({key})) {
      ++row.failures;
      row.lastFailure = fmt::format("rank {} recorded no pass of the barrier ({})", r, key);
      return;
    }
    lastPassed = std::max<int64_t>(lastPassed, std::stoll(store.getString(key)));
  }
  row.total.push_back(seconds * 1e3);
  if (row.world > 0) {
    const double toBarrier = static_cast<double>(lastPassed - startNs) / 1e6;
    row.toBarrier.push_back(toBarrier);
    row.after.push_back(seconds * 1e3 - toBarrier);
  }
}

std::string cell(const std::vector<double>& v) {
  return v.empty() ? std::string("-") : fmt::format("{:.0f} ({:.0f})", median(v), spread(v).min);
}

std::string ratio(const std::vector<double>& a, const std::vector<double>& b) {
  return a.empty() || b.empty() || median(b) <= 0 ? std::string("-")
                                                  : fmt::format("{:.1f}x", median(a) / median(b));
}

// The simulated cluster the jobs run on, and launch's rendezvous endpoint on its bridge.
struct SimCluster {
  std::string name;  // netns-cluster.sh's name for it
  std::string dir;   // its files: hosts, ssh_config
  std::vector<std::string> hosts;
  std::string ssh;       // the ssh_config
  std::string bridge;    // this machine's address on the cluster's bridge
  std::string hostList;  // "a,b,c"
  std::string endpoint;  // launch's store on the bridge, at a port free now
};

// Brings the cluster up; nullopt, having said why, when it cannot.
std::optional<SimCluster> clusterUp(const MultinodeBenchOptions& o) {
  SimCluster c;
  c.name = "lb" + std::to_string(::getpid() % 100000);
  int rc = 0;
  c.dir = shellOut(o.clusterScript + " up " + std::to_string(kNodes) + " " + c.name + " 2>&1", &rc);
  if (rc != 0) {
    std::fprintf(stderr, "launch_bench: netns-cluster.sh up failed: %s\n", c.dir.c_str());
    shellOut(o.clusterScript + " down " + c.name);
    return std::nullopt;
  }
  const std::string text = shellOut("cat " + c.dir + "/hosts");
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    c.hosts.push_back(text.substr(start, nl == std::string::npos ? nl : nl - start));
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  c.ssh = c.dir + "/ssh_config";
  c.bridge = c.hosts[0].substr(0, c.hosts[0].rfind('.')) + ".254";
  c.hostList = c.hosts[0] + "," + c.hosts[1] + "," + c.hosts[2];
  // Not 29400: another job on a shared machine may hold it on every address.
  c.endpoint = c.bridge + ":" + std::to_string(testing::freePortOn(c.bridge));
  return c;
}

// The worker's command line, its barrier's keys under a prefix.
using WorkerArgv = std::function<std::vector<std::string>(const std::string& prefix)>;

std::vector<Row> jobRows(const MultinodeBenchOptions& o, const SimCluster& c,
                         const WorkerArgv& worker, bool withTorchrun) {
  std::vector<Row> rows;
  rows.emplace_back(
      "launch fan-out, 3 nodes x 2", kNodes * kPerNode, [&o, &c, worker](const std::string& p) {
        return std::vector<std::vector<std::string>>{
            cat({o.launch, "--hosts", c.hostList, "--ssh-config", c.ssh, "--rdzv-endpoint",
                 c.endpoint, "--nproc-per-node", std::to_string(kPerNode)},
                worker(p))};
      });
  rows.emplace_back("launch, one node x 6", kNodes * kPerNode, [&o, worker](const std::string& p) {
    return std::vector<std::vector<std::string>>{
        cat({o.launch, "--nproc-per-node", std::to_string(kNodes * kPerNode)}, worker(p))};
  });
  rows.emplace_back("launch, one node x 2", kPerNode, [&o, worker](const std::string& p) {
    return std::vector<std::vector<std::string>>{
        cat({o.launch, "--nproc-per-node", std::to_string(kPerNode)}, worker(p))};
  });
  rows.emplace_back("ssh to the 3 hosts (true)", 0, [&c](const std::string&) {
    std::vector<std::vector<std::string>> all;
    for (const auto& h : c.hosts) all.push_back({"/usr/bin/ssh", "-F", c.ssh, h, "true"});
    return all;
  });
  if (withTorchrun) {
    rows.emplace_back(
        "torchrun c10d, 3 nodes x 2", kNodes * kPerNode, [&o, &c, worker](const std::string& p) {
          std::vector<std::vector<std::string>> all;
          for (int k = 0; k < kNodes; ++k) {
            all.push_back(cat(
                {o.clusterScript, "exec", c.name, std::to_string(k), o.python, o.torchrunPath,
                 "--nnodes", std::to_string(kNodes), "--nproc_per_node", std::to_string(kPerNode),
                 "--rdzv_backend", "c10d", "--rdzv_endpoint", c.hosts[0] + ":29400", "--rdzv_id", p,
                 // In a namespace the host name does not resolve to the namespace's
                 // address, so torchrun's guess of who hosts its store fails: say it.
                 "--rdzv_conf", k == 0 ? "is_host=1,join_timeout=60" : "is_host=0,join_timeout=60",
                 "--no_python"},
                worker(p)));
          }
          return all;
        });
  }
  return rows;
}

void printTable(const MultinodeBenchOptions& o, const std::vector<Row>& rows,
                const std::string& loadBefore, bool withTorchrun) {
  fmt::print("# launch_bench --multinode: {} nodes x {} workers (testing/worker --steps 0), ms, "
             "median (min) of {} interleaved reps; load average {} before, {} after\n",
             kNodes, kPerNode, o.reps, loadBefore, loadAverage());
  fmt::print("# start->barrier: until every worker passed a barrier on one store; barrier->exit: "
             "from there until the launchers exited\n");
  fmt::print("{:<30} {:>16} {:>16} {:>16} {:>11}\n", "job", "start->barrier", "barrier->exit",
             "start->exit", "/ fan-out");
  const Row& fan = rows[0];
  for (const auto& r : rows) {
    fmt::print("{:<30} {:>16} {:>16} {:>16} {:>11}\n", r.label, cell(r.toBarrier), cell(r.after),
               cell(r.total), ratio(r.total, fan.total));
  }
  const Row& one = rows[1];
  const Row& sshAlone = rows[3];
  if (!fan.total.empty() && !one.total.empty()) {
    fmt::print("# fan-out adds {:+.0f} ms to the same 6 workers on one node ({:+.0f} ms to the "
               "barrier, {:+.0f} ms after it; aim: <= 500)\n",
               median(fan.total) - median(one.total), median(fan.toBarrier) - median(one.toBarrier),
               median(fan.after) - median(one.after));
  }
  if (!fan.total.empty() && !one.total.empty() && !sshAlone.total.empty()) {
    fmt::print("# the 3 ssh connections alone take {:.0f} ms: fan-out - one node - ssh alone = "
               "{:+.0f} ms is launch's own part\n",
               median(sshAlone.total),
               median(fan.total) - median(one.total) - median(sshAlone.total));
  }
  if (withTorchrun && !rows[4].total.empty() && !fan.total.empty()) {
    fmt::print("# torchrun c10d / launch fan-out: {} to the barrier, {} after it, {} whole job "
               "(aim: >= 5x)\n",
               ratio(rows[4].toBarrier, fan.toBarrier), ratio(rows[4].after, fan.after),
               ratio(rows[4].total, fan.total));
  }
  std::fflush(stdout);
}

// A node's cable cut under a running job, a few times; prints and returns the detection times.
std::vector<double> measureDetection(const MultinodeBenchOptions& o, const SimCluster& c) {
  std::vector<double> detections;
  for (int rep = 0; rep < std::min(o.reps, 3); ++rep) {
    double d = detectionSeconds({o.launch,
                                 "--hosts",
                                 c.hostList,
                                 "--ssh-config",
                                 c.ssh,
                                 "--rdzv-endpoint",
                                 c.endpoint,
                                 "--ssh-option",
                                 "ServerAliveInterval=60",
                                 "--nproc-per-node",
                                 std::to_string(kPerNode),
                                 "--heartbeat-interval",
                                 "0.5",
                                 "--heartbeat-timeout",
                                 "3",
                                 "--grace-period",
                                 "1",
                                 o.worker,
                                 "--steps",
                                 "100000",
                                 "--step-ms",
                                 "50",
                                 "--no-store"},
                                o.clusterScript, c.name, 1);
    if (d >= 0) detections.push_back(d);
  }
  if (!detections.empty()) {
    fmt::print("# a silent node (cable out) noticed after {:.2f} s median of {} (min {:.2f}, max "
               "{:.2f}); --heartbeat-timeout 3 (aim: <= timeout + 1 s)\n",
               median(detections), detections.size(), spread(detections).min,
               spread(detections).max);
  }
  return detections;
}

}  // namespace

int multinodeBench(const MultinodeBenchOptions& o) {
  if (::geteuid() != 0) {
    std::fprintf(stderr, "launch_bench --multinode: needs root (network namespaces, sshd)\n");
    return 2;
  }
  const std::string loadBefore = loadAverage();
  const std::optional<SimCluster> cluster = clusterUp(o);
  if (!cluster) return 1;

  // The barrier's store, hosted here for every job alike.
  store::TcpStoreServerOptions so;
  so.host = cluster->bridge;
  so.token = randomToken();
  std::unique_ptr<store::TcpStoreServer> server = store::TcpStoreServer::start(so);
  store::TcpStoreOptions co;
  co.host = cluster->bridge;
  co.port = server->port();
  co.token = so.token;
  store::TcpStore client(co);
  const std::string storeWhere = fmt::format("{}:{}", cluster->bridge, server->port());
  const WorkerArgv worker = [&o, storeWhere, token = so.token](const std::string& prefix) {
    return std::vector<std::string>{o.worker,   "--steps",       "0",   "--quiet",        "--store",
                                    storeWhere, "--store-token", token, "--store-prefix", prefix};
  };

  const bool withTorchrun = o.torchrun && executable(o.torchrunPath) && executable(o.python);
  std::vector<Row> rows = jobRows(o, *cluster, worker, withTorchrun);
  for (size_t i = 0; i < rows.size(); ++i)
    runOnce(rows[i], fmt::format("warm{}", i), client, false);
  for (int rep = 0; rep < o.reps; ++rep) {
    for (size_t i = 0; i < rows.size(); ++i) {
      runOnce(rows[i], fmt::format("rep{}-{}", rep, i), client, true);
    }
  }
  printTable(o, rows, loadBefore, withTorchrun);
  const std::vector<double> detections = measureDetection(o, *cluster);
  server->stop();
  shellOut(o.clusterScript + " down " + cluster->name);
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

}  // namespace dtrain::bench
