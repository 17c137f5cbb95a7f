#include "launcher/job/job.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "dtrain/base/tcp_store.h"
#include "env_contract.h"
#include "launcher/job/program.h"
#include "launcher/monitor/monitor.h"
#include "launcher/supervisor/supervisor.h"

namespace dtrain::launcher {

namespace {

std::string randomHex(size_t bytes) {
  std::vector<unsigned char> buf(bytes);
  size_t got = 0;
  while (got < bytes) {
    ssize_t n = ::getrandom(buf.data() + got, bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    DTRAIN_CHECK(n > 0, "launch: getrandom failed: {}", std::strerror(errno));
    got += static_cast<size_t>(n);
  }
  std::string hex;
  for (unsigned char b : buf) hex += fmt::format("{:02x}", b);
  return hex;
}

}  // namespace

std::string hostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

int usableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

int visibleGpus(const EnvMap& environment) {
  auto it = environment.find(env::kCudaVisibleDevices);
  if (it != environment.end()) {
    int count = 0;
    size_t start = 0;
    const std::string& v = it->second;
    while (start <= v.size()) {
      size_t comma = v.find(',', start);
      std::string item = v.substr(start, comma == std::string::npos ? comma : comma - start);
      if (item.empty() || item[0] == '-') break;  // CUDA stops at the first invalid entry
      ++count;
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return count;
  }
  int count = 0;
  if (DIR* d = ::opendir("/proc/driver/nvidia/gpus")) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') ++count;
    }
    ::closedir(d);
  }
  return count;
}

std::string resolveAddress(const std::string& host, const std::string& label) {
  in_addr a4{};
  in6_addr a6{};
  if (::inet_pton(AF_INET, host.c_str(), &a4) == 1 || ::inet_pton(AF_INET6, host.c_str(), &a6) == 1) {
    return host;
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  DTRAIN_CHECK_ARG(rc == 0 && res, "{} {}: cannot resolve the host name: {}; HINT: give an IP "
                   "address", label, quoteValue(host), ::gai_strerror(rc));
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, text, sizeof text);
  ::freeaddrinfo(res);
  return text;
}

int freePort(const std::string& address) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  DTRAIN_CHECK(fd >= 0, "launch: socket failed: {}", std::strerror(errno));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = 0;
  if (::inet_pton(AF_INET, address.c_str(), &sa.sin_addr) != 1) sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 &&
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0;
  int err = errno;
  ::close(fd);
  DTRAIN_CHECK(ok, "launch: cannot find a free port on {}: {}", address, std::strerror(err));
  return ntohs(sa.sin_port);
}

std::string makeTempJobDir(const EnvMap& environment, const std::string& runId) {
  auto it = environment.find("TMPDIR");
  std::string base = it != environment.end() && !it->second.empty() ? it->second : "/tmp";
  std::string templ = base + "/dtrain-" + runId + "-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  DTRAIN_CHECK(::mkdtemp(buf.data()) != nullptr, "launch: cannot create a directory under {}: {}; "
               "HINT: set TMPDIR to a writable directory, or give --log-dir", base,
               std::strerror(errno));
  return buf.data();
}

std::string jobDirFor(const std::string& logDir, const EnvMap& environment,
                      const std::string& runId) {
  if (logDir.empty()) return makeTempJobDir(environment, runId);
  // Absolute: a worker that changes its directory still finds its error file.
  std::error_code ec;
  std::filesystem::path dir = std::filesystem::absolute(logDir, ec);
  return (ec ? logDir : dir.lexically_normal().string()) + "/" + runId;
}

std::string newJobToken() { return randomHex(32); }
std::string newRunId() { return randomHex(6); }

void checkWritableDir(const std::string& dir, const std::string& label) {
  std::string path = dir;
  while (true) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
      DTRAIN_CHECK_ARG(S_ISDIR(st.st_mode), "{} {}: {} is not a directory; HINT: give a "
                       "directory path", label, excerpt(dir), excerpt(path));
      // Try it: access() says yes to root on read-only or virtual file systems.
      std::string probe = path + "/.dtrain-write-check-XXXXXX";
      std::vector<char> buf(probe.begin(), probe.end());
      buf.push_back('\0');
      DTRAIN_CHECK_ARG(::mkdtemp(buf.data()) != nullptr, "{} {}: cannot create anything in {} "
                       "({}); HINT: pick a directory you can write to", label, excerpt(dir), excerpt(path),
                       std::strerror(errno));
      ::rmdir(buf.data());
      return;
    }
    DTRAIN_CHECK_ARG(errno == ENOENT, "{} {}: cannot use {}: {}", label, excerpt(dir), excerpt(path),
                     std::strerror(errno));
    // Not there yet: it will be created if its nearest existing ancestor is writable.
    size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) {
      path = ".";
    } else if (slash == 0) {
      path = "/";
    } else {
      path.resize(slash);
    }
  }
}

