#pragma once
// allreduce_bench's command line: Config, what a run measures, and its parser (see
// allreduce_bench.cpp's header for the options).

#include <cstddef>
#include <string>
#include <vector>

#include "dtrain/comm/communicator.h"
#include "dtrain/comm/gloo_communicator.h"
#include "dtrain/comm/shm_communicator.h"

namespace dtrain::bench {

struct Config {
  int world = 2;
  std::vector<size_t> sizes;
  int warmup = 5;
  int iters = 20;
  comm::DataType dtype = comm::DataType::Float32;
  comm::ReduceOp op = comm::ReduceOp::Sum;
  std::string backend = "cpu";
  int nodes = 1;
  bool c10d = true;
  bool torch = true;
  bool mpi = true;
  bool probe = true;
  bool gloo = true;
  std::string python = DTRAIN_PYTHON;  // the build's (CMake's DTRAIN_PYTHON)
  std::string peerScript;
  std::string mpirun = "mpirun";
  std::string mpiPeer;
  std::string probeBinary;
  size_t smallAllreduceBytes = comm::kDefaultSmallAllreduceBytes;
  size_t ringSegmentBytes = comm::kDefaultRingSegmentBytes;
  size_t directChunkBytes = comm::kDefaultDirectChunkBytes;
  bool twoRankExchange = true;
  int smallIters = 200;  // sizes up to 256 KiB: more iterations, a steadier median
  int rounds = 3;        // every contender runs this many times per size, in turn
  int shmSpinUs = -1;    // ShmOptions::spin; negative: its default
  int shmYield = -1;     // ShmOptions::yieldSpin
  size_t shmSlotBytes = comm::kDefaultShmSlotBytes;
  size_t shmOwnedChunkBytes = comm::kDefaultShmOwnedChunkBytes;
  size_t shmSmallBytes = comm::kDefaultShmSmallBytes;
};

// Timed iterations of a size: more for the small ones (--small-iters).
int itersFor(size_t bytes, const Config& cfg);

struct CommandLine {
  Config config;
  std::string help;  // non-empty: --help was given; print it and run nothing
};

// Throws cxxopts' exceptions or InvalidArgument on a bad command line (exit 2).
CommandLine parseCommandLine(int argc, char** argv);

}  // namespace dtrain::bench
