// allreduce_bench: dtrain's allreduce in nccl-tests' format, beside its peers, measured in the same
// run and interleaved size by size and round by round, so all of them see the same machine load.
//
//   launch --nproc-per-node 2 allreduce_bench [options]     one rank per process, from launch
//   allreduce_bench --world 2 [options]                      forks the ranks itself
//
// Contenders (columns of busbw, GB/s): dtrain's shared-memory path on user buffers (`shm`) and on
// communicator-owned ones (`shm-own`, allocate()); with --nodes N the hierarchical path on N
// pretend nodes (`hier`, `hier-own`); dtrain over Gloo (`gloo`); PyTorch's C++
// c10d::ProcessGroupGloo from the libtorch this build links, run by the benchmark's own ranks
// (`c10d`, c10d_peer.h); torch.distributed on gloo (`torch`, Python, under torchrun); Open MPI's
// MPI_Allreduce on its shared-memory transport (`mpi`, under mpirun); the bare probe of the
// shared-memory algorithm (`probe`: buffers in the segment, `probe-cp`: copied in and out;
// shm_probe.cpp), the ceiling; and a single-thread memcpy of the same size (`memcpy`, GB/s).
// Ratios: shm-own / probe, shm / probe-cp, shm-own / mpi, shm / mpi, shm / c10d, gloo / c10d,
// probe / memcpy (algbw over copy bandwidth: a weak probe shows).
//
// Options: --sizes 4K,64K,... (default 4 KiB..256 MiB by 4x), --warmup N, --iters N,
// --small-iters N (sizes up to 256 KiB, default 200), --rounds N (default 3), --dtype, --op,
// --nodes N, --no-peer (no c10d, torch, mpi, probe), --no-c10d, --no-torch, --no-mpi, --no-probe,
// --no-gloo, --python PATH, --mpirun PATH, --smoke (three small sizes, few iterations: the CTest),
// --backend nccl (GPU mode: dtrain's NCCL communicator alone), and Gloo tuning (--small-bytes,
// --chunk-bytes, --segment-bytes, --two-rank-ring).
//
// A time is rank 0's median call of a round, then the median over rounds; busbw = algbw * 2(n-1)/n.
// Before timing, each contender checks one allreduce against the closed form (rank r contributes
// r + i % 5) and counts wrong elements (#wrong, over all contenders).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <cxxopts.hpp>
#include <fmt/format.h>

#include "allreduce_config.h"
#include "bench_buffers.h"
#include "c10d_peer.h"
#include "common/stats.h"
#include "dtrain/base/error.h"
#include "dtrain/base/job_store.h"
#include "dtrain/base/tcp_store.h"
#include "dtrain/comm/communicator.h"
#include "dtrain/comm/gloo_communicator.h"
#include "dtrain/comm/nccl_communicator.h"
#include "dtrain/comm/shm_communicator.h"
#include "env_contract.h"
#include "peer_process.h"

