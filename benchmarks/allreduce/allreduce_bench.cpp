// allreduce_bench: dtrain's allreduce in nccl-tests' format, beside PyTorch's
// torch.distributed.all_reduce (gloo) and a single-thread memcpy, measured in the same run,
// interleaved size by size so all three see the same machine load.
//
//   launch --nproc-per-node 2 allreduce_bench [options]     one rank per process, from launch
//   allreduce_bench --world 2 [options]                      forks the ranks itself
//
// Options: --sizes 4K,64K,... (default 4 KiB..256 MiB by 4x), --warmup N, --iters N,
// --dtype float32|float64|float16|bfloat16|int32|int64, --op sum|avg|max|min, --no-peer,
// --rounds N (ours and the peer alternate N times per size, default 3), --small-iters N
// (iterations for sizes up to 256 KiB, default 200), --segment-bytes N, --chunk-bytes N,
// --small-bytes N and --two-rank-ring (algorithm tuning), --python PATH, --smoke (three small
// sizes, few iterations: the CTest).
//
// Columns: size count dtype op time_us algbw busbw #wrong (busbw = algbw * 2(n-1)/n), then the
// peer's time and busbw, ours/theirs busbw, and memcpy GB/s. For each size ours and the peer
// alternate --rounds times (default 3); a time is the median of the rounds' medians of rank 0's
// per-iteration times. #wrong counts elements that differ from the closed form (rank r
// contributes r + i % 5) after one checked allreduce.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <cxxopts.hpp>
#include <fmt/format.h>

#include "bench_buffers.h"
#include "dtrain/comm.h"
#include "dtrain/env_contract.h"
#include "dtrain/error.h"
#include "dtrain/gloo_communicator.h"
#include "dtrain/job_store.h"
#include "dtrain/nccl_communicator.h"
#include "dtrain/shm_communicator.h"
#include "dtrain/tcp_store.h"
#include "torch_peer.h"

namespace dtrain::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  int world = 2;
  std::vector<size_t> sizes;
  int warmup = 5;
  int iters = 20;
  comm::DataType dtype = comm::DataType::Float32;
  comm::ReduceOp op = comm::ReduceOp::Sum;
  std::string backend = "gloo";
  bool peer = true;
  std::string python = "/usr/bin/python3";
  std::string peerScript;
  size_t smallAllreduceBytes = comm::kDefaultSmallAllreduceBytes;
  size_t ringSegmentBytes = comm::kDefaultRingSegmentBytes;
  size_t directChunkBytes = comm::kDefaultDirectChunkBytes;
  bool twoRankExchange = true;
  int smallIters = 200;  // sizes up to 256 KiB: more iterations, a steadier median
  int rounds = 3;        // ours and the peer alternate this many times per size
};

size_t parseSize(const std::string& text) {
  size_t end = 0;
  double v = std::stod(text, &end);
  std::string unit = text.substr(end);
  double mult = 1;
  if (unit == "K" || unit == "KiB") mult = 1024;
  else if (unit == "M" || unit == "MiB") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB") mult = 1024.0 * 1024 * 1024;
  else if (!unit.empty()) DTRAIN_THROW(InvalidArgument, "--sizes: bad size \"{}\"", text);
  return static_cast<size_t>(v * mult);
}

comm::DataType parseDtype(const std::string& s) {
  for (auto d : {comm::DataType::Float32, comm::DataType::Float64, comm::DataType::Float16,
                 comm::DataType::BFloat16, comm::DataType::Int32, comm::DataType::Int64}) {
    if (s == comm::dataTypeName(d)) return d;
  }
  DTRAIN_THROW(InvalidArgument, "--dtype: unknown type \"{}\"", s);
}

