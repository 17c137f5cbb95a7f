#include "torch_peer.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>
#include <vector>

namespace dtrain::bench {

int freeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

std::unique_ptr<TorchPeer> TorchPeer::start(const std::string& python, const std::string& script,
                                            int world, const std::string& dtype) {
  std::string check = python + " -c 'import torch.distributed' >/dev/null 2>&1";
  if (access(python.c_str(), X_OK) != 0 || std::system(check.c_str()) != 0) {
    std::cerr << "allreduce_bench: no PyTorch peer: " << python
              << " cannot import torch.distributed (HINT: apt-get install python3-torch, or "
                 "--python PATH)\n";
    return nullptr;
  }
  std::unique_ptr<TorchPeer> peer(new TorchPeer());
  char tmpl[] = "/tmp/allreduce_bench.XXXXXX";
  if (!mkdtemp(tmpl)) return nullptr;
  peer->dir_ = tmpl;
  const std::string commands = peer->dir_ + "/commands";
  const std::string results = peer->dir_ + "/results";
  mkfifo(commands.c_str(), 0600);
  mkfifo(results.c_str(), 0600);
  // Read-write opens never block on a FIFO, and keep it open while the peer starts.
  peer->commands_ = open(commands.c_str(), O_RDWR | O_CLOEXEC);
  peer->results_ = open(results.c_str(), O_RDWR | O_CLOEXEC);
  const std::string log = peer->dir_ + "/peer.log";

  const int port = freeLoopbackPort();
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);  // its own process group: stop() ends torchrun and its workers together
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 1);
    dup2(fd, 2);
    // torchrun 1.13 on Python 3.11 fails without explicit --redirects/--tee maps. Not
    // --standalone: in 1.13 that rendezvouses on the fixed localhost:29400, which a launch or
    // store elsewhere on the machine may hold (the peer then hangs talking to it); a one-node
    // static rendezvous on a free loopback port instead.
    std::vector<std::string> args = {python, "-m", "torch.distributed.run", "--nnodes", "1",
                                     "--node_rank", "0", "--master_addr", "127.0.0.1",
                                     "--master_port", std::to_string(port),
                                     "--nproc_per_node", std::to_string(world),
                                     "--redirects", "9:0", "--tee", "9:0",
                                     script, commands, results, dtype};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(python.c_str(), argv.data());
    _exit(127);
  }
  peer->pid_ = pid;
  return peer;
}

TorchPeer::~TorchPeer() { stop(); }

void TorchPeer::dumpLog() const {
  std::ifstream in(dir_ + "/peer.log");
  std::cerr << "allreduce_bench: the PyTorch peer's log:\n" << in.rdbuf() << "\n";
}

std::optional<TorchPeer::Result> TorchPeer::run(size_t bytes, int warmup, int iters,
                                                std::chrono::seconds timeout) {
  if (pid_ < 0) return std::nullopt;
  std::string command = "run " + std::to_string(bytes) + " " + std::to_string(warmup) + " " +
                        std::to_string(iters) + "\n";
  if (write(commands_, command.data(), command.size()) != static_cast<ssize_t>(command.size())) {
    return std::nullopt;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (pending_.find('\n') == std::string::npos) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      std::cerr << "allreduce_bench: the PyTorch peer exited\n";
      dumpLog();
      return std::nullopt;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::cerr << "allreduce_bench: the PyTorch peer did not answer within " << timeout.count()
                << " s\n";
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

void TorchPeer::stop() {
  if (pid_ > 0) {
    const char quit[] = "quit\n";
    (void)!write(commands_, quit, sizeof(quit) - 1);
    // Let it leave cleanly (destroy_process_group), then make sure.
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
  if (commands_ >= 0) close(commands_);
  if (results_ >= 0) close(results_);
  commands_ = results_ = -1;
  if (!dir_.empty()) {
    unlink((dir_ + "/commands").c_str());
    unlink((dir_ + "/results").c_str());
    unlink((dir_ + "/peer.log").c_str());
    rmdir(dir_.c_str());
    dir_.clear();
  }
}

}  // namespace dtrain::bench
