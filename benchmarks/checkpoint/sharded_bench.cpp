// checkpoint_bench --sharded: a save or a load job of dtrain's sharded checkpoints at stage 3,
// beside dcp_peer.py's FSDP2 + DCP (dcp_bench.py runs both and prints the table).
//
// Why stage 3: FSDP2 + DCP keeps every rank's part of the parameters and of Adam's moments and
// writes that part from the rank that holds it, never gathering the model; a restore at another
// world size re-shards both. A stage-3 ShardedOptimizer's checkpoint is the same thing: the
// units' parameters and the optimizer state as each rank's shard records, re-sharded by
// restore() onto any number of ranks. At stages 1 and 2 the parameters are whole on every rank
// and go into the file whole, a different job. Each Linear layer is a unit sharded as built
// (fullyShard), as fully_shard per layer is; the root holds no parameters of its own on either
// side.
#include "sharded_bench.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "dtrain/dtrain.h"

namespace dtrain::bench {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kModelSeed = 0;   // the save job's model
constexpr uint64_t kOtherSeed = 1;   // the load job's: restore must overwrite every value
constexpr uint64_t kDataSeed = 100;  // + rank; + 1000 for the step that moves away from the save
constexpr int64_t kFingerprintMul = 2654435761;

torch::nn::Sequential buildModel(const ShardedConfig& c, const ProcessGroup& group, uint64_t seed) {
  torch::manual_seed(seed);  // every rank alike: fullyShard needs the same values everywhere
  torch::nn::Sequential net;
  for (int l = 0; l < c.layers; ++l) {
    const int64_t in = l == 0 ? c.io : c.width;
    const int64_t out = l + 1 == c.layers ? c.io : c.width;
    net->push_back(fullyShard(torch::nn::Linear(in, out), group));
    if (l + 1 < c.layers) net->push_back(torch::nn::ReLU());
  }
  return net;
}

void trainStep(const ShardedConfig& c, DistributedDataParallel<torch::nn::Sequential>& ddp,
               ShardedOptimizer& optimizer, uint64_t seed) {
  torch::manual_seed(seed);
  const auto x = torch::randn({c.batch, c.io});
  const auto y = torch::randn({c.batch, c.io});
  optimizer.zero_grad();
  torch::mse_loss(ddp(x), y).backward();
  optimizer.step();
}

// Note [Parameter fingerprint]
// The restore check compares the parameters after restore() with those saved, bitwise, without
// a second copy of the model on disk: sum of bits_i * (i * kFingerprintMul + 1) over a float32
// tensor's bits, modulo 2^64 (int64 arithmetic wraps). The weights are odd, so a change of any
// one element changes the sum; integer sums do not depend on the order of the reduction.
// dcp_peer.py computes the same for its side.
int64_t fingerprint(const torch::Tensor& t) {
  const auto bits = t.contiguous().view(torch::kInt).flatten().to(torch::kLong);
  const auto weights = torch::arange(bits.numel(), torch::kLong).mul_(kFingerprintMul).add_(1);
  return bits.mul(weights).sum().item<int64_t>();
}

// Every parameter in full, by name: the same on every rank. Collective.
std::map<std::string, int64_t> fingerprints(ShardedOptimizer& optimizer) {
  std::map<std::string, int64_t> out;
  for (const auto& [name, t] : gatherFullParameters(optimizer)) out[name] = fingerprint(t);
  return out;
}

// Seconds on rank 0 from every rank's start to every rank's end.
template <typename Fn>
double timed(ProcessGroup& group, Fn&& fn) {
  group.barrier();
  const auto start = Clock::now();
  fn();
  group.barrier();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Note [Page cache before a load]
// A load's time depends on whether the file's pages are in the page cache, and the two sides
// leave it differently: dtrain's synchronous save writes its bulk with O_DIRECT (Note [Staged
// direct writes], file_io.cpp), none of it cached, DCP's buffered writes leave it all cached.
// So each job loads twice, the page cache set the same way on both sides first: "cold", every
// file of the directory fsynced and dropped from it (posix_fadvise(DONTNEED), no root needed:
// what a restore after a restart on another machine or much later sees), then "warm", every
// file read once (a restore right after the save on the same machine). dcp_peer.py does the
// same. One node: local rank 0 prepares, the others wait at the timed load's first barrier.
void prepareCache(const std::string& dir, bool warm) {
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir)) {
    if (!f.is_regular_file()) continue;
    if (warm) {
      readIntoCache(f.path().string());
    } else {
      dropFromCache(f.path().string());
    }
  }
}

}  // namespace

void dropFromCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  DTRAIN_CHECK(fd >= 0, "cannot open {}", path);
  ::fsync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void readIntoCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  DTRAIN_CHECK(fd >= 0, "cannot open {}", path);
  std::vector<char> buffer(size_t{4} << 20);
  while (::read(fd, buffer.data(), buffer.size()) > 0) {
  }
  ::close(fd);
}

ShardedConfig parseShardedArgs(int argc, char** argv) {
  ShardedConfig c;
  for (int i = 0; i < argc; ++i) {
    const std::string f = argv[i];
    auto next = [&]() -> std::string {
      DTRAIN_CHECK_ARG(i + 1 < argc, "{} needs a value", f);
      return argv[++i];
    };
    if (f == "--job") c.job = next();
    else if (f == "--dir") c.dir = next();
    else if (f == "--reference") c.reference = next();
    else if (f == "--result") c.result = next();
    else if (f == "--io") c.io = std::stoll(next());
    else if (f == "--width") c.width = std::stoll(next());
    else if (f == "--layers") c.layers = std::stoi(next());
    else if (f == "--batch") c.batch = std::stoi(next());
    else DTRAIN_THROW(InvalidArgument, "--sharded: unknown flag {} (see --help)", f);
  }
  DTRAIN_CHECK_ARG(c.job == "save" || c.job == "load",
                   "--sharded needs --job save|load, got \"{}\"", c.job);
  DTRAIN_CHECK_ARG(!c.dir.empty() && !c.reference.empty() && !c.result.empty(),
                   "--sharded needs --dir, --reference and --result");
  DTRAIN_CHECK_ARG(c.io > 0 && c.width > 0 && c.layers >= 2 && c.batch > 0,
                   "--sharded: sizes must be positive and --layers at least 2");
  return c;
}

int runShardedJob(const ShardedConfig& c) {
  torch::set_num_threads(1);
  auto group = init();
  const int rank = group->rank();
  const bool saving = c.job == "save";
  auto net = buildModel(c, *group, saving ? kModelSeed : kOtherSeed);
  DistributedDataParallel<torch::nn::Sequential> ddp(net, group);
  ZeroOptions zo;
  zo.stage = 3;
  ShardedOptimizer optimizer(
      ddp, optimizerFactory<torch::optim::Adam>(torch::optim::AdamOptions(1e-3)), zo);
  trainStep(c, ddp, optimizer, kDataSeed + rank);  // Adam's moments exist from here on

  CheckpointOptions options(c.dir);
  options.handlePreemption = false;
  options.allowWorldSizeChange = true;
  Checkpointer checkpointer(group, options);
  checkpointer.addModule("model", net);
  checkpointer.addOptimizer("adam", optimizer);

  nlohmann::json result = {{"world", group->size()}};
  std::map<std::string, int64_t> saved;
  if (saving) {
    result["save_s"] = timed(*group, [&] { checkpointer.save(1); });
    saved = fingerprints(optimizer);
    if (rank == 0) std::ofstream(c.reference) << nlohmann::json(saved).dump() << "\n";
    trainStep(c, ddp, optimizer, kDataSeed + 1000 + rank);
  } else {
    saved = nlohmann::json::parse(std::ifstream(c.reference)).get<std::map<std::string, int64_t>>();
  }
  // See Note [Page cache before a load].
  const bool preparer = group->localRank() == 0;
  bool checked = true;
  for (const bool warm : {false, true}) {
    if (preparer) prepareCache(c.dir, warm);
    std::optional<RestoredCheckpoint> restored;
    result[warm ? "load_warm_s" : "load_cold_s"] = timed(
        *group, [&] { restored = checkpointer.restore(); });
    DTRAIN_CHECK(restored.has_value(), "rank {}: no checkpoint to restore in {}", rank, c.dir);
    result["saved_world"] = restored->savedWorldSize;
    checked = fingerprints(optimizer) == saved && checked;
  }
  result["check"] = checked;
  if (rank == 0) std::ofstream(c.result) << result.dump() << "\n";
  group->barrier();
  group->shutdown();
  return 0;
}

}  // namespace dtrain::bench
