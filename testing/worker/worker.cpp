// The test worker: a torch-free stand-in for a training program, run as real processes by
// `launch` in the integration tests, the benchmarks and scripts/demo.sh. Built as
// <build>/testing/worker/worker (target dtrain_test_worker).
//
// What it does, printing each thing on stdout (line-buffered):
//   1. "worker rank=R local_rank=L world_size=W attempt=A torchelastic_restart_count=A pid=P
//      ppid=Q" -- pids let tests prove no process of the job survives;
//   2. joins the job's store (connectToJobStore(): round<A>/ prefix) and passes the barrier
//      "start" (set "barrier/start/rank<R>", add("barrier/start/count", 1); the last to arrive
//      sets "barrier/start/done"; everyone waits for it; a timeout names the missing ranks);
//   3. runs --steps steps; at each step it obeys DTRAIN_FAULT (fault::injectAt for exit, signal,
//      abort, hang, stop, slow; and itself for flood:LINES, grandchild, error-file:CODE), prints
//      "rank R: step S", sleeps --step-ms, and with --barrier-every-step passes barrier "step<S>";
//   4. with --end-barrier passes barrier "end"; with --await-epoch MS (the first attempt only)
//      prints "rank R: awaiting epoch", waits (waitChanged, at most MS) for the master's membership
//      epoch (the round's "launch/epoch", Note [Membership epochs] in runtime/base/membership.h),
//      prints "rank R: epoch E world_size W new_rank N t=T: WHY" and adds 1 to the epoch's formed
//      counter -- a survivor re-formed, as the runtime's would; prints "rank R: done", exits 0.
// With --store HOST:PORT the barriers are on that store instead of the job's (a store the
// benchmark hosts, so the same worker passes the same barrier under launch and under torchrun),
// and after barrier "start" the worker records when it passed it: "passed/rank<R>" = its
// CLOCK_MONOTONIC in nanoseconds (one clock for every process of the machine, namespaces too).
// An exception (store timeout, bad DTRAIN_FAULT, ...) prints "rank R: error: ..." on stderr,
// writes TORCHELASTIC_ERROR_FILE the way torchrun's @record does, and exits 1.
//
// Flags:
//   --steps N                 steps to run (3)
//   --step-ms MS              sleep per step (0)
//   --no-store                skip the store: no join, no barriers
//   --barrier-timeout-ms MS   every store operation's deadline (30000)
//   --connect-timeout-ms MS   store connect deadline (10000)
//   --barrier-every-step      a barrier after each step, so a dead or stopped peer is noticed
//   --end-barrier             a barrier before exiting
//   --on-sigterm CODE         on SIGTERM print "rank R: SIGTERM: checkpointing" and exit CODE
//                             (75 emulates a trainer that checkpoints on preemption)
//   --ignore-sigterm          ignore SIGTERM (only SIGKILL stops it)
//   --grandchild-setsid       the grandchild fault's process leaves the process group (setsid)
//   --error-file-mode M       what error-file:CODE writes: json (default), garbage, huge, empty
//   --alloc-mb N              allocate and touch N MiB more at each step (OOM tests)
//   --alloc-rank R            only rank R allocates (--alloc-mb); default: every rank
//   --restart-steps N         steps to run in a restarted attempt (DTRAIN_RESTART_COUNT > 0);
//                             default: --steps
//   --progress                publish each step as the rank's progress (dtrain::progress::setStep;
//                             the publisher sends it to launch once a second, as a trainer's) and
//                             print "rank R: started attempt=A t=T" and "rank R: done attempt=A
//                             t=T" (CLOCK_MONOTONIC seconds), also with --quiet: the simulated
//                             nodes of the scale tests
//   --publish-figures         record "loss" (1/(step+1)) and "samples_per_s" (100+rank) each step
//                             with dtrain::metrics::Metrics and no sink of its own: under launch
//                             they reach launch's endpoint and metrics file through the store
//   --nan-loss-from S         with --publish-figures: the loss is NaN from step S ...
//   --nan-loss-until S        ... until step S (excluded; default: the last step)
//   --quiet                   print only the pid line and errors (benchmarks)
//   --print-env               print the worker-contract variables it received
//   --store HOST:PORT         the barriers' store (see above); keys under --store-prefix
//   --store-token TOKEN       that store's token (benchmarks only: argv is visible in ps)
//   --store-prefix P          keys on --store under "P/" ("bench")
//   --await-epoch MS          see 4.: a survivor of `launch --on-node-loss continue`, without the
//                             runtime (no epoch within MS: an error)
//   --no-formed               with --await-epoch: never add to the formed counter, and wait (MS)
//                             after the epoch instead of exiting -- a re-form that does not end
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/base/error.h"
#include "dtrain/base/job_store.h"
#include "dtrain/base/metrics.h"
#include "dtrain/base/progress.h"
#include "dtrain/base/tcp_store.h"
#include "env_contract.h"
#include "fault.h"
#include "membership.h"