comm::ReduceOp parseOp(const std::string& s) {
  for (auto o : {comm::ReduceOp::Sum, comm::ReduceOp::Avg, comm::ReduceOp::Max,
                 comm::ReduceOp::Min}) {
    if (s == comm::reduceOpName(o)) return o;
  }
  DTRAIN_THROW(InvalidArgument, "--op: unknown reduction \"{}\"", s);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

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

int itersFor(size_t bytes, const Config& cfg) {
  return bytes <= (256u << 10) ? std::max(cfg.iters, cfg.smallIters) : cfg.iters;
}

Row measureOurs(comm::Communicator& c, BenchBuffers& buf, size_t bytes, const Config& cfg,
               int warmup) {
  const size_t count = bytes / comm::elementSize(cfg.dtype);
  buf.fillContribution(c.rank(), count);
  c.allreduce(buf.data(), count, cfg.dtype, cfg.op);
  Row row;
  row.wrong = buf.countWrong(count, c.size(), cfg.op);
  for (int i = 0; i < warmup; ++i) c.allreduce(buf.data(), count, cfg.dtype, cfg.op);
  buf.synchronize();
  c.barrier();
  std::vector<double> times;
  for (int i = 0; i < itersFor(bytes, cfg); ++i) {
    auto t0 = Clock::now();
    c.allreduce(buf.data(), count, cfg.dtype, cfg.op);
    buf.synchronize();
    times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  row.us = median(times);
  return row;
}

int envInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

std::shared_ptr<comm::Communicator> makeCommunicator(const Config& cfg, int rank, int world) {
  auto store = store::connectToJobStore();
  const char* host = std::getenv(env::kStoreAddr);
  if (cfg.backend == "nccl") {
    comm::NcclOptions o;
    o.rank = rank;
    o.size = world;
    o.store = store;
    o.device = envInt(env::kLocalRank, 0);
    o.name = "allreduce_bench";
    return comm::createNcclCommunicator(o);
  }
  if (cfg.backend == "shm") {
    comm::ShmOptions so;
    so.rank = rank;
    so.size = world;
    so.store = store;
    so.name = "allreduce_bench";
    return comm::createShmCommunicator(so);
  }
  comm::GlooOptions o;
  o.rank = rank;
  o.size = world;
  o.store = store;
  o.storeHost = host ? host : "";
  o.name = "allreduce_bench";
  o.smallAllreduceBytes = cfg.smallAllreduceBytes;
  o.ringSegmentBytes = cfg.ringSegmentBytes;
  o.directChunkBytes = cfg.directChunkBytes;
  o.twoRankExchange = cfg.twoRankExchange;
  return comm::createGlooCommunicator(o);
}

int runWorker(const Config& cfg) {
  const int rank = envInt(env::kRank, 0);
  const int world = envInt(env::kWorldSize, 1);
  auto c = makeCommunicator(cfg, rank, world);
  std::unique_ptr<TorchPeer> peer;
  if (rank == 0 && cfg.peer && cfg.backend == "gloo") {
    peer = TorchPeer::start(cfg.python, cfg.peerScript, world, comm::dataTypeName(cfg.dtype));
  }
  const double busFactor = world > 1 ? 2.0 * (world - 1) / world : 1.0;
  if (rank == 0) {
    std::printf("# allreduce_bench: %s, world %d, %s %s, warmup %d, iters %d (%d up to 256 KiB), "
                "%d rounds; median of the rounds' medians, rank 0\n",
                cfg.backend.c_str(), world, comm::dataTypeName(cfg.dtype),
                comm::reduceOpName(cfg.op), cfg.warmup, cfg.iters,
                std::max(cfg.iters, cfg.smallIters), cfg.rounds);
    std::printf("# peer: %s\n", peer ? "torch.distributed.all_reduce (gloo), same sizes, interleaved"
                                     : "none");
    std::printf("%10s %11s %8s %4s %10s %7s %7s %6s | %10s %7s %6s | %7s\n", "size", "count",
                "dtype", "op", "time_us", "algbw", "busbw", "#wrong", "torch_us", "busbw",
                "ratio", "memcpy");
    std::printf("%10s %11s %8s %4s %10s %7s %7s %6s | %10s %7s %6s | %7s\n", "(B)", "(elements)",
                "", "", "", "(GB/s)", "(GB/s)", "", "", "(GB/s)", "", "(GB/s)");
    std::fflush(stdout);
  }
  long totalWrong = 0;
  size_t maxBytes = *std::max_element(cfg.sizes.begin(), cfg.sizes.end());
  auto buf = BenchBuffers::create(*c, maxBytes, cfg.dtype);
  for (size_t bytes : cfg.sizes) {
    // Ours and theirs alternate --rounds times, so a burst of load from elsewhere hits both.
    std::vector<double> ourRounds;
    std::vector<double> theirRounds;
    long peerWrong = 0;
    long ourWrong = 0;
    for (int round = 0; round < cfg.rounds; ++round) {
      Row ours = measureOurs(*c, *buf, bytes, cfg, round == 0 ? cfg.warmup : 1);
      ourRounds.push_back(ours.us);
      ourWrong += ours.wrong;
      // The other ranks wait here while rank 0 drives the peer.
      if (rank == 0 && peer) {
        auto theirs = peer->run(bytes, round == 0 ? cfg.warmup : 1, itersFor(bytes, cfg),
                                std::chrono::seconds(300));
        if (theirs) {
          theirRounds.push_back(theirs->medianUs);
          peerWrong += theirs->wrong;
        }
      }
      c->barrier();
    }
    totalWrong += ourWrong + peerWrong;
    if (rank != 0) continue;
    const double copyUs = memcpyMedianUs(bytes, std::max(itersFor(bytes, cfg), 3));
    const double ourUs = median(ourRounds);
    const double algbw = bytes / ourUs / 1e3;
    std::string peerCols = fmt::format("{:>10} {:>7} {:>6}", "-", "-", "-");
    if (!theirRounds.empty()) {
      const double theirUs = median(theirRounds);
      const double theirBus = bytes / theirUs / 1e3 * busFactor;
      peerCols = fmt::format("{:>10.1f} {:>7.3f} {:>6.2f}", theirUs, theirBus,
                             algbw * busFactor / theirBus);
    }
    std::printf("%10zu %11zu %8s %4s %10.1f %7.3f %7.3f %6ld | %s | %7.2f\n", bytes,
                bytes / comm::elementSize(cfg.dtype), comm::dataTypeName(cfg.dtype),
                comm::reduceOpName(cfg.op), ourUs, algbw, algbw * busFactor, ourWrong + peerWrong,
                peerCols.c_str(), bytes / copyUs / 1e3);
    std::fflush(stdout);
  }
  peer.reset();
  c->shutdown();
  return totalWrong == 0 ? 0 : 1;
}

// Without launch: host the store here and fork one process per rank.
int forkWorld(const Config& cfg) {
  store::TcpStoreServerOptions so;
  so.host = "127.0.0.1";
  auto server = store::TcpStoreServer::start(so);
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
      setenv(env::kStorePort, std::to_string(server->port()).c_str(), 1);
      setenv(env::kDtrainRestartCount, "0", 1);
      int code = 1;
      try {
        code = runWorker(cfg);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "allreduce_bench rank %d: %s\n", r, e.what());
      }
      std::fflush(nullptr);
      _exit(code);  // never run the parent's destructors (the store server) in a child
    }
    children.push_back(pid);
  }
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

