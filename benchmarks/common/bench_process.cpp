#include "common/bench_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "dtrain/base/error.h"
#include "free_port.h"

extern char** environ;

namespace dtrain::bench {

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

void waitAll(std::vector<pid_t> pids, const std::string& what) {
  std::string failure;
  while (!pids.empty()) {
    int status = 0;
    pid_t pid = waitpid(pids.front(), &status, 0);
    if (pid < 0) break;
    pids.erase(pids.begin());
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && failure.empty()) {
      failure = WIFEXITED(status) ? fmt::format("exit code {}", WEXITSTATUS(status))
                                  : fmt::format("signal {}", WTERMSIG(status));
      killAll(pids);
      pids.clear();
    }
  }
  DTRAIN_CHECK(failure.empty(), "{} failed: {}", what, failure);
}

void killAll(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) kill(pid, SIGKILL);
  for (pid_t pid : pids) waitpid(pid, nullptr, 0);
}

uint16_t freePort() {
  const int port = testing::freePortOn("127.0.0.1");
  DTRAIN_CHECK(port > 0, "cannot find a free port on 127.0.0.1: {}", std::strerror(errno));
  return static_cast<uint16_t>(port);
}

Job startWorkers(std::string name, int world, const std::vector<std::string>& workerArgs,
                 const std::map<std::string, std::string>& env, std::string out) {
  Job job{std::move(name), {}, nullptr, std::move(out)};
  std::random_device rd;
  std::string token = fmt::format("{:016x}{:016x}", (uint64_t{rd()} << 32) | rd(),
                                  (uint64_t{rd()} << 32) | rd());
  store::TcpStoreServerOptions so;
  so.token = token;
  job.store = store::TcpStoreServer::start(so);
  char* self = realpath("/proc/self/exe", nullptr);
  std::vector<std::string> argv = {self, "--worker"};
  std::free(self);
  argv.insert(argv.end(), workerArgs.begin(), workerArgs.end());
  for (int rank = 0; rank < world; ++rank) {
    std::map<std::string, std::string> rankEnv = {
        {"RANK", std::to_string(rank)},
        {"LOCAL_RANK", std::to_string(rank)},
        {"WORLD_SIZE", std::to_string(world)},
        {"LOCAL_WORLD_SIZE", std::to_string(world)},
        {"OMP_NUM_THREADS", "1"},
        {"DTRAIN_STORE_ADDR", "127.0.0.1"},
        {"DTRAIN_STORE_PORT", std::to_string(job.store->port())},
        {"DTRAIN_STORE_TOKEN", token},
        {"DTRAIN_RESTART_COUNT", "0"}};
    for (const auto& [key, value] : env) rankEnv[key] = value;
    job.pids.push_back(spawn(argv, rankEnv));
  }
  return job;
}

std::vector<std::string> torchrunArgv(const std::string& python, int world,
                                      const std::string& rdzvId, bool smoke) {
  return {python,
          "-m",
          "torch.distributed.run",
          "--nnodes",
          "1",
          "--nproc_per_node",
          std::to_string(world),
          "--rdzv_backend",
          "c10d",
          "--rdzv_endpoint",
          fmt::format("127.0.0.1:{}", freePort()),
          "--rdzv_id",
          rdzvId,
          "--monitor_interval",
          smoke ? "1" : "5"};
}

std::string finishJob(Job& job) {
  waitAll(job.pids, job.name);
  job.pids.clear();
  if (job.store) job.store->stop();
  std::ifstream in(job.out);
  std::stringstream s;
  s << in.rdbuf();
  DTRAIN_CHECK(!s.str().empty(), "no result in {}", job.out);
  return s.str();
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, sep);) {
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

TurnGiver::TurnGiver(std::string path) : path_(std::move(path)) {
  signal(SIGPIPE, SIG_IGN);  // a job that died shows up as EPIPE, not as our death
  for (const char* suffix : {".go", ".done"}) {
    std::string p = path_ + suffix;
    DTRAIN_CHECK(mkfifo(p.c_str(), 0600) == 0, "mkfifo {}: {}", p, std::strerror(errno));
  }
}

TurnGiver::~TurnGiver() {
  if (go_ >= 0) close(go_);
  if (done_ >= 0) close(done_);
}

void TurnGiver::connect(const std::vector<pid_t>& pids, double timeoutSeconds) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutSeconds);
  std::string go = path_ + ".go";
  // A non-blocking open for writing fails (ENXIO) until the reader is there: poll for it, so a
  // job that dies while starting is noticed instead of blocking us forever.
  while ((go_ = open(go.c_str(), O_WRONLY | O_NONBLOCK)) < 0) {
    DTRAIN_CHECK(errno == ENXIO, "open {}: {}", go, std::strerror(errno));
    for (pid_t pid : pids) {
      DTRAIN_CHECK(waitpid(pid, nullptr, WNOHANG) == 0, "a job ended before taking turns ({})",
                   path_);
    }
    DTRAIN_CHECK(std::chrono::steady_clock::now() < deadline, "the job did not open {} within {} s",
                 go, timeoutSeconds);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  fcntl(go_, F_SETFL, fcntl(go_, F_GETFL) & ~O_NONBLOCK);
  // Rank 0 opens "done" right after "go".
  std::string done = path_ + ".done";
  done_ = open(done.c_str(), O_RDONLY);
  DTRAIN_CHECK(done_ >= 0, "open {}: {}", done, std::strerror(errno));
}

void TurnGiver::give() {
  char c = 'g';
  DTRAIN_CHECK(write(go_, &c, 1) == 1, "the job behind {} is gone ({})", path_,
               std::strerror(errno));
  ssize_t n;
  do {
    n = read(done_, &c, 1);
  } while (n < 0 && errno == EINTR);
  DTRAIN_CHECK(n == 1, "the job behind {} ended during its turn", path_);
}

TurnTaker::TurnTaker(const std::string& path, bool owner) {
  if (path.empty() || !owner) return;
  go_ = open((path + ".go").c_str(), O_RDONLY);
  DTRAIN_CHECK(go_ >= 0, "cannot open the turn FIFO {}.go: {}", path, std::strerror(errno));
  done_ = open((path + ".done").c_str(), O_WRONLY);
  DTRAIN_CHECK(done_ >= 0, "cannot open the turn FIFO {}.done: {}", path, std::strerror(errno));
}

TurnTaker::~TurnTaker() {
  if (go_ >= 0) close(go_);
  if (done_ >= 0) close(done_);
}

void TurnTaker::begin() {
  if (go_ < 0) return;
  char c;
  ssize_t n;
  do {
    n = read(go_, &c, 1);
  } while (n < 0 && errno == EINTR);
  DTRAIN_CHECK(n == 1, "the driver closed the turn FIFO");
}

void TurnTaker::end() {
  if (done_ < 0) return;
  char c = 'd';
  DTRAIN_CHECK(write(done_, &c, 1) == 1, "the driver is gone ({})", std::strerror(errno));
}

std::string flagValue(int argc, char** argv, int& i) {
  DTRAIN_CHECK_ARG(i + 1 < argc, "{} needs a value", argv[i]);
  return argv[++i];
}

int flagCount(int argc, char** argv, int& i) {
  std::string flag = argv[i];
  std::string v = flagValue(argc, argv, i);
  char* end = nullptr;
  long n = std::strtol(v.c_str(), &end, 10);
  DTRAIN_CHECK_ARG(!v.empty() && *end == '\0' && n >= 0 && n < 1000000,
                   "{} needs a count, got '{}'", flag, v);
  return static_cast<int>(n);
}

}  // namespace dtrain::bench