std::string formatDryRun(const LaunchConfig& config, const NodeContext& node,
                         const std::vector<std::string>& argv) {
  std::string out = fmt::format(
      "launch --dry-run: nothing was started. {} worker{} on host {} (run id {}).\n",
      node.localWorldSize, node.localWorldSize == 1 ? "" : "s", node.host, node.runId);
  out += fmt::format("Supervision: --max-restarts {} --grace-period {:g} --exit-barrier-timeout "
                     "{:g}{} --kill-timeout {:g}\n",
                     config.maxRestarts, config.gracePeriod, config.exitBarrierTimeout,
                     config.exitBarrierTimeout > 0 ? "" : " (no limit)", config.killTimeout);
  out += "Each worker inherits launch's environment (without DTRAIN_LAUNCH_*), plus:\n";
  for (int i = 0; i < node.localWorldSize; ++i) {
    out += fmt::format("rank {} (local rank {}):\n  command: {}\n  environment:\n",
                       node.rankOffset + i, i, shellQuote(argv));
    for (const auto& [key, value] : redacted(workerEnvChanges(config, node, i, 0))) {
      out += "    " + key + "=" + value + "\n";
    }
  }
  return out;
}

int runJob(const LaunchConfig& configIn, const EnvMap& environment) {
  LaunchConfig config = configIn;
  const std::string host = hostName();
  auto pathIt = environment.find("PATH");
  WorkerCommand command = resolveWorkerCommand(
      workerCommandLine(config), pathIt != environment.end() ? pathIt->second : "/usr/bin:/bin",
      host);
  if (!config.logDir.empty()) checkWritableDir(config.logDir, optionLabel(config, "log-dir"));

  NodeContext node;
  node.host = host;
  node.nodeRank = 0;
  node.numNodes = 1;
  node.cpuCount = usableCpus();
  node.localWorldSize = resolveNproc(config.nprocPerNode, node.cpuCount, visibleGpus(environment));
  node.rankOffset = 0;
  node.worldSize = node.localWorldSize;
  for (int r : config.localRanksFilter) {
    DTRAIN_CHECK_ARG(r < node.localWorldSize, "{}: local rank {} does not exist with {} workers "
                     "per node; HINT: use 0..{}", optionLabel(config, "local-ranks-filter"), r,
                     node.localWorldSize, node.localWorldSize - 1);
  }
  node.runId = config.runId.empty() ? newRunId() : config.runId;
  node.inherited = environment;
  node.masterAddr = config.masterAddr.empty()
                        ? "127.0.0.1"
                        : resolveAddress(config.masterAddr, optionLabel(config, "master-addr"));
  node.storeAddr = config.rdzvHost.empty()
                       ? "127.0.0.1"
                       : resolveAddress(config.rdzvHost, optionLabel(config, "rdzv-endpoint"));

  if (config.dryRun) {
    node.masterPort = config.masterPort;
    node.storePort = config.rdzvPort;
    node.storeToken = "(a fresh random token)";
    node.jobDir = config.logDir.empty() ? "$TMPDIR/dtrain-" + node.runId + "-XXXXXX"
                                        : config.logDir + "/" + node.runId;
    std::string text = formatDryRun(config, node, command.argv);
    if (config.masterPort == 0 || config.rdzvPort == 0) {
      text += "(port 0 above: a free port is picked at launch)\n";
    }
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }

  // From here on things start: signals go to the supervisor's signalfd, in every thread.
  blockLauncherSignals();

  node.storeToken = newJobToken();
  store::TcpStoreServerOptions storeOptions;
  storeOptions.host = node.storeAddr;
  storeOptions.port = static_cast<uint16_t>(config.rdzvPort);
  storeOptions.token = node.storeToken;
  std::unique_ptr<store::TcpStoreServer> server = store::TcpStoreServer::start(storeOptions);
  node.storePort = server->port();
  node.masterPort = config.masterPort != 0 ? config.masterPort : freePort(node.masterAddr);

  monitor::MonitorContext watch;
  watch.runId = node.runId;
  watch.node = host;
  watch.nodeRank = node.nodeRank;
  watch.localWorldSize = node.localWorldSize;
  watch.worldSize = node.numNodes * node.localWorldSize;
  watch.maxRestarts = config.maxRestarts;
  watch.storeHost = node.storeAddr;
  watch.storePort = node.storePort;
  watch.storeToken = node.storeToken;
  watch.label = [&config](const std::string& option) { return optionLabel(config, option); };
  // Binds --metrics-port and opens --metrics-file now: a usage error leaves nothing behind.
  monitor::Monitor watcher(config.monitor, watch);

  JobPlan plan;
  bool tempDir = config.logDir.empty();
  node.jobDir = jobDirFor(config.logDir, environment, node.runId);
  const bool tempLogs = tempDir && (config.redirects.any() || config.tee.any());
  if (tempLogs) {
    std::string line = fmt::format("launch: worker logs (--redirects/--tee) are in {}\n", node.jobDir);
    std::fwrite(line.data(), 1, line.size(), stderr);
  }
  plan.config = config;
  plan.command = command;
  plan.node = node;
  plan.logAllStreams = !tempDir;
  plan.temporaryJobDir = tempDir && !tempLogs;  // logs the user asked for are kept
  plan.logHint = "not kept (HINT: pass --log-dir DIR to keep every worker's output)";
  DTRAIN_LOG(Info, "launch: run {}: {} worker(s) of {} on {}; store {}:{}; MASTER_PORT {}; job "
             "dir {}", node.runId, node.localWorldSize, shellQuote(command.argv), host,
             node.storeAddr, node.storePort, node.masterPort, node.jobDir);
  plan.observer = &watcher;

  int code = 0;
  {
    Supervisor supervisor(std::move(plan));
    watcher.start(&supervisor);
    code = supervisor.run();
    watcher.stop();
  }
  server->stop();
  if (tempDir && !tempLogs) {
    std::error_code ec;
    std::filesystem::remove_all(node.jobDir, ec);
  }
  return code;
}

}  // namespace dtrain::launcher
