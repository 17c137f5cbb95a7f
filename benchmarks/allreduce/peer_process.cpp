#include "peer_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "free_port.h"

namespace dtrain::bench {

namespace {

std::string replaceAll(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

bool executable(const std::string& path) {
  return !path.empty() && access(path.c_str(), X_OK) == 0;
}

}  // namespace

int freeLoopbackPort() { return testing::freePortOn("127.0.0.1"); }

std::unique_ptr<PeerProcess> PeerProcess::start(const Spec& spec) {
  std::unique_ptr<PeerProcess> peer(new PeerProcess());
  peer->spec_ = spec;
  char tmpl[] = "/tmp/allreduce_bench.XXXXXX";
  if (!mkdtemp(tmpl)) return nullptr;
  peer->dir_ = tmpl;
  const std::string results = peer->dir_ + "/results";
  mkfifo(results.c_str(), 0600);
  // Read-write opens never block on a FIFO, and keep it open while the peer starts.
  peer->results_ = open(results.c_str(), O_RDWR | O_CLOEXEC);
  const int fifos = spec.perRankCommands ? spec.ranks : 1;
  for (int r = 0; r < fifos; ++r) {
    const std::string path = peer->dir_ + (spec.perRankCommands ? "/commands." + std::to_string(r)
                                                                : "/commands");
    mkfifo(path.c_str(), 0600);
    peer->commands_.push_back(open(path.c_str(), O_RDWR | O_CLOEXEC));
  }
  std::vector<std::string> args;
  for (const auto& a : spec.argv) {
    std::string x = replaceAll(a, "{commands}", peer->dir_ + "/commands");
    x = replaceAll(x, "{results}", results);
    args.push_back(replaceAll(x, "{dir}", peer->dir_));
  }
  const std::string log = peer->dir_ + "/peer.log";
  // Everything the child needs is built here: the benchmark's rank has other threads (store
  // client, communicators), and a forked child must not allocate before exec.
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);  // its own process group: stop() ends the peer and its workers together
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 1);
    dup2(fd, 2);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  peer->pid_ = pid;
  return peer;
}

PeerProcess::~PeerProcess() { stop(); }

void PeerProcess::dumpLog() const {
  std::ifstream in(dir_ + "/peer.log");
  std::cerr << "allreduce_bench: the " << spec_.name << " peer's log:\n" << in.rdbuf() << "\n";
}

bool PeerProcess::sendCommand(const std::string& line) {
  for (int fd : commands_) {
    if (write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return false;
  }
  return true;
}

std::optional<PeerProcess::Result> PeerProcess::run(size_t bytes, int warmup, int iters,
                                                    std::chrono::seconds timeout,
                                                    const std::string& mode) {
  if (pid_ < 0) return std::nullopt;
  std::string command = "run " + std::to_string(bytes) + " " + std::to_string(warmup) + " " +
                        std::to_string(iters) + (mode.empty() ? "" : " " + mode) + "\n";
  if (!sendCommand(command)) return std::nullopt;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (pending_.find('\n') == std::string::npos) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      std::cerr << "allreduce_bench: the " << spec_.name << " peer exited\n";
      dumpLog();
      return std::nullopt;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::cerr << "allreduce_bench: the " << spec_.name << " peer did not answer within "
                << timeout.count() << " s\n";
      dumpLog();
      stop();
      return std::nullopt;
    }
    pollfd p{results_, POLLIN, 0};
    if (poll(&p, 1, 200) > 0) {
      char buf[256];
      ssize_t n = read(results_, buf, sizeof(buf));
      if (n > 0) pending_.append(buf, static_cast<size_t>(n));
    }
  }
  size_t eol = pending_.find('\n');
  std::istringstream line(pending_.substr(0, eol));
  pending_.erase(0, eol + 1);
  size_t echoed = 0;
  Result r;
  line >> echoed >> r.medianUs >> r.wrong;
  if (echoed != bytes) return std::nullopt;
  return r;
}

void PeerProcess::stop() {
  if (pid_ > 0) {
    sendCommand("quit\n");
    // Let it leave cleanly (destroy_process_group, MPI_Finalize), then make sure.
    for (int i = 0; i < 100; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (pid_ > 0) {
      kill(-pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  for (int fd : commands_) close(fd);
  commands_.clear();
  if (results_ >= 0) close(results_);
  results_ = -1;
  if (!dir_.empty()) {
    std::string rm = "rm -rf '" + dir_ + "'";
    if (std::system(rm.c_str()) != 0)
      std::cerr << "allreduce_bench: could not remove " << dir_ << "\n";
    dir_.clear();
  }
}

std::unique_ptr<PeerProcess> startTorchPeer(const std::string& python, const std::string& script,
                                            int world, const std::string& dtype) {
  std::string check = python + " -c 'import torch.distributed' >/dev/null 2>&1";
  if (!executable(python) || std::system(check.c_str()) != 0) {
    std::cerr << "allreduce_bench: no PyTorch peer: " << python
              << " cannot import torch.distributed (HINT: scripts/setup.sh makes the project's "
                 ".venv, or --python PATH)\n";
    return nullptr;
  }
  // A one-node static rendezvous on a free loopback port: the workers meet at once, without
  // torchrun's c10d rendezvous round.
  const int port = freeLoopbackPort();
  if (port <= 0) {
    std::cerr << "allreduce_bench: no PyTorch peer: no free loopback port for torchrun\n";
    return nullptr;
  }
  return PeerProcess::start(
      {"torch",
       {python, "-m", "torch.distributed.run", "--nnodes", "1", "--node_rank", "0", "--master_addr",
        "127.0.0.1", "--master_port", std::to_string(port), "--nproc_per_node",
        std::to_string(world), script, "{commands}", "{results}", dtype},
       world,
       false});
}

std::unique_ptr<PeerProcess> startMpiPeer(const std::string& mpirun, const std::string& binary,
                                          int world, const std::string& dtype) {
  if (!executable(binary)) {
    std::cerr << "allreduce_bench: no Open MPI peer: this build has no mpi_peer (HINT: apt-get "
                 "install libopenmpi-dev openmpi-bin, then reconfigure)\n";
    return nullptr;
  }
  if (std::system((mpirun + " --version >/dev/null 2>&1").c_str()) != 0) {
    std::cerr << "allreduce_bench: no Open MPI peer: `" << mpirun << "` does not run\n";
    return nullptr;
  }
  // Open MPI's shared-memory transport (vader), every rank unbound like dtrain's.
  return PeerProcess::start(
      {"mpi",
       {mpirun, "--oversubscribe", "--allow-run-as-root", "-np", std::to_string(world), "--bind-to",
        "none", "--mca", "pml", "ob1", "--mca", "btl", "self,vader", binary, "{dir}", dtype},
       world,
       true});
}

std::unique_ptr<PeerProcess> startProbe(const std::string& binary, int world, size_t maxBytes) {
  if (!executable(binary)) {
    std::cerr << "allreduce_bench: no probe: " << binary << " is missing\n";
    return nullptr;
  }
  return PeerProcess::start(
      {"probe", {binary, "{dir}", std::to_string(world), std::to_string(maxBytes)}, world, true});
}

}  // namespace dtrain::bench