std::string defaultPeerScript(const char* argv0) {
  // Beside the binary's source: the build tree knows where the sources are.
  (void)argv0;
  return DTRAIN_BENCH_SOURCE_DIR "/torch_peer.py";
}

}  // namespace
}  // namespace dtrain::bench

int main(int argc, char** argv) {
  using namespace dtrain::bench;
  cxxopts::Options options("allreduce_bench", "dtrain allreduce vs torch.distributed (gloo)");
  options.add_options()
      ("world", "ranks to fork when not started by launch", cxxopts::value<int>()->default_value("2"))
      ("sizes", "comma-separated sizes (4K, 1M, ...)", cxxopts::value<std::string>()->default_value(""))
      ("warmup", "untimed iterations per size", cxxopts::value<int>()->default_value("5"))
      ("iters", "timed iterations per size", cxxopts::value<int>()->default_value("20"))
      ("dtype", "element type", cxxopts::value<std::string>()->default_value("float32"))
      ("op", "reduction", cxxopts::value<std::string>()->default_value("sum"))
      ("backend", "gloo or nccl", cxxopts::value<std::string>()->default_value("gloo"))
      ("chunk-bytes", "direct exchange chunk (bytes)",
       cxxopts::value<size_t>()->default_value(std::to_string(dtrain::comm::kDefaultDirectChunkBytes)))
      ("two-rank-ring", "at two ranks use the ring above --small-bytes (tuning)")
      ("segment-bytes", "ring allreduce segment (bytes)",
       cxxopts::value<size_t>()->default_value(std::to_string(dtrain::comm::kDefaultRingSegmentBytes)))
      ("rounds", "ours and the peer alternate this many times per size",
       cxxopts::value<int>()->default_value("3"))
      ("small-iters", "timed iterations for sizes up to 256 KiB",
       cxxopts::value<int>()->default_value("200"))
      ("small-bytes", "direct/ring allreduce crossover (bytes)",
       cxxopts::value<size_t>()->default_value(std::to_string(dtrain::comm::kDefaultSmallAllreduceBytes)))
      ("no-peer", "skip the PyTorch peer")
      ("python", "python with torch for the peer", cxxopts::value<std::string>()->default_value("/usr/bin/python3"))
      ("peer-script", "the peer's script", cxxopts::value<std::string>()->default_value(defaultPeerScript(argv[0])))
      ("smoke", "a few small sizes and iterations (CTest)")
      ("h,help", "this help");
  try {
    auto args = options.parse(argc, argv);
    if (args.count("help")) {
      std::cout << options.help() << "\n";
      return 0;
    }
    Config cfg;
    cfg.world = args["world"].as<int>();
    cfg.warmup = args["warmup"].as<int>();
    cfg.iters = args["iters"].as<int>();
    cfg.dtype = parseDtype(args["dtype"].as<std::string>());
    cfg.op = parseOp(args["op"].as<std::string>());
    cfg.backend = args["backend"].as<std::string>();
    cfg.peer = !args.count("no-peer");
    cfg.python = args["python"].as<std::string>();
    cfg.peerScript = args["peer-script"].as<std::string>();
    cfg.smallAllreduceBytes = args["small-bytes"].as<size_t>();
    cfg.ringSegmentBytes = args["segment-bytes"].as<size_t>();
    cfg.directChunkBytes = args["chunk-bytes"].as<size_t>();
    cfg.twoRankExchange = !args.count("two-rank-ring");
    cfg.smallIters = args["small-iters"].as<int>();
    cfg.rounds = std::max(1, args["rounds"].as<int>());
    std::string sizes = args["sizes"].as<std::string>();
    if (args.count("smoke")) {
      if (sizes.empty()) sizes = "4K,64K,1M";
      cfg.warmup = std::min(cfg.warmup, 2);
      cfg.iters = std::min(cfg.iters, 5);
      cfg.smallIters = std::min(cfg.smallIters, 20);
      cfg.rounds = 1;
    }
    if (sizes.empty()) sizes = "4K,16K,64K,256K,1M,4M,16M,64M,256M";
    for (size_t at = 0; at < sizes.size();) {
      size_t comma = sizes.find(',', at);
      cfg.sizes.push_back(parseSize(sizes.substr(at, comma == std::string::npos ? std::string::npos : comma - at)));
      at = comma == std::string::npos ? sizes.size() : comma + 1;
    }
    DTRAIN_CHECK_ARG(cfg.backend == "gloo" || cfg.backend == "nccl" || cfg.backend == "shm", "--backend: gloo, shm or nccl");
    DTRAIN_CHECK_ARG(cfg.world >= 1 && cfg.iters >= 1 && cfg.warmup >= 0, "--world/--iters/--warmup");
    if (std::getenv(dtrain::env::kRank) != nullptr) return runWorker(cfg);
    return forkWorld(cfg);
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