namespace dtrain::bench {
namespace {

using Clock = std::chrono::steady_clock;

double memcpyMedianUs(size_t bytes, int iters) {
  std::vector<char> a(bytes, 1), b(bytes, 2);  // touched here, not in the timed loop
  std::vector<double> times;
  for (int i = 0; i < iters + 2; ++i) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    auto t1 = Clock::now();
    if (i >= 2) times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    a[i % bytes] = static_cast<char>(i);  // keep the copy from being optimised away
  }
  if (b[0] == 42) std::fputs("", stdout);
  return median(times);
}

struct Row {
  double us = 0;
  long wrong = 0;
};

// One allreduce contender. dtrain's are collective (every rank measures); peers run on rank 0
// only, the other ranks waiting at a barrier meanwhile.
struct Contender {
  std::string name;
  bool peer = false;
  std::function<std::optional<Row>(size_t bytes, int warmup)> measure;
};

Row measureDtrain(comm::Communicator& c, void* data, size_t bytes, const Config& cfg, int warmup) {
  const size_t count = bytes / comm::elementSize(cfg.dtype);
  fillHost(data, cfg.dtype, c.rank(), count);
  c.allreduce(data, count, cfg.dtype, cfg.op);
  Row row;
  row.wrong = countWrongHost(data, cfg.dtype, count, c.size(), cfg.op);
  for (int i = 0; i < warmup; ++i) c.allreduce(data, count, cfg.dtype, cfg.op);
  c.barrier();
  std::vector<double> times;
  for (int i = 0; i < itersFor(bytes, cfg); ++i) {
    auto t0 = Clock::now();
    c.allreduce(data, count, cfg.dtype, cfg.op);
    times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  row.us = median(times);
  return row;
}

int envInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

comm::GlooOptions glooOptions(const Config& cfg, int rank, int world,
                              std::shared_ptr<store::Store> store, const std::string& name) {
  const char* host = std::getenv(env::kStoreAddr);
  comm::GlooOptions o;
  o.rank = rank;
  o.size = world;
  o.store = std::move(store);
  o.storeHost = host ? host : "";
  o.name = name;
  o.smallAllreduceBytes = cfg.smallAllreduceBytes;
  o.ringSegmentBytes = cfg.ringSegmentBytes;
  o.directChunkBytes = cfg.directChunkBytes;
  o.twoRankExchange = cfg.twoRankExchange;
  return o;
}

// GPU mode: dtrain's NCCL communicator alone, on device buffers.
int runNccl(const Config& cfg, int rank, int world, std::shared_ptr<store::Store> store) {
  comm::NcclOptions o;
  o.rank = rank;
  o.size = world;
  o.store = store;
  o.device = envInt(env::kLocalRank, 0);
  o.name = "allreduce_bench";
  auto c = comm::createNcclCommunicator(o);
  auto buf = BenchBuffers::create(*c, *std::max_element(cfg.sizes.begin(), cfg.sizes.end()),
                                  cfg.dtype);
  const double bus = world > 1 ? 2.0 * (world - 1) / world : 1.0;
  long totalWrong = 0;
  if (rank == 0) {
    std::printf("%10s %11s %8s %4s %10s %7s %7s %6s\n", "size", "count", "dtype", "op", "time_us",
                "algbw", "busbw", "#wrong");
  }
  for (size_t bytes : cfg.sizes) {
    const size_t count = bytes / comm::elementSize(cfg.dtype);
    std::vector<double> rounds;
    long wrong = 0;
    for (int round = 0; round < cfg.rounds; ++round) {
      buf->fillContribution(rank, count);
      c->allreduce(buf->data(), count, cfg.dtype, cfg.op);
      wrong += buf->countWrong(count, world, cfg.op);
      for (int i = 0; i < (round == 0 ? cfg.warmup : 1); ++i)
        c->allreduce(buf->data(), count, cfg.dtype, cfg.op);
      buf->synchronize();
      std::vector<double> times;
      for (int i = 0; i < itersFor(bytes, cfg); ++i) {
        auto t0 = Clock::now();
        c->allreduce(buf->data(), count, cfg.dtype, cfg.op);
        buf->synchronize();
        times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
      rounds.push_back(median(times));
    }
    totalWrong += wrong;
    if (rank != 0) continue;
    const double us = median(rounds), algbw = bytes / us / 1e3;
    std::printf("%10zu %11zu %8s %4s %10.1f %7.3f %7.3f %6ld\n", bytes, count,
                comm::dataTypeName(cfg.dtype), comm::reduceOpName(cfg.op), us, algbw, algbw * bus,
                wrong);
    std::fflush(stdout);
  }
  c->shutdown();
  return totalWrong == 0 ? 0 : 1;
}

// dtrain's communicators, each with its own buffers, made before anything is timed.
struct Communicators {
  std::shared_ptr<comm::Communicator> gloo, shm, hier;  // hier: with --nodes only
  std::shared_ptr<comm::Buffer> shmOwned, hierOwned;

  void shutdown() {
    if (hier) hier->shutdown();
    shm->shutdown();
    gloo->shutdown();
  }
};

Communicators openCommunicators(const Config& cfg, int rank, int world,
                                const std::shared_ptr<store::Store>& store, size_t maxBytes) {
  Communicators c;
  c.gloo = comm::createGlooCommunicator(
      glooOptions(cfg, rank, world, store, "allreduce_bench/gloo"));
  comm::ShmOptions so;
  so.rank = rank;
  so.size = world;
  so.store = store;
  so.name = "allreduce_bench/shm";
  so.spin = std::chrono::microseconds(cfg.shmSpinUs);
  so.yieldSpin = cfg.shmYield;
  so.slotBytes = cfg.shmSlotBytes;
  so.ownedChunkBytes = cfg.shmOwnedChunkBytes;
  so.smallBytes = cfg.shmSmallBytes;
  c.shm = comm::createShmCommunicator(so);
  c.shmOwned = c.shm->allocate(maxBytes);
  if (cfg.nodes > 1) {
    DTRAIN_CHECK_ARG(world % cfg.nodes == 0 && world / cfg.nodes >= 2,
                     "--nodes {}: the world of {} ranks must split into nodes of two or more",
                     cfg.nodes, world);
    comm::HierarchicalOptions h;
    h.rank = rank;
    h.size = world;
    h.store = store;
    h.name = "allreduce_bench/hier";
    h.shm = so;
    for (int r = 0; r < world; ++r)
      h.nodes.nodeOf.push_back(std::to_string(r / (world / cfg.nodes)));
    c.hier = comm::createHierarchicalCommunicator(h);
    c.hierOwned = c.hier->allocate(maxBytes);
  }
  return c;
}

void addDtrainContenders(std::vector<Contender>& contenders, const Config& cfg, Communicators& c,
                         void* user) {
  auto add = [&](const std::string& name, comm::Communicator& communicator, void* data) {
    contenders.push_back({name, false, [&cfg, &communicator, data](size_t bytes, int warmup) {
                            return std::optional<Row>(
                                measureDtrain(communicator, data, bytes, cfg, warmup));
                          }});
  };
  add("shm", *c.shm, user);
  add("shm-own", *c.shm, c.shmOwned->data());
  if (c.hier) {
    add("hier", *c.hier, user);
    add("hier-own", *c.hier, c.hierOwned->data());
  }
  if (cfg.gloo) add("gloo", *c.gloo, user);
}

// The peers that run as programs of their own, on rank 0 only; the dtype and op decide which can.
std::vector<std::unique_ptr<PeerProcess>> startPeers(const Config& cfg, int world,
                                                     size_t maxBytes) {
  std::vector<std::unique_ptr<PeerProcess>> peers;
  const bool floatSum = cfg.dtype == comm::DataType::Float32 && cfg.op == comm::ReduceOp::Sum;
  const std::string dtype = comm::dataTypeName(cfg.dtype);
  const bool sum = cfg.op == comm::ReduceOp::Sum;  // the peers only sum
  if (cfg.torch && sum) peers.push_back(startTorchPeer(cfg.python, cfg.peerScript, world, dtype));
  if (cfg.mpi && sum && cfg.dtype != comm::DataType::Float16 &&
      cfg.dtype != comm::DataType::BFloat16) {
    peers.push_back(startMpiPeer(cfg.mpirun, cfg.mpiPeer, world, dtype));
  }
  if (cfg.probe && floatSum) peers.push_back(startProbe(cfg.probeBinary, world, maxBytes));
  return peers;
}

// The peers' rows. Every rank must agree on the list (the rows of the table): rank 0, which owns
// the peers, says over `gloo` which of them started.
void addPeerContenders(std::vector<Contender>& contenders, const Config& cfg,
                       std::vector<std::unique_ptr<PeerProcess>>& peers, comm::Communicator& gloo) {
  const std::vector<std::string> peerRows = {"torch", "mpi", "probe", "probe-cp"};
  std::vector<int32_t> started(peerRows.size(), 0);
  for (auto& p : peers) {
    if (!p) continue;
    if (p->name() == "torch") started[0] = 1;
    if (p->name() == "mpi") started[1] = 1;
    if (p->name() == "probe") started[2] = started[3] = 1;
  }
  gloo.broadcast(started.data(), started.size(), comm::DataType::Int32, 0);
  for (size_t k = 0; k < peerRows.size(); ++k) {
    if (!started[k]) continue;
    const std::string row = peerRows[k];
    const std::string process = row == "probe-cp" ? "probe" : row;
    const std::string mode = row == "probe-cp" ? "copy" : row == "probe" ? "owned" : "";
    contenders.push_back(
        {row, true, [&cfg, &peers, process, mode](size_t bytes, int warmup) -> std::optional<Row> {
           for (auto& p : peers) {
             if (!p || p->name() != process) continue;
             auto r = p->run(bytes, warmup, itersFor(bytes, cfg), std::chrono::seconds(300), mode);
             if (!r) return std::nullopt;
             return Row{r->medianUs, r->wrong};
           }
           return std::nullopt;
         }});
  }
}

void printHeader(const Config& cfg, int world, const std::vector<std::string>& names) {
  std::printf("# allreduce_bench: world %d%s, %s %s, warmup %d, iters %d (%d up to 256 KiB), "
              "%d rounds, interleaved; time = median of the rounds' medians on rank 0\n",
              world, cfg.nodes > 1 ? fmt::format(" on {} pretend nodes", cfg.nodes).c_str() : "",
              comm::dataTypeName(cfg.dtype), comm::reduceOpName(cfg.op), cfg.warmup, cfg.iters,
              std::max(cfg.iters, cfg.smallIters), cfg.rounds);
  std::printf("# busbw GB/s of: %s; memcpy GB/s; ratios of busbw\n",
              fmt::format("{}", fmt::join(names, ", ")).c_str());
  std::string head = fmt::format("{:>10} {:>10} {:>8} {:>4} {:>10} {:>10} |", "size", "count",
                                 "dtype", "op", "shm_us", "shm-own_us");
  for (const auto& n : names) head += fmt::format(" {:>8}", n);
  head += fmt::format(" {:>7} | {:>9} {:>12} {:>7} {:>7} {:>8} {:>9} {:>12} | {:>6}", "memcpy",
                      "own/probe", "shm/probe-cp", "own/mpi", "shm/mpi", "shm/c10d", "gloo/c10d",
                      "probe/memcpy", "#wrong");
  std::printf("%s\n", head.c_str());
  std::fflush(stdout);
}

// One size's times: every contender's round medians (µs), by name.
using RoundTimes = std::map<std::string, std::vector<double>>;

// Every contender in turn, --rounds times; peers run on rank 0 while the other ranks wait.
// Returns the wrong elements this rank saw.
long measureSize(size_t bytes, const Config& cfg, int rank, std::vector<Contender>& contenders,
                 comm::Communicator& gloo, RoundTimes& rounds) {
  long wrong = 0;
  for (int round = 0; round < cfg.rounds; ++round) {
    const int warmup = round == 0 ? cfg.warmup : 1;
    for (auto& c : contenders) {
      if (!c.peer) {
        Row r = *c.measure(bytes, warmup);
        rounds[c.name].push_back(r.us);
        wrong += r.wrong;
        continue;
      }
      // The other ranks wait here while rank 0 drives the peer.
      if (rank == 0) {
        if (auto r = c.measure(bytes, warmup)) {
          rounds[c.name].push_back(r->us);
          wrong += r->wrong;
        }
      }
      gloo.barrier();
    }
  }
  return wrong;
}

void printRow(size_t bytes, const Config& cfg, int world, const std::vector<std::string>& names,
              RoundTimes& rounds, long wrong) {
  const double busFactor = world > 1 ? 2.0 * (world - 1) / world : 1.0;
  const double copyUs = memcpyMedianUs(bytes, std::max(itersFor(bytes, cfg), 3));
  auto busbw = [&](const std::string& n) {
    auto it = rounds.find(n);
    if (it == rounds.end() || it->second.empty()) return 0.0;
    return bytes / median(it->second) / 1e3 * busFactor;
  };
  auto ratio = [&](const std::string& a, const std::string& b) -> std::string {
    const double x = busbw(a), y = busbw(b);
    return x > 0 && y > 0 ? fmt::format("{:.2f}", x / y) : "-";
  };
  const bool hasProbe = std::find(names.begin(), names.end(), "probe") != names.end();
  std::string line = fmt::format("{:>10} {:>10} {:>8} {:>4} {:>10.1f} {:>10.1f} |", bytes,
                                 bytes / comm::elementSize(cfg.dtype),
                                 comm::dataTypeName(cfg.dtype), comm::reduceOpName(cfg.op),
                                 median(rounds["shm"]), median(rounds["shm-own"]));
  for (const auto& n : names) {
    const double b = busbw(n);
    line += b > 0 ? fmt::format(" {:>8.3f}", b) : fmt::format(" {:>8}", "-");
  }
  const double memcpyGBs = bytes / copyUs / 1e3;
  const double probeAlgbw = busbw("probe") / busFactor;
  line += fmt::format(
      " {:>7.2f} | {:>9} {:>12} {:>7} {:>7} {:>8} {:>9} {:>12} | {:>6}", memcpyGBs,
      ratio("shm-own", "probe"), ratio("shm", "probe-cp"), ratio("shm-own", "mpi"),
      ratio("shm", "mpi"), ratio("shm", "c10d"), ratio("gloo", "c10d"),
      hasProbe && probeAlgbw > 0 ? fmt::format("{:.2f}", probeAlgbw / memcpyGBs) : "-", wrong);
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

int runWorker(const Config& cfg) {
  const int rank = envInt(env::kRank, 0);
  const int world = envInt(env::kWorldSize, 1);
  auto store = store::connectToJobStore();
  if (cfg.backend == "nccl") return runNccl(cfg, rank, world, store);
  const size_t maxBytes = *std::max_element(cfg.sizes.begin(), cfg.sizes.end());

  // Every buffer is touched once before anything is timed.
  std::vector<char> user(maxBytes + 64, 0);
  Communicators communicators = openCommunicators(cfg, rank, world, store, maxBytes);
  std::vector<Contender> contenders;
  addDtrainContenders(contenders, cfg, communicators, user.data());
  // PyTorch's C++ Gloo process group, run by these same ranks (collective, like dtrain's).
  std::unique_ptr<C10dPeer> c10d;
  if (cfg.c10d) c10d = C10dPeer::start(*store, rank, world, cfg.dtype, cfg.op, maxBytes);
  if (c10d) {
    contenders.push_back({"c10d", false, [&cfg, &c10d](size_t bytes, int warmup) {
                            auto r = c10d->run(bytes, warmup, itersFor(bytes, cfg));
                            return std::optional<Row>(Row{r.medianUs, r.wrong});
                          }});
  }
  std::vector<std::unique_ptr<PeerProcess>> peers;
  if (rank == 0) peers = startPeers(cfg, world, maxBytes);
  addPeerContenders(contenders, cfg, peers, *communicators.gloo);

  std::vector<std::string> names;
  for (const auto& c : contenders) names.push_back(c.name);
  if (rank == 0) printHeader(cfg, world, names);
  long totalWrong = 0;
  for (size_t bytes : cfg.sizes) {
    RoundTimes rounds;
    const long wrong = measureSize(bytes, cfg, rank, contenders, *communicators.gloo, rounds);
    totalWrong += wrong;
    if (rank == 0) printRow(bytes, cfg, world, names, rounds, wrong);
  }
  peers.clear();
  c10d.reset();
  communicators.shutdown();
  return totalWrong == 0 ? 0 : 1;
}

// Without launch: fork one process per rank, then host the store here. The ranks are forked
// first, while this process has one thread: a child forked beside the store's event-loop thread
// could inherit a lock that thread held (it did hang once in the handshake); the ranks' clients
// retry until the store is up.
int forkWorld(const Config& cfg) {
  const int port = freeLoopbackPort();
  DTRAIN_CHECK(port > 0, "allreduce_bench: no free loopback port for the store");
  std::vector<pid_t> children;
  for (int r = 0; r < cfg.world; ++r) {
    std::fflush(nullptr);
    pid_t pid = fork();
    if (pid == 0) {
      setenv(env::kRank, std::to_string(r).c_str(), 1);
      setenv(env::kLocalRank, std::to_string(r).c_str(), 1);
      setenv(env::kWorldSize, std::to_string(cfg.world).c_str(), 1);
      setenv(env::kLocalWorldSize, std::to_string(cfg.world).c_str(), 1);
      setenv(env::kStoreAddr, "127.0.0.1", 1);
      setenv(env::kStorePort, std::to_string(port).c_str(), 1);
      setenv(env::kDtrainRestartCount, "0", 1);
      int code = 1;
      try {
        code = runWorker(cfg);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "allreduce_bench rank %d: %s\n", r, e.what());
      }
      std::fflush(nullptr);
      _exit(code);  // never run the parent's destructors in a child
    }
    children.push_back(pid);
  }
  store::TcpStoreServerOptions so;
  so.host = "127.0.0.1";
  so.port = static_cast<uint16_t>(port);
  auto server = store::TcpStoreServer::start(so);
  int worst = 0;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    worst = std::max(worst, code);
  }
  server->stop();
  return worst;
}

}  // namespace
}  // namespace dtrain::bench

int main(int argc, char** argv) {
  using namespace dtrain::bench;
  try {
    const CommandLine line = parseCommandLine(argc, argv);
    if (!line.help.empty()) {
      std::cout << line.help << "\n";
      return 0;
    }
    if (std::getenv(dtrain::env::kRank) != nullptr) return runWorker(line.config);
    return forkWorld(line.config);
  } catch (const cxxopts::exceptions::exception& e) {
    std::cerr << "allreduce_bench: " << e.what() << "\n";
    return 2;
  } catch (const dtrain::InvalidArgument& e) {
    std::cerr << "allreduce_bench: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "allreduce_bench: " << e.what() << "\n";
    return 1;
  }
}