namespace {

using dtrain::fault::Kind;

struct Flags {
  int64_t steps = 3;
  int64_t restartSteps = -1;
  int64_t stepMs = 0;
  bool progress = false;
  bool useStore = true;
  int64_t barrierTimeoutMs = 30000;
  int64_t connectTimeoutMs = 10000;
  bool barrierEveryStep = false;
  bool endBarrier = false;
  int onSigterm = -1;
  bool ignoreSigterm = false;
  bool grandchildSetsid = false;
  std::string errorFileMode = "json";
  int64_t allocMb = 0;
  int64_t allocRank = -1;
  bool publishFigures = false;
  int64_t nanLossFrom = -1;
  int64_t nanLossUntil = -1;
  bool quiet = false;
  bool printEnv = false;
  std::string storeHost;  // --store: empty for the job's store
  int storePort = 0;
  std::string storeToken;
  std::string storePrefix = "bench";
  int64_t awaitEpochMs = -1;  // --await-epoch: < 0, not at all
  bool noFormed = false;
};

int gRank = -1;
int gSigtermCode = 0;

int envInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

[[noreturn]] void usage(const std::string& what) {
  std::fprintf(stderr, "worker: %s; see the flags at the top of testing/worker/worker.cpp\n",
               what.c_str());
  std::exit(2);
}

Flags parseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto number = [&]() -> int64_t {
      if (i + 1 >= argc) usage(a + " needs a value");
      char* end = nullptr;
      long long v = std::strtoll(argv[++i], &end, 10);
      if (*end != '\0' || v < 0) usage(a + " needs a non-negative integer");
      return v;
    };
    if (a == "--steps") f.steps = number();
    else if (a == "--restart-steps") f.restartSteps = number();
    else if (a == "--progress") f.progress = true;
    else if (a == "--step-ms") f.stepMs = number();
    else if (a == "--no-store") f.useStore = false;
    else if (a == "--barrier-timeout-ms") f.barrierTimeoutMs = number();
    else if (a == "--connect-timeout-ms") f.connectTimeoutMs = number();
    else if (a == "--barrier-every-step") f.barrierEveryStep = true;
    else if (a == "--end-barrier") f.endBarrier = true;
    else if (a == "--on-sigterm") f.onSigterm = static_cast<int>(number());
    else if (a == "--ignore-sigterm") f.ignoreSigterm = true;
    else if (a == "--grandchild-setsid") f.grandchildSetsid = true;
    else if (a == "--error-file-mode") {
      if (i + 1 >= argc) usage("--error-file-mode needs a value");
      f.errorFileMode = argv[++i];
    } else if (a == "--alloc-mb") f.allocMb = number();
    else if (a == "--alloc-rank") f.allocRank = number();
    else if (a == "--publish-figures") f.publishFigures = true;
    else if (a == "--nan-loss-from") f.nanLossFrom = number();
    else if (a == "--nan-loss-until") f.nanLossUntil = number();
    else if (a == "--quiet") f.quiet = true;
    else if (a == "--print-env") f.printEnv = true;
    else if (a == "--await-epoch") f.awaitEpochMs = number();
    else if (a == "--no-formed") f.noFormed = true;
    else if (a == "--store") {
      if (i + 1 >= argc) usage("--store needs HOST:PORT");
      std::string v = argv[++i];
      size_t colon = v.rfind(':');
      if (colon == std::string::npos || colon == 0) usage("--store needs HOST:PORT");
      f.storeHost = v.substr(0, colon);
      f.storePort = std::atoi(v.c_str() + colon + 1);
      if (f.storePort <= 0 || f.storePort > 65535) usage("--store needs HOST:PORT");
    } else if (a == "--store-token") {
      if (i + 1 >= argc) usage("--store-token needs a value");
      f.storeToken = argv[++i];
    } else if (a == "--store-prefix") {
      if (i + 1 >= argc) usage("--store-prefix needs a value");
      f.storePrefix = argv[++i];
    } else usage("unknown flag " + a);
  }
  return f;
}

