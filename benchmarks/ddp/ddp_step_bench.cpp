// ddp_step_bench: median training-step time of dtrain's DistributedDataParallel against PyTorch's,
// at world size 2 with one thread per rank, for an MLP of ~25M parameters (batch 64 per rank) and
// ResNet-18 on 3x32x32 (batch 32 per rank). Rounds alternate dtrain and PyTorch so that both see
// the same machine load; each worker alternates synchronised and communication-free (noSync /
// no_sync) steps. Prints, per model: both medians and their ratio, the overhead of communication
// over the communication-free step, and the exposed communication share
// (step - communication-free step) / step.
//
//   ddp_step_bench [--rounds 3] [--steps 10] [--warmup 3] [--models mlp,resnet18] [--no-peer]
//                  [--python /usr/bin/python3] [--smoke]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include <fmt/format.h>

#include "ddp_step_bench.h"
#include "dtrain/error.h"
#include "dtrain/tcp_store.h"

extern char** environ;

namespace dtrain::bench {
namespace {

constexpr int kWorld = 2;

struct Options {
  StepConfig step;
  int rounds = 3;
  std::vector<std::string> models = {"mlp", "resnet18"};
  bool peer = true;
  std::string python = "/usr/bin/python3";
  std::string peerScript = DTRAIN_DDP_BENCH_DIR "/ddp_step_peer.py";
  bool worker = false;
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, sep);) {
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  bool batchSet = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      DTRAIN_CHECK_ARG(i + 1 < argc, "{} needs a value", a);
      return argv[++i];
    };
    if (a == "--smoke") o.step.smoke = true;
    else if (a == "--worker") o.worker = true;
    else if (a == "--no-peer") o.peer = false;
    else if (a == "--rounds") o.rounds = std::stoi(value());
    else if (a == "--steps") o.step.steps = std::stoi(value());
    else if (a == "--warmup") o.step.warmup = std::stoi(value());
    else if (a == "--batch") o.step.batch = std::stoi(value()), batchSet = true;
    else if (a == "--model") o.step.model = value();
    else if (a == "--models") o.models = split(value(), ',');
    else if (a == "--out") o.step.out = value();
    else if (a == "--python") o.python = value();
    else if (a == "--peer-script") o.peerScript = value();
    else DTRAIN_THROW(InvalidArgument, "unknown argument {} (see the comment atop ddp_step_bench.cpp)", a);
  }
  if (o.step.smoke && !o.worker) {
    o.rounds = 1;
    o.step.warmup = 1;
    o.step.steps = 2;
  }
  if (!batchSet && o.worker) o.step.batch = o.step.model == "mlp" ? 64 : 32;
  return o;
}

// Spawns `argv` with `env` added to this process's environment.
pid_t spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  std::vector<std::string> envStrings;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    if (!env.count(kv.substr(0, kv.find('=')))) envStrings.push_back(kv);
  }
  for (const auto& [k, v] : env) envStrings.push_back(k + "=" + v);
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  for (const auto& e : envStrings) envp.push_back(const_cast<char*>(e.c_str()));
  args.push_back(nullptr);
  envp.push_back(nullptr);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, args[0], nullptr, nullptr, args.data(), envp.data());
  DTRAIN_CHECK(rc == 0, "cannot start {}: {}", argv[0], std::strerror(rc));
  return pid;
}

// Waits for all; on the first failure kills the rest. Throws naming what failed.
void waitAll(std::vector<pid_t> pids, const std::string& what) {
  std::string failure;
  while (!pids.empty()) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) break;
    pids.erase(std::remove(pids.begin(), pids.end(), pid), pids.end());
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && failure.empty()) {
      failure = WIFEXITED(status) ? fmt::format("exit code {}", WEXITSTATUS(status))
                                  : fmt::format("signal {}", WTERMSIG(status));
      for (pid_t other : pids) kill(other, SIGKILL);
    }
  }
  DTRAIN_CHECK(failure.empty(), "{} failed: {}", what, failure);
}

std::string readResultFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  DTRAIN_CHECK(!s.str().empty(), "no result in {}", path);
  return s.str();
}

std::vector<std::string> workerArgs(const Options& o, const std::string& model, int batch,
                                    const std::string& out) {
  std::vector<std::string> a = {"--model", model, "--batch", std::to_string(batch), "--warmup",
                                std::to_string(o.step.warmup), "--steps",
                                std::to_string(o.step.steps), "--out", out};
  if (o.step.smoke) a.push_back("--smoke");
  return a;
}

StepResult runOurs(const Options& o, const std::string& model, int batch, const std::string& out) {
  std::random_device rd;
  std::string token = fmt::format("{:016x}{:016x}", (uint64_t{rd()} << 32) | rd(),
                                  (uint64_t{rd()} << 32) | rd());
  store::TcpStoreServerOptions so;
  so.token = token;
  auto server = store::TcpStoreServer::start(so);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < kWorld; ++rank) {
    std::vector<std::string> argv = {"/proc/self/exe", "--worker"};
    auto rest = workerArgs(o, model, batch, out);
    argv.insert(argv.end(), rest.begin(), rest.end());
    argv[0] = std::string(realpath("/proc/self/exe", nullptr));
    pids.push_back(spawn(argv, {{"RANK", std::to_string(rank)},
                                {"LOCAL_RANK", std::to_string(rank)},
                                {"WORLD_SIZE", std::to_string(kWorld)},
                                {"LOCAL_WORLD_SIZE", std::to_string(kWorld)},
                                {"OMP_NUM_THREADS", "1"},
                                {"DTRAIN_STORE_ADDR", "127.0.0.1"},
                                {"DTRAIN_STORE_PORT", std::to_string(server->port())},
                                {"DTRAIN_STORE_TOKEN", token},
                                {"DTRAIN_RESTART_COUNT", "0"}}));
  }
  waitAll(pids, "dtrain workers (" + model + ")");
  server->stop();
  return fromJson(readResultFile(out));
}

