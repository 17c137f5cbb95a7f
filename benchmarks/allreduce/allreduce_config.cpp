#include "allreduce_config.h"

#include <algorithm>
#include <string>

#include <cxxopts.hpp>

#include "dtrain/base/error.h"

namespace dtrain::bench {
namespace {

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
  for (auto o :
       {comm::ReduceOp::Sum, comm::ReduceOp::Avg, comm::ReduceOp::Max, comm::ReduceOp::Min}) {
    if (s == comm::reduceOpName(o)) return o;
  }
  DTRAIN_THROW(InvalidArgument, "--op: unknown reduction \"{}\"", s);
}

// "4K,64K,1M": sizes in bytes, with K, M, G (or KiB, MiB, GiB) units.
std::vector<size_t> parseSizes(const std::string& text) {
  std::vector<size_t> sizes;
  for (size_t at = 0; at < text.size();) {
    const size_t comma = text.find(',', at);
    sizes.push_back(
        parseSize(text.substr(at, comma == std::string::npos ? std::string::npos : comma - at)));
    at = comma == std::string::npos ? text.size() : comma + 1;
  }
  return sizes;
}

// Beside the benchmark's binary (the build tree), or on PATH.
std::string besideSelf(const char* argv0, const std::string& name) {
  std::string self = argv0;
  const size_t slash = self.rfind('/');
  return slash == std::string::npos ? name : self.substr(0, slash + 1) + name;
}

cxxopts::Options optionSpec() {
  cxxopts::Options options("allreduce_bench",
                           "dtrain's allreduce (shared memory, hierarchical, Gloo) beside "
                           "c10d::ProcessGroupGloo (C++), torch.distributed, Open MPI, a bare "
                           "probe and memcpy");
  // clang-format off
  options.add_options()
      ("world", "ranks to fork when not started by launch",
       cxxopts::value<int>()->default_value("2"))
      ("sizes", "comma-separated sizes (4K, 1M, ...)",
       cxxopts::value<std::string>()->default_value(""))
      ("warmup", "untimed iterations per size", cxxopts::value<int>()->default_value("5"))
      ("iters", "timed iterations per size", cxxopts::value<int>()->default_value("20"))
      ("dtype", "element type", cxxopts::value<std::string>()->default_value("float32"))
      ("op", "reduction", cxxopts::value<std::string>()->default_value("sum"))
      ("backend", "cpu (every CPU contender) or nccl (GPU mode)",
       cxxopts::value<std::string>()->default_value("cpu"))
      ("nodes", "also the hierarchical path, the ranks split into this many pretend nodes",
       cxxopts::value<int>()->default_value("1"))
      ("chunk-bytes", "Gloo's direct exchange chunk (bytes)",
       cxxopts::value<size_t>()->default_value(std::to_string(comm::kDefaultDirectChunkBytes)))
      ("two-rank-ring", "Gloo at two ranks: the ring above --small-bytes (tuning)")
      ("segment-bytes", "Gloo's ring allreduce segment (bytes)",
       cxxopts::value<size_t>()->default_value(std::to_string(comm::kDefaultRingSegmentBytes)))
      ("rounds", "every contender runs this many times per size, in turn",
       cxxopts::value<int>()->default_value("3"))
      ("small-iters", "timed iterations for sizes up to 256 KiB",
       cxxopts::value<int>()->default_value("200"))
      ("small-bytes", "Gloo's direct/ring allreduce crossover (bytes)",
       cxxopts::value<size_t>()->default_value(std::to_string(comm::kDefaultSmallAllreduceBytes)))
      ("shm-spin-us", "shared memory: how long a waiter spins before it sleeps (tuning)",
       cxxopts::value<int>()->default_value("-1"))
      ("shm-yield", "shared memory: spin with sched_yield (1), a pause (0), auto (-1) (tuning)",
       cxxopts::value<int>()->default_value("-1"))
      ("shm-slot-bytes", "shared memory: staging slot (tuning)",
       cxxopts::value<size_t>()->default_value(std::to_string(comm::kDefaultShmSlotBytes)))
      ("shm-owned-chunk-bytes", "shared memory: chunk of owned buffers (tuning)",
       cxxopts::value<size_t>()->default_value(std::to_string(comm::kDefaultShmOwnedChunkBytes)))
      ("shm-small-bytes", "shared memory: whole-buffer reduction up to this size (tuning)",
       cxxopts::value<size_t>()->default_value(std::to_string(comm::kDefaultShmSmallBytes)))
      ("no-peer", "no c10d, torch, mpi or probe")
      ("no-c10d", "skip the C++ c10d::ProcessGroupGloo peer")
      ("no-c10d-peer", "the same as --no-c10d")
      ("no-torch", "skip torch.distributed (Python)")
      ("no-python-peer", "the same as --no-torch")
      ("no-mpi", "skip Open MPI")
      ("no-probe", "skip the bare probe")
      ("no-gloo", "skip dtrain over Gloo")
      ("python", "python with torch for the torch peer",
       cxxopts::value<std::string>()->default_value(DTRAIN_PYTHON))
      ("peer-script", "the torch peer's script",
       cxxopts::value<std::string>()->default_value(DTRAIN_BENCH_SOURCE_DIR "/torch_peer.py"))
      ("mpirun", "Open MPI's mpirun", cxxopts::value<std::string>()->default_value("mpirun"))
      ("smoke", "a few small sizes and iterations (CTest)")
      ("h,help", "this help");
  // clang-format on
  return options;
}

Config configFrom(const cxxopts::ParseResult& args, const char* argv0) {
  Config cfg;
  cfg.world = args["world"].as<int>();
  cfg.warmup = args["warmup"].as<int>();
  cfg.iters = args["iters"].as<int>();
  cfg.dtype = parseDtype(args["dtype"].as<std::string>());
  cfg.op = parseOp(args["op"].as<std::string>());
  cfg.backend = args["backend"].as<std::string>();
  cfg.nodes = args["nodes"].as<int>();
  const bool noPeer = args.count("no-peer") > 0;
  cfg.c10d = !noPeer && !args.count("no-c10d") && !args.count("no-c10d-peer");
  cfg.torch = !noPeer && !args.count("no-torch") && !args.count("no-python-peer");
  cfg.mpi = !noPeer && !args.count("no-mpi");
  cfg.probe = !noPeer && !args.count("no-probe");
  cfg.gloo = !args.count("no-gloo");
  cfg.python = args["python"].as<std::string>();
  cfg.peerScript = args["peer-script"].as<std::string>();
  cfg.mpirun = args["mpirun"].as<std::string>();
  cfg.mpiPeer = besideSelf(argv0, "mpi_peer");
  cfg.probeBinary = besideSelf(argv0, "shm_probe");
  cfg.smallAllreduceBytes = args["small-bytes"].as<size_t>();
  cfg.ringSegmentBytes = args["segment-bytes"].as<size_t>();
  cfg.directChunkBytes = args["chunk-bytes"].as<size_t>();
  cfg.twoRankExchange = !args.count("two-rank-ring");
  cfg.smallIters = args["small-iters"].as<int>();
  cfg.rounds = std::max(1, args["rounds"].as<int>());
  cfg.shmSpinUs = args["shm-spin-us"].as<int>();
  cfg.shmYield = args["shm-yield"].as<int>();
  cfg.shmSlotBytes = args["shm-slot-bytes"].as<size_t>();
  cfg.shmOwnedChunkBytes = args["shm-owned-chunk-bytes"].as<size_t>();
  cfg.shmSmallBytes = args["shm-small-bytes"].as<size_t>();
  std::string sizes = args["sizes"].as<std::string>();
  if (args.count("smoke")) {
    if (sizes.empty()) sizes = "4K,64K,1M";
    cfg.warmup = std::min(cfg.warmup, 2);
    cfg.iters = std::min(cfg.iters, 5);
    cfg.smallIters = std::min(cfg.smallIters, 20);
    cfg.rounds = 1;
  }
  if (sizes.empty()) sizes = "4K,16K,64K,256K,1M,4M,16M,64M,256M";
  cfg.sizes = parseSizes(sizes);
  DTRAIN_CHECK_ARG(cfg.backend == "cpu" || cfg.backend == "nccl", "--backend: cpu or nccl");
  DTRAIN_CHECK_ARG(cfg.world >= 1 && cfg.iters >= 1 && cfg.warmup >= 0, "--world/--iters/--warmup");
  DTRAIN_CHECK_ARG(cfg.nodes >= 1, "--nodes must be at least 1");
  return cfg;
}

}  // namespace

int itersFor(size_t bytes, const Config& cfg) {
  return bytes <= (256u << 10) ? std::max(cfg.iters, cfg.smallIters) : cfg.iters;
}

CommandLine parseCommandLine(int argc, char** argv) {
  cxxopts::Options options = optionSpec();
  const auto args = options.parse(argc, argv);
  CommandLine line;
  if (args.count("help")) line.help = options.help();
  else line.config = configFrom(args, argv[0]);
  return line;
}

}  // namespace dtrain::bench