std::string jsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

// Writes TORCHELASTIC_ERROR_FILE in torchrun's format (or deliberately broken, for tests).
void writeErrorFile(const std::string& message, const std::string& mode) {
  const char* path = std::getenv(dtrain::env::kErrorFile);
  if (!path || !*path) return;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (mode == "garbage") {
    out << "\x01\x02 this is { not json \xff\xfe";
  } else if (mode == "huge") {
    out << "{\"message\": {\"message\": \"" << std::string(8 << 20, 'x') << "\"}}";
  } else if (mode == "empty") {
    // nothing
  } else {
    out << "{\"message\": {\"message\": \"" << jsonEscape(message)
        << "\", \"extraInfo\": {\"py_callstack\": \"worker.cpp: main -> step\", \"timestamp\": \""
        << std::time(nullptr) << "\"}}}";
  }
}

// CLOCK_MONOTONIC in seconds: the same clock in every process, so a test can subtract the time
// one worker crashed from the time another got SIGTERM (crash detection latency).
double monotonicSeconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void onSigterm(int) {
  const double now = monotonicSeconds();
  char buf[128];
  int n = std::snprintf(buf, sizeof buf, "rank %d: SIGTERM: checkpointing and exiting (t=%.6f)\n",
                        gRank, now);
  if (n > 0) (void)!::write(STDOUT_FILENO, buf, static_cast<size_t>(n));
  ::_exit(gSigtermCode);
}

void barrier(dtrain::store::Store& store, const std::string& name, int world,
             std::chrono::milliseconds timeout) {
  const std::string base = "barrier/" + name;
  store.setString(base + "/rank" + std::to_string(gRank), "1");  // who arrived, for the message
  if (store.add(base + "/count", 1) >= world) store.setString(base + "/done", "1");
  try {
    store.wait({base + "/done"}, timeout);
  } catch (const dtrain::TimeoutError& e) {
    std::string missing;
    for (int r = 0; r < world; ++r) {
      if (!store.check({base + "/rank" + std::to_string(r)})) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
    }
    DTRAIN_THROW(dtrain::TimeoutError,
                 "rank {}: barrier \"{}\" timed out after {} ms: {}/{} ranks "
                 "arrived, missing rank(s) {} ({})",
                 gRank, name, timeout.count(), store.add(base + "/count", 0), world, missing,
                 e.what());
  }
}

// --await-epoch: what a survivor's runtime does when the master writes the next epoch.
void awaitEpoch(dtrain::store::Store& store, const Flags& flags) {
  const std::string key = dtrain::membership::epochKey();
  std::printf("rank %d: awaiting epoch\n", gRank);
  std::fflush(stdout);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(flags.awaitEpochMs);
  dtrain::store::Bytes seen;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      DTRAIN_THROW(dtrain::TimeoutError, "rank {}: no membership epoch on \"{}\" within {} ms",
                   gRank, key, flags.awaitEpochMs);
    }
    try {
      seen = store.waitChanged(key, seen, std::min(left, std::chrono::milliseconds(1000)));
      break;
    } catch (const dtrain::TimeoutError&) {
    }
  }
  const dtrain::membership::Epoch e = dtrain::membership::decodeEpoch(
      dtrain::store::toString(seen));
  const int node = envInt(dtrain::env::kNodeId, 0);
  std::printf("rank %d: epoch %d world_size %d new_rank %d t=%.6f: %s\n", gRank, e.epoch,
              e.worldSize, e.rankOf(std::to_string(node), envInt(dtrain::env::kLocalRank, 0)),
              monotonicSeconds(), e.why.c_str());
  std::fflush(stdout);
  if (flags.noFormed) {
    std::this_thread::sleep_for(std::chrono::milliseconds(flags.awaitEpochMs));
    return;
  }
  store.add(dtrain::membership::formedKey(e.epoch), 1);
  store.flush();
}

