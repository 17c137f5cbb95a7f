#pragma once
// checkpoint_bench --sharded: one job of dcp_bench.py's comparison of dtrain's sharded
// checkpoints (a stage-3 ShardedOptimizer in the Checkpointer) with PyTorch's DCP over FSDP2
// (dcp_peer.py, the same jobs). Run under `launch`; rank 0 writes the result as JSON.
//
//   launch --nproc-per-node R checkpoint_bench --sharded --job save|load --dir D
//          --reference F --result F [--io N] [--width N] [--layers N] [--batch N]

#include <cstdint>
#include <string>

namespace dtrain::bench {

// The model: Linear layers io -> width -> ... -> width -> io with ReLU between, each a unit
// sharded as built. 58.7M parameters (235 MB of float32) at the defaults.
constexpr int64_t kShardedIo = 1024;
constexpr int64_t kShardedWidth = 4096;
constexpr int kShardedLayers = 5;
constexpr int kShardedBatch = 4;

struct ShardedConfig {
  // "save": build (seed 0), one Adam step, save (timed), fingerprint the parameters into
  // `reference`, one more step, then the loads. "load": build (seed 1), one step, then the loads
  // at this world size whatever the saved one. The loads: restore (timed) and check against
  // `reference`, twice, the page cache first emptied of the checkpoint, then filled with it
  // (Note [Page cache before a load], sharded_bench.cpp).
  std::string job;
  std::string dir;        // the checkpoint directory (CheckpointOptions::directory)
  std::string reference;  // the saved parameters' fingerprints (JSON)
  std::string result;     // rank 0's timings and check (JSON)
  int64_t io = kShardedIo;
  int64_t width = kShardedWidth;
  int layers = kShardedLayers;
  int batch = kShardedBatch;
};

// `path` fsynced and dropped from the page cache (posix_fadvise(DONTNEED), no root needed), or
// read once so that all of it is there.
void dropFromCache(const std::string& path);
void readIntoCache(const std::string& path);

// Parses the arguments after --sharded; throws InvalidArgument naming what was wrong.
ShardedConfig parseShardedArgs(int argc, char** argv);

// Runs the job in this process (rank, world and store from launch's environment). A failed
// restore check is a result (`"check": false` in the JSON, for the driver to judge), not an error.
int runShardedJob(const ShardedConfig& config);

}  // namespace dtrain::bench