// A port free right now on loopback (the kernel's choice).
uint16_t freePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  DTRAIN_CHECK(fd >= 0, "socket: {}", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
            getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  DTRAIN_CHECK(ok, "cannot find a free port: {}", std::strerror(errno));
  return ntohs(addr.sin_port);
}

StepResult runPeer(const Options& o, const std::string& model, int batch, const std::string& out) {
  // Not --standalone: that always puts the rendezvous on port 29400, which other jobs on the
  // machine may hold. torchrun polls its workers every --monitor_interval seconds (default 5),
  // most of a smoke run.
  std::vector<std::string> argv = {o.python, "-m", "torch.distributed.run", "--nnodes", "1",
                                   "--nproc_per_node", std::to_string(kWorld),
                                   "--rdzv_backend", "c10d", "--rdzv_endpoint",
                                   fmt::format("127.0.0.1:{}", freePort()), "--rdzv_id",
                                   "ddp_step_bench", "--monitor_interval",
                                   o.step.smoke ? "1" : "5", "--redirects", "9:0", "--tee", "9:0",
                                   o.peerScript};
  auto rest = workerArgs(o, model, batch, out);
  argv.insert(argv.end(), rest.begin(), rest.end());
  // torchrun --standalone's rendezvous occasionally fails to connect to its own store on a busy
  // machine; one more attempt, said aloud, rather than a lost run.
  for (int attempt = 1;; ++attempt) {
    try {
      waitAll({spawn(argv, {{"OMP_NUM_THREADS", "1"}})}, "PyTorch peer (" + model + ")");
      return fromJson(readResultFile(out));
    } catch (const Error& e) {
      if (attempt == 2) throw;
      fmt::print(stderr, "ddp_step_bench: {}; trying once more\n", e.what());
    }
  }
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void append(std::vector<double>& to, const std::vector<double>& from) {
  to.insert(to.end(), from.begin(), from.end());
}

bool peerAvailable(const Options& o) {
  std::string cmd = o.python + " -c 'import torch.distributed.run' >/dev/null 2>&1";
  return access(o.peerScript.c_str(), R_OK) == 0 && std::system(cmd.c_str()) == 0;
}

int runDriver(const Options& o) {
  bool peer = o.peer && peerAvailable(o);
  char dirTemplate[] = "/tmp/ddp_step_bench.XXXXXX";
  DTRAIN_CHECK(mkdtemp(dirTemplate) != nullptr, "mkdtemp failed: {}", std::strerror(errno));
  std::string dir = dirTemplate;
  fmt::print("# ddp_step_bench: world size {}, 1 thread per rank, {} round(s) x {} steps "
             "(+{} warm-up), medians in ms{}\n",
             kWorld, o.rounds, o.step.steps, o.step.warmup, o.step.smoke ? ", SMOKE (tiny models)" : "");
  if (!peer) fmt::print("# PyTorch peer skipped (--no-peer, or {} cannot import torch)\n", o.python);
  fmt::print("# {:>8} {:>5} {:>7} {:>9} {:>9} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9}\n", "model",
             "batch", "params", "dtrain", "pytorch", "ratio", "d-nosync", "p-nosync", "overhead",
             "exposed-d", "exposed-p");
  for (const auto& model : o.models) {
    int batch = o.step.smoke ? 2 : (model == "mlp" ? 64 : 32);
    std::vector<double> ours, oursLocal, peerStep, peerLocal, waits;
    int64_t params = 0;
    for (int round = 0; round < o.rounds; ++round) {
      auto r = runOurs(o, model, batch, fmt::format("{}/dtrain_{}_{}.json", dir, model, round));
      params = r.parameters;
      append(ours, r.stepMs);
      append(oursLocal, r.noSyncMs);
      append(waits, r.waitMs);
      if (peer) {
        auto p = runPeer(o, model, batch, fmt::format("{}/pytorch_{}_{}.json", dir, model, round));
        DTRAIN_CHECK(p.parameters == params, "the PyTorch model has {} parameters, ours {}",
                     p.parameters, params);
        append(peerStep, p.stepMs);
        append(peerLocal, p.noSyncMs);
      }
    }
    double d = median(ours), dl = median(oursLocal), p = median(peerStep), pl = median(peerLocal);
    auto pct = [](double x) { return fmt::format("{:.1f}%", 100 * x); };
    fmt::print("  {:>8} {:>5} {:>6.2f}M {:>9.1f} {:>9} {:>6} {:>9.1f} {:>9} {:>9} {:>9} {:>9}\n",
               model, batch, params / 1e6, d, peer ? fmt::format("{:.1f}", p) : "-",
               peer ? fmt::format("{:.3f}", d / p) : "-", dl,
               peer ? fmt::format("{:.1f}", pl) : "-", pct((d - dl) / dl), pct((d - dl) / d),
               peer ? pct((p - pl) / p) : "-");
    fmt::print("  {:>8} dtrain end-of-backward wait (median): {:.1f} ms = {} of the step\n", "",
               median(waits), pct(median(waits) / d));
  }
  std::system(("rm -rf " + dir).c_str());
  return 0;
}

}  // namespace
}  // namespace dtrain::bench

int main(int argc, char** argv) {
  try {
    auto options = dtrain::bench::parse(argc, argv);
    if (options.worker) return dtrain::bench::runWorker(options.step);
    return dtrain::bench::runDriver(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_step_bench: %s\n", e.what());
    return 1;
  }
}