void flood(int rank, int64_t lines) {
  // Both streams, written in chunks that do not end at line ends: the launcher must put the lines
  // back together and never show half of one.
  std::string pad(150, '.');
  std::string out;
  std::string err;
  auto writeChunks = [](int fd, std::string& text, bool all) {
    constexpr size_t kChunk = 4093;
    size_t off = 0;
    while (text.size() - off >= kChunk || (all && off < text.size())) {
      size_t n = std::min(kChunk, text.size() - off);
      if (::write(fd, text.data() + off, n) < 0 && errno != EINTR) break;
      off += n;
    }
    text.erase(0, off);
  };
  for (int64_t i = 0; i < lines; ++i) {
    out += "rank " + std::to_string(rank) + " flood out " + std::to_string(i) + " " + pad +
           " end\n";
    err += "rank " + std::to_string(rank) + " flood err " + std::to_string(i) + " " + pad +
           " end\n";
    writeChunks(STDOUT_FILENO, out, false);
    writeChunks(STDERR_FILENO, err, false);
  }
  writeChunks(STDOUT_FILENO, out, true);
  writeChunks(STDERR_FILENO, err, true);
}

// Returns once the grandchild has printed its pid line: a test that counts those lines (and
// checks that the pids end with the job) must not race a worker that finishes -- and has its
// group killed -- before a grandchild starved of CPU got to print.
void spawnGrandchild(int rank, bool setsid) {
  std::fflush(nullptr);
  int ready[2];
  if (::pipe(ready) != 0) {
    std::fprintf(stderr, "rank %d: pipe: %s\n", rank, std::strerror(errno));
    std::exit(1);
  }
  pid_t pid = ::fork();
  if (pid != 0) {
    ::close(ready[1]);
    char byte = 0;
    while (pid > 0 && ::read(ready[0], &byte, 1) < 0 && errno == EINTR) {
    }
    ::close(ready[0]);
    return;
  }
  ::close(ready[0]);
  if (setsid) ::setsid();
  ::signal(SIGTERM, SIG_IGN);  // only SIGKILL (or a guardian) ends it
  ::signal(SIGHUP, SIG_IGN);
  ::signal(SIGINT, SIG_IGN);
  std::printf("rank %d: grandchild pid=%d pgid=%d\n", rank, ::getpid(), ::getpgid(0));
  std::fflush(stdout);
  (void)!::write(ready[1], "r", 1);
  ::close(ready[1]);
  while (true) ::pause();
}

