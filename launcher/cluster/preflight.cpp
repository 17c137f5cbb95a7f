#include "launcher/cluster/preflight.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "dtrain/base/error.h"
#include "launcher/cluster/agent/agent.h"
#include "launcher/cluster/master/fan_out.h"
#include "launcher/cluster/protocol/plan_codec.h"
#include "launcher/cluster/remote/remote_command.h"
#include "launcher/cluster/remote/session.h"
#include "launcher/exit_codes.h"
#include "launcher/node/nccl_env.h"
#include "launcher/node/node_probe.h"
#include "launcher/node/program.h"
#include "launcher/seconds.h"
#include "launcher/supervisor/output.h"
#include "net/net_interface.h"
#include "net/socket.h"

namespace dtrain::launcher {

const char* launcherVersion();

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kProbeTimeout = std::chrono::milliseconds(3000);
constexpr auto kHoldMasterPort = std::chrono::milliseconds(30000);  // at most

sockaddr_in endpoint(const std::string& addr, int port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, addr.c_str(), &sa.sin_addr);
  return sa;
}

// "ok", "refused" (nothing listens), "dropped" (no answer: a firewall?), or the errno's text.
// Retries a refusal until `within` passes (the other side may still be starting its listener).
std::string probe(const std::string& addr, int port, std::chrono::milliseconds within) {
  const auto deadline = Clock::now() + within;
  while (true) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_in sa = endpoint(addr, port);
    int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      int ready = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 1)));
      socklen_t len = sizeof err;
      if (ready <= 0) {
        err = ETIMEDOUT;
      } else {
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      }
    }
    ::close(fd);
    if (err == 0) return "ok";
    if (err == ETIMEDOUT) return "dropped";
    if (err != ECONNREFUSED) return std::strerror(err);
    if (Clock::now() >= deadline) return "refused";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// A listener on addr:port; -1 and *why when the port is taken.
