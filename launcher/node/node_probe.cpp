#include "launcher/node/node_probe.h"

#include <dirent.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "dtrain/base/error.h"
#include "env_contract.h"
#include "net/net_interface.h"

namespace dtrain::launcher {

NodeProbe probeNode(const LaunchConfig& config, const EnvMap& environment,
                    const ProbeRequest& request) {
  NodeProbe probe;
  probe.cpuCount = usableCpus();
  probe.command = lookUpProgram(config, environment, request.label);
  if (!config.logDir.empty()) checkWritableDir(config.logDir, optionLabel(config, "log-dir"));
  probe.localWorldSize = request.slots > 0       ? request.slots
                         : !request.gpus.empty() ? static_cast<int>(request.gpus.size())
                                                 : resolveNproc(config.nprocPerNode, probe.cpuCount,
                                                                visibleGpus(environment));
  if (!request.storeAddr.empty()) {
    probe.iface = resolveSocketInterface(config.nccl, true, request.storeAddr,
                                         optionLabel(config, "nccl-socket-ifname"));
    probe.address = net::chooseBindAddress("", "the store's address", request.storeAddr).address;
  }
  return probe;
}

WorkerCommand lookUpProgram(const LaunchConfig& config, const EnvMap& environment,
                            const std::string& host) {
  auto path = environment.find("PATH");
  return resolveWorkerCommand(workerCommandLine(config),
                              path != environment.end() ? path->second : "/usr/bin:/bin", host);
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

void checkWritableDir(const std::string& dir, const std::string& label) {
  std::string path = dir;
  while (true) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
      DTRAIN_CHECK_ARG(S_ISDIR(st.st_mode),
                       "{} {}: {} is not a directory; HINT: give a "
                       "directory path",
                       label, excerpt(dir), excerpt(path));
      // Try it: access() says yes to root on read-only or virtual file systems.
      std::string probe = path + "/.dtrain-write-check-XXXXXX";
      std::vector<char> buf(probe.begin(), probe.end());
      buf.push_back('\0');
      DTRAIN_CHECK_ARG(::mkdtemp(buf.data()) != nullptr,
                       "{} {}: cannot create anything in {} "
                       "({}); HINT: pick a directory you can write to",
                       label, excerpt(dir), excerpt(path), std::strerror(errno));
      ::rmdir(buf.data());
      return;
    }
    DTRAIN_CHECK_ARG(errno == ENOENT, "{} {}: cannot use {}: {}", label, excerpt(dir),
                     excerpt(path), std::strerror(errno));
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

}  // namespace dtrain::launcher