int run(const Flags& flags) {
  const int rank = envInt(dtrain::env::kRank, 0);
  const int world = envInt(dtrain::env::kWorldSize, 1);
  const int attempt = envInt(dtrain::env::kDtrainRestartCount, 0);
  gRank = rank;
  std::printf("worker rank=%d local_rank=%d world_size=%d attempt=%d "
              "torchelastic_restart_count=%d pid=%d ppid=%d\n",
              rank, envInt(dtrain::env::kLocalRank, 0), world, attempt,
              envInt(dtrain::env::kRestartCount, -1), ::getpid(), ::getppid());
  if (flags.printEnv) {
    for (const char* name :
         {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
          "OMP_NUM_THREADS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "DTRAIN_STORE_ADDR",
          "DTRAIN_STORE_PORT", "GROUP_RANK", "DTRAIN_NODE_ID", "CUDA_VISIBLE_DEVICES",
          "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_DEBUG", "FROM_DOTENV"}) {
      const char* v = std::getenv(name);
      std::printf("rank %d: env %s=%s\n", rank, name, v ? v : "(unset)");
    }
    std::printf("rank %d: env DTRAIN_STORE_TOKEN is %s\n", rank,
                std::getenv(dtrain::env::kStoreToken) ? "set" : "unset");
  }
  (void)dtrain::fault::activeFaults();  // a bad DTRAIN_FAULT fails here, before the store
  if (flags.progress) {
    std::printf("rank %d: started attempt=%d t=%.6f\n", rank, attempt, monotonicSeconds());
  }
  const int64_t steps = attempt > 0 && flags.restartSteps >= 0 ? flags.restartSteps : flags.steps;

  std::shared_ptr<dtrain::store::PrefixStore> store;
  const std::chrono::milliseconds timeout(flags.barrierTimeoutMs);
  if (!flags.storeHost.empty()) {
    dtrain::store::TcpStoreOptions options;
    options.host = flags.storeHost;
    options.port = static_cast<uint16_t>(flags.storePort);
    options.token = flags.storeToken;
    options.connectTimeout = std::chrono::milliseconds(flags.connectTimeoutMs);
    options.timeout = timeout;
    store = std::make_shared<dtrain::store::PrefixStore>(
        flags.storePrefix, std::make_shared<dtrain::store::TcpStore>(options));
    barrier(*store, "start", world, timeout);
    timespec now{};
    ::clock_gettime(CLOCK_MONOTONIC, &now);
    store->setString("passed/rank" + std::to_string(rank),
                     std::to_string(static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec));
    store->flush();
  } else if (flags.useStore) {
    auto t0 = std::chrono::steady_clock::now();
    dtrain::store::JobStoreOptions options;
    options.connectTimeout = std::chrono::milliseconds(flags.connectTimeoutMs);
    options.timeout = timeout;
    store = dtrain::store::connectToJobStore(options);
    barrier(*store, "start", world, timeout);
    if (!flags.quiet) {
      double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::printf("rank %d: joined store %s (%s), barrier start passed in %.1f ms\n", rank,
                  store->describe().c_str(), store->prefix().c_str(), ms);
    }
  }

  dtrain::metrics::MetricsOptions metricsOptions;
  metricsOptions.toLaunch = flags.publishFigures;  // else no publisher thread at all
  dtrain::metrics::Metrics metrics(metricsOptions);
  std::vector<std::vector<char>> hog;
  for (int64_t step = 0; step < steps; ++step) {
    for (const auto& f : dtrain::fault::activeFaults()) {
      if (!f.matches(rank, step, attempt)) continue;
      std::printf("rank %d: step %lld: injecting %s (t=%.6f)\n", rank, static_cast<long long>(step),
                  f.describe().c_str(), monotonicSeconds());
      std::fflush(stdout);
      switch (f.kind) {
        case Kind::Flood: flood(rank, f.arg); break;
        case Kind::Grandchild: spawnGrandchild(rank, flags.grandchildSetsid); break;
        case Kind::ErrorFile:
          writeErrorFile("injected failure at step " + std::to_string(step) + " on rank " +
                             std::to_string(rank),
                         flags.errorFileMode);
          std::fprintf(stderr, "rank %d: wrote the error file, exiting %lld\n", rank,
                       static_cast<long long>(f.arg));
          std::fflush(nullptr);
          ::_exit(static_cast<int>(f.arg));
        default: dtrain::fault::execute(f); break;
      }
    }
    if (flags.allocMb > 0 && (flags.allocRank < 0 || flags.allocRank == rank)) {
      hog.emplace_back(static_cast<size_t>(flags.allocMb) << 20, 1);  // touched: really resident
    }
    if (flags.publishFigures) {
      const bool diverged = flags.nanLossFrom >= 0 && step >= flags.nanLossFrom &&
                            (flags.nanLossUntil < 0 || step < flags.nanLossUntil);
      const double loss = diverged ? std::nan("") : 1.0 / static_cast<double>(step + 1);
      metrics.record(step, {{"loss", loss}, {"samples_per_s", 100.0 + rank}});
    }
    if (flags.progress) dtrain::progress::setStep(step);
    if (!flags.quiet) std::printf("rank %d: step %lld\n", rank, static_cast<long long>(step));
    if (flags.stepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(flags.stepMs));
    if (store && flags.barrierEveryStep) {
      barrier(*store, "step" + std::to_string(step), world, timeout);
    }
  }
  if (store && flags.endBarrier) barrier(*store, "end", world, timeout);
  if (store && flags.awaitEpochMs >= 0 && attempt == 0) awaitEpoch(*store, flags);
  if (flags.progress) {
    std::printf("rank %d: done attempt=%d t=%.6f\n", rank, attempt, monotonicSeconds());
  } else if (!flags.quiet) {
    std::printf("rank %d: done\n", rank);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  Flags flags = parseFlags(argc, argv);
  if (flags.onSigterm >= 0) {
    gSigtermCode = flags.onSigterm;
    ::signal(SIGTERM, onSigterm);
  } else if (flags.ignoreSigterm) {
    ::signal(SIGTERM, SIG_IGN);
  }
  try {
    return run(flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", gRank, e.what());
    writeErrorFile(e.what(), "json");
    return 1;
  }
}