int listenOn(const std::string& addr, int port, std::string* why) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa = endpoint(addr, port);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(fd, 64) != 0) {
    *why = std::strerror(errno);
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string run(const std::string& command) {
  std::string out;
  if (FILE* p = ::popen(command.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    ::pclose(p);
  }
  return out;
}

// The file name behind the first ldd line that mentions `lib` ("libnccl.so.2.28.3"), or "-".
std::string libraryVersion(const std::string& ldd, const std::string& lib) {
  size_t at = ldd.find(lib);
  if (at == std::string::npos) return "-";
  size_t arrow = ldd.find("=> ", at);
  size_t nl = ldd.find('\n', at);
  if (arrow == std::string::npos || arrow > nl) return "-";
  std::string path = ldd.substr(arrow + 3, ldd.find(' ', arrow + 3) - arrow - 3);
  std::error_code ec;
  std::string real = std::filesystem::canonical(path, ec).filename().string();
  return ec ? path : real;
}

void fact(const std::string& key, const std::string& value) {
  std::string v = value;
  for (auto& c : v) {
    if (c == '\n') c = ' ';
  }
  std::printf("dtrain-check %s %s\n", key.c_str(), v.c_str());
}

// "ok", or "missing libA.so,libB.so": the libraries ldd could not find.
std::string missingLibraries(const std::string& ldd) {
  std::string missing;
  size_t start = 0;
  while (start < ldd.size()) {
    size_t nl = ldd.find('\n', start);
    std::string line = ldd.substr(start, nl == std::string::npos ? nl : nl - start);
    if (line.find("not found") != std::string::npos) {
      size_t b = line.find_first_not_of(" \t");
      missing += (missing.empty() ? "" : ",") + line.substr(b, line.find(' ', b) - b);
    }
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  return missing.empty() ? "ok" : "missing " + missing;
}

// The program here, every library it links, and the versions of libtorch, CUDA and NCCL.
void programFacts(const LaunchConfig& config, const EnvMap& effective) {
  try {
    WorkerCommand cmd = lookUpProgram(config, effective, net::hostName());
    fact("program", cmd.file);
    const std::string ldd = run("ldd " + remote::singleQuote(cmd.file) + " 2>&1");
    fact("libraries", missingLibraries(ldd));
    fact("torch", libraryVersion(ldd, "libtorch_cpu.so"));
    fact("cuda", libraryVersion(ldd, "libcudart.so"));
    fact("nccl", libraryVersion(ldd, "libnccl.so"));
  } catch (const Error& e) {
    fact("program", std::string("error: ") + e.what());
  }
}

void interfaceFact(const AgentSetup& setup) {
  try {
    InterfaceChoice c = resolveSocketInterface(setup.config.nccl, true, setup.storeAddr,
                                               "--nccl-socket-ifname");
    fact("interface", c.name.empty() ? "(NCCL's choice)" : c.name + " " + c.address);
  } catch (const Error& e) {
    fact("interface", std::string("error: ") + e.what());
  }
}

// The GPUs here (nvidia-smi's list, unless CUDA_VISIBLE_DEVICES narrows it) against the workers.
void gpuFacts(const AgentSetup& setup, const EnvMap& effective) {
  const LaunchConfig& config = setup.config;
  int workers = setup.slots > 0       ? setup.slots
                : !setup.gpus.empty() ? static_cast<int>(setup.gpus.size())
                : config.nprocPerNode.kind == NprocSpec::Kind::Count ? config.nprocPerNode.count
                                                                     : 0;
  int gpus = visibleGpus(effective);
  if (::access("/usr/bin/nvidia-smi", X_OK) == 0) {
    std::string list = run("nvidia-smi -L 2>/dev/null");
    int n = 0;
    for (size_t at = list.find("GPU "); at != std::string::npos; at = list.find("GPU ", at + 4))
      ++n;
    if (n > 0 && effective.find("CUDA_VISIBLE_DEVICES") == effective.end()) gpus = n;
  }
  fact("gpus", std::to_string(gpus));
  fact("workers", std::to_string(workers));
  fact("gpu_job",
       config.nprocPerNode.kind == NprocSpec::Kind::Gpu || !setup.gpus.empty() ? "1" : "0");
}

// Node 0 lets the others' probes of MASTER_PORT in until they are done: the master then closes
// its stdin (kHoldMasterPort at most from `started`).
void holdMasterPort(int masterFd, Clock::time_point started) {
  std::fflush(stdout);
  while (Clock::now() - started < kHoldMasterPort) {
    pollfd p[2] = {{masterFd, POLLIN, 0}, {STDIN_FILENO, POLLIN, 0}};
    if (::poll(p, 2, 100) <= 0) continue;
    if (p[0].revents) {
      int c = ::accept4(masterFd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) ::close(c);
    }
    if (p[1].revents) {
      char buf[256];
      if (::read(STDIN_FILENO, buf, sizeof buf) <= 0) break;
    }
  }
  ::close(masterFd);
}

}  // namespace

int runNodeCheck(const AgentSetup& setup, const std::string& masterAddr, int masterPort,
                 const EnvMap& environment) {
  const EnvMap effective = composeEnvironment(environment, setup.forwarded);
  fact("host", net::hostName());
  fact("launch", launcherVersion());

  // Node 0 holds MASTER_PORT open while the others probe it.
  int masterFd = -1;
  if (setup.requestedRank == 0) {
    std::string why;
    masterFd = listenOn(masterAddr, masterPort, &why);
    fact("master_port", masterFd >= 0 ? "free" : "in use (" + why + ")");
  }
  const auto started = Clock::now();
  programFacts(setup.config, effective);
  interfaceFact(setup);
  gpuFacts(setup, effective);
  fact("store_port", probe(setup.storeAddr, setup.storePort, kProbeTimeout));
  if (setup.requestedRank != 0) {
    fact("master_port", probe(masterAddr, masterPort, kProbeTimeout));
  } else if (masterFd >= 0) {
    holdMasterPort(masterFd, started);
  }
  std::fflush(stdout);
  return 0;
}

NodeFacts parseNodeFacts(const std::vector<std::string>& lines) {
  NodeFacts f;
  const std::string tag = "dtrain-check ";
  for (const auto& l : lines) {
    size_t at = l.find(tag);
    if (at == std::string::npos) continue;
    std::string rest = l.substr(at + tag.size());
    size_t sp = rest.find(' ');
    f[rest.substr(0, sp)] = sp == std::string::npos ? "" : rest.substr(sp + 1);
  }
  return f;
}

std::vector<std::string> preflightProblems(const std::vector<std::string>& labels,
                                           const std::vector<NodeFacts>& nodes,
                                           const std::vector<std::string>& ssh,
                                           const std::string& masterVersion,
                                           const std::string& storeWhere, int masterPort) {
  std::vector<std::string> out;
  auto get = [](const NodeFacts& f, const char* k) {
    auto it = f.find(k);
    return it == f.end() ? std::string() : it->second;
  };
  std::map<std::string, std::string> firstVersion;  // torch/cuda/nccl of the first node
  for (size_t i = 0; i < nodes.size(); ++i) {
    const std::string who = fmt::format("node {} ({})", i, labels[i]);
    const NodeFacts& f = nodes[i];
    if (!ssh[i].empty()) {
      out.push_back(who + ": " + ssh[i]);
      continue;
    }
    if (get(f, "launch") != masterVersion) {
      out.push_back(fmt::format("{}: runs launch {} and the master {}; HINT: install the same "
                                "launch on every node (or --remote-launch PATH)",
                                who, get(f, "launch"), masterVersion));
    }
    if (get(f, "program").rfind("error: ", 0) == 0) {
      out.push_back(fmt::format("{}: {}; HINT: copy the program to the same path on every node, "
                                "or run it from a shared directory",
                                who, get(f, "program").substr(7)));
    }
    if (get(f, "libraries").rfind("missing", 0) == 0) {
      out.push_back(fmt::format("{}: the program's libraries are {} (ldd); HINT: install them, or "
                                "export LD_LIBRARY_PATH on the master (it is forwarded)",
                                who, get(f, "libraries")));
    }
    const std::string store = get(f, "store_port");
    if (store != "ok") {
      out.push_back(fmt::format(
          "{}: the store port {} is {} from it{}", who, storeWhere,
          store == "dropped"   ? "dropped (no answer: a firewall?)"
          : store == "refused" ? "refused"
                               : "unreachable: " + store,
          store == "dropped" ? fmt::format("; HINT: open TCP port {} from the nodes to the master",
                                           storeWhere.substr(storeWhere.rfind(':') + 1))
                             : "; HINT: check the address (--rdzv-endpoint) and the route"));
    }
    const std::string master = get(f, "master_port");
    if (i == 0 && master != "free") {
      out.push_back(fmt::format("{}: MASTER_PORT {} is {} there; HINT: pick a free one with "
                                "--master-port",
                                who, masterPort, master));
    } else if (i > 0 && master != "ok") {
      out.push_back(fmt::format(
          "{}: MASTER_PORT {} on node 0 is {} from it; HINT: open TCP port {} "
          "between the nodes",
          who, masterPort, master == "dropped" ? "dropped (no answer: a firewall?)" : master,
          masterPort));
    }
    if (get(f, "interface").rfind("error: ", 0) == 0) {
      out.push_back(who + ": " + get(f, "interface").substr(7));
    }
    const int gpus = std::atoi(get(f, "gpus").c_str());
    const int workers = std::atoi(get(f, "workers").c_str());
    if (get(f, "gpu_job") == "1" && gpus == 0) {
      out.push_back(who + ": no GPU is visible there (nvidia-smi / the driver); HINT: check the "
                          "driver, or run a CPU job");
    } else if (gpus > 0 && workers > gpus) {
      out.push_back(fmt::format("{}: {} workers but {} GPUs; HINT: --nproc-per-node {} (or gpu)",
                                who, workers, gpus, gpus));
    }
    for (const char* lib : {"torch", "cuda", "nccl"}) {
      auto [it, first] = firstVersion.emplace(lib, get(f, lib));
      if (!first && it->second != get(f, lib)) {
        out.push_back(fmt::format("{}: {} library {} differs from node 0's {}; HINT: the same "
                                  "libraries on every node",
                                  who, lib, get(f, lib), it->second));
      }
    }
  }
  return out;
}

std::string formatPreflightTable(const std::vector<std::string>& labels,
                                 const std::vector<NodeFacts>& nodes,
                                 const std::vector<std::string>& ssh) {
  std::string out = fmt::format(
      "{:<5} {:<16} {:<5} {:<8} {:<8} {:<10} {:<8} {:<8} {:<24} {:<5} {}\n", "node", "host", "ssh",
      "launch", "program", "libraries", "store", "master", "interface", "GPUs",
      "torch / CUDA / NCCL");
  for (size_t i = 0; i < nodes.size(); ++i) {
    const NodeFacts& f = nodes[i];
    auto get = [&](const char* k) {
      auto it = f.find(k);
      return it == f.end() ? std::string("?") : it->second;
    };
    if (!ssh[i].empty()) {
      out += fmt::format("{:<5} {:<16} {}\n", i, labels[i], "FAILED (see below)");
      continue;
    }
    std::string program = get("program").rfind("error", 0) == 0 ? "MISSING" : "ok";
    std::string libs = get("libraries") == "ok" ? "ok" : "MISSING";
    std::string iface = get("interface").rfind("error", 0) == 0 ? "ERROR" : get("interface");
    out += fmt::format(
        "{:<5} {:<16} {:<5} {:<8} {:<8} {:<10} {:<8} {:<8} {:<24} {:<5} {} / {} / {}\n", i,
        labels[i], "ok", get("launch"), program, libs, get("store_port"), get("master_port"), iface,
        get("gpus"), get("torch"), get("cuda"), get("nccl"));
  }
  return out;
}

namespace {

using Sessions = std::vector<std::unique_ptr<remote::Session>>;

// Starts every node's check: `launch --agent` with the node's plan in "check" mode. A node whose
// session could not start is null, with why in `ssh`.
Sessions startChecks(const LaunchConfig& config, const MultiNodePlan& plan,
                     const EnvMap& environment, std::vector<std::string>* ssh) {
  std::vector<std::string> childEnv;
  for (const auto& [k, v] : environment) {
    if (k.rfind("DTRAIN_LAUNCH_", 0) != 0) childEnv.push_back(k + "=" + v);
  }
  Sessions sessions;
  for (size_t i = 0; i < plan.hosts.size(); ++i) {
    remote::Records records = agentPlanRecords(agentSetupFor(config, plan, static_cast<int>(i)));
    records.emplace_back("mode", "check");
    records.emplace_back("master", fmt::format("{}:{}", plan.hosts[0].address, plan.masterPort));
    try {
      sessions.push_back(std::make_unique<remote::Session>(
          std::to_string(i), plan.hosts[i].entry.host,
          agentCommand(config, plan, static_cast<int>(i)), childEnv, remote::encodePlan(records),
          /*captureStdout=*/true));
    } catch (const Error& e) {
      sessions.push_back(nullptr);
      (*ssh)[i] = e.what();
    }
  }
  return sessions;
}

// Accepts the nodes' probes of the store port (on `storeFd`, when it is ours) until every check
// is done; node 0 holds MASTER_PORT open for the others' probes until they are. Past `deadline`
// what still runs is killed.
void awaitChecks(Sessions& sessions, int storeFd, Clock::time_point deadline) {
  while (true) {
    bool running = false;
    bool othersRunning = false;
    for (size_t i = 0; i < sessions.size(); ++i) {
      auto& s = sessions[i];
      if (s && !s->reap()) {
        running = true;
        othersRunning = othersRunning || i > 0;
        s->drain();
      }
    }
    if (!running) break;
    if (!othersRunning && sessions[0]) sessions[0]->closeStdin();
    if (Clock::now() >= deadline) {
      for (auto& s : sessions) {
        if (s && !s->exited()) ::kill(-s->pid(), SIGKILL);
      }
    }
    if (storeFd >= 0) {
      pollfd p{storeFd, POLLIN, 0};
      if (::poll(&p, 1, 20) > 0) {
        int c = ::accept4(storeFd, nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0) ::close(c);
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

// Each node's facts from its check's stdout; a node that told nothing gets why in `ssh`.
std::vector<NodeFacts> collectFacts(const LaunchConfig& config, const MultiNodePlan& plan,
                                    const Sessions& sessions, std::vector<std::string>* ssh) {
  std::vector<NodeFacts> facts;
  for (size_t i = 0; i < sessions.size(); ++i) {
    if (!sessions[i]) {
      facts.emplace_back();
      continue;
    }
    std::vector<std::string> lines(sessions[i]->stdoutLines().begin(),
                                   sessions[i]->stdoutLines().end());
    facts.push_back(parseNodeFacts(lines));
    if (!facts.back().empty() && facts.back().find("store_port") != facts.back().end()) continue;
    std::string last;
    for (const auto& l : sessions[i]->stderrTail()) last += (last.empty() ? "" : " | ") + l;
    std::string& why = (*ssh)[i];
    why = fmt::format("{} {}{}", plan.hosts[i].local ? "its check" : "ssh",
                      sessions[i]->describeExit(), last.empty() ? "" : ": " + last);
    if (!plan.hosts[i].local) {
      std::string hint = remote::sshFailureHint(plan.hosts[i].entry.host, last, config.ssh);
      if (WIFEXITED(sessions[i]->waitStatus()) && WEXITSTATUS(sessions[i]->waitStatus()) == 127) {
        hint = fmt::format("HINT: launch is not at {} there; install it, or give "
                           "--remote-launch PATH",
                           plan.launchPath);
      }
      if (!hint.empty()) why += "; " + hint;
    }
  }
  return facts;
}

}  // namespace

int runPreflight(const LaunchConfig& config, const MultiNodePlan& plan, const EnvMap& environment) {
  const std::string storeWhere = fmt::format("{}:{}", plan.storeAddr, plan.storePort);
  std::vector<std::string> labels;
  for (const auto& h : plan.hosts) labels.push_back(h.entry.host);
  std::string why;
  int storeFd = listenOn(plan.storeAddr, plan.storePort, &why);
  std::vector<std::string> problems;
  if (storeFd < 0) {
    problems.push_back(fmt::format("the master: the store port {} is {} here; HINT: another job? "
                                   "pick a port with --rdzv-endpoint HOST:PORT",
                                   storeWhere, why));
  }
  std::vector<std::string> ssh(plan.hosts.size());
  Sessions sessions = startChecks(config, plan, environment, &ssh);
  awaitChecks(sessions, storeFd, Clock::now() + millis(config.ssh.connectTimeout + 15));
  if (storeFd >= 0) ::close(storeFd);
  const std::vector<NodeFacts> facts = collectFacts(config, plan, sessions, &ssh);

  std::string text = fmt::format("launch --check: {} node{}, store {} (on this host), MASTER_PORT "
                                 "{} on node 0\n",
                                 plan.hosts.size(), plan.hosts.size() == 1 ? "" : "s", storeWhere,
                                 plan.masterPort);
  text += formatPreflightTable(labels, facts, ssh);
  for (auto& p :
       preflightProblems(labels, facts, ssh, launcherVersion(), storeWhere, plan.masterPort)) {
    problems.push_back(p);
  }
  if (problems.empty()) {
    text += "launch --check: all is well\n";
  } else {
    text += fmt::format("launch --check: {} problem{} (exit 125):\n", problems.size(),
                        problems.size() == 1 ? "" : "s");
    for (const auto& p : problems) text += "  " + p + "\n";
  }
  writeAll(STDOUT_FILENO, text.data(), text.size());
  return problems.empty() ? 0 : kExitInfrastructure;
}

}  // namespace dtrain::launcher
