// Checkpoint entries read back into the objects a Checkpointer was given (Note [Checkpoint
// entries] in state.cpp): every check before anything is overwritten, then the
// replicated state into the existing tensors, then each rank's own.
#include "state.h"

#include <algorithm>
#include <mutex>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/nn/module.h>
#include <torch/optim.h>

#include "../torch_compat.h"
#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "dtrain/config.h"
#include "dtrain/torch/distributed_sampler.h"
#include "dtrain/torch/grad_scaler.h"

#if DTRAIN_WITH_TORCH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace dtrain::checkpoint {

namespace {

// One entry, replicated: a CheckpointError naming it when absent or not of `kind`.
const Entry& single(const CheckpointReader& reader, const std::string& name, Kind kind) {
  for (const Entry* e : reader.find(name)) {
    if (e->owner != kReplicated) continue;
    DTRAIN_CHECK_T(CheckpointError, e->kind == kind && !e->isShard(),
                   "checkpoint {}: entry \"{}\" is a {}, expected a {}", reader.name(), name,
                   kindName(e->kind), kindName(kind));
    return *e;
  }
  DTRAIN_THROW(CheckpointError,
               "checkpoint {}: entry \"{}\" is missing. HINT: register the same modules, "
               "optimizers, schedulers, scalers and samplers, under the same names, as the run "
               "that saved it",
               reader.name(), name);
}

bool has(const CheckpointReader& reader, const std::string& name) {
  for (const Entry* e : reader.find(name)) {
    if (e->owner == kReplicated) return true;
  }
  return false;
}

std::vector<uint8_t> readBytes(const CheckpointReader& reader, const Entry& e) {
  std::vector<uint8_t> out(e.size);
  reader.read(e, out.data());
  return out;
}

double readNumber(const CheckpointReader& reader, const std::string& name) {
  const Entry& e = single(reader, name, Kind::Number);
  if (e.dtype == DType::Int64) {
    int64_t v = 0;
    reader.read(e, &v);
    return static_cast<double>(v);
  }
  double v = 0;
  reader.read(e, &v);
  return v;
}

int64_t readInt(const CheckpointReader& reader, const std::string& name) {
  const Entry& e = single(reader, name, Kind::Number);
  DTRAIN_CHECK_T(CheckpointError, e.dtype == DType::Int64,
                 "checkpoint {}: entry \"{}\" is a {} number, expected an integer", reader.name(),
                 name, dtypeName(e.dtype));
  int64_t v = 0;
  reader.read(e, &v);
  return v;
}

std::string shapeOf(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// The replicated records of tensor `name`, checked against `target`'s dtype and shape.
std::vector<const Entry*> tensorEntries(const CheckpointReader& reader, const std::string& name,
                                        const at::Tensor& target) {
  std::vector<const Entry*> out;
  for (const Entry* e : reader.find(name)) {
    if (e->owner == kReplicated) out.push_back(e);
  }
  DTRAIN_CHECK_T(CheckpointError, !out.empty() || reader.find(name).empty(),
                 "checkpoint {}: entry \"{}\" was saved as the shards of the ranks that held it "
                 "(a parameter of a ZeRO stage-3 unit). HINT: register a ShardedOptimizer over "
                 "the module (any stage, any world size) to restore it, or `checkpoint export` "
                 "the checkpoint's directory for a full state_dict",
                 reader.name(), name);
  DTRAIN_CHECK_T(CheckpointError, !out.empty(),
                 "checkpoint {}: entry \"{}\" is missing. HINT: register the same objects, under "
                 "the same names, as the run that saved it",
                 reader.name(), name);
  const Entry& e = *out.front();
  DTRAIN_CHECK_T(CheckpointError, e.kind == Kind::Tensor || e.kind == Kind::Number,
                 "checkpoint {}: entry \"{}\" is a {}, expected a tensor", reader.name(), name,
                 kindName(e.kind));
  DTRAIN_CHECK_T(CheckpointError,
                 toScalarType(e.dtype) == target.scalar_type() && e.shape == target.sizes().vec(),
                 "checkpoint {}: entry \"{}\" is {} {}, but the tensor it restores is {} {}",
                 reader.name(), name, dtypeName(e.dtype), shapeOf(e.shape),
                 c10::toString(target.scalar_type()), shapeOf(target.sizes().vec()));
  return out;
}

// Whether module tensor `t` (entry `entry`) comes back from the shard records instead of its
// entry: a parameter its unit frees, or one the file holds only as shards (a stage-3 save
// restored at stage 1 or 2). See Note [Stage-3 checkpoints].
bool fromShardRecords(const CheckpointReader& reader, const Registry& registry,
                      const std::string& entry, const at::Tensor& t) {
  const ShardedParam* sharded = shardedParamOf(registry, t);
  return sharded && (sharded->freed || !has(reader, entry));
}

}  // namespace

void checkRestorable(const CheckpointReader& reader, const Registry& registry) {
  for (const auto& [name, module] : registry.state.modules) {
    for (const auto& [key, t] : moduleTensors(*module)) {
      const std::string entry = "module/" + name + "/" + key;
      if (fromShardRecords(reader, registry, entry, t)) continue;
      checkHoldsMemory(name, key, t);
      tensorEntries(reader, entry, t);
    }
  }
  for (const auto& [name, opt] : registry.state.optimizers) {
    const std::string prefix = optimizerPrefix(name);
    auto typeBytes = readBytes(reader, single(reader, prefix + "type", Kind::String));
    std::string saved(typeBytes.begin(), typeBytes.end());
    const char* mine = optimizerType(*opt);
    DTRAIN_CHECK_T(CheckpointError, mine && saved == mine,
                   "checkpoint {}: optimizer \"{}\" was saved as {}, but the one registered is {}",
                   reader.name(), name, saved, mine ? mine : "of an unsupported type");
    const Entry& counts = single(reader, prefix + "params", Kind::Tensor);
    std::vector<int64_t> mineCounts;
    for (const auto& group : opt->param_groups()) {
      mineCounts.push_back(static_cast<int64_t>(group.params().size()));
    }
    std::vector<int64_t> savedCounts(counts.elementCount);
    DTRAIN_CHECK_T(CheckpointError, counts.dtype == DType::Int64 && counts.shape.size() == 1,
                   "checkpoint {}: entry \"{}params\" is not an int64 vector", reader.name(),
                   prefix);
    reader.read(counts, savedCounts.data());
    DTRAIN_CHECK_T(CheckpointError, savedCounts == mineCounts,
                   "checkpoint {}: optimizer \"{}\" was saved with parameter groups of sizes {}, "
                   "the one registered has {}",
                   reader.name(), name, shapeOf(savedCounts), shapeOf(mineCounts));
    at::Tensor lrs = at::empty({static_cast<int64_t>(mineCounts.size())}, at::kDouble);
    tensorEntries(reader, prefix + "lr", lrs);
  }
  for (const auto& [name, scheduler] : registry.state.schedulers) {
    single(reader, "scheduler/" + name + "/step_count", Kind::Number);
  }
  for (const auto& [name, scaler] : registry.state.scalers) {
    single(reader, "scaler/" + name + "/scale", Kind::Number);
  }
  for (const auto& entry : registry.state.samplers) {
    single(reader, "sampler/" + entry.name, Kind::Bytes);
  }
}

void readTensor(const CheckpointReader& reader, const std::vector<const Entry*>& entries,
                at::Tensor& target) {
  at::NoGradGuard noGrad;
  const size_t elem = target.element_size();
  if (target.device().is_cpu() && target.is_contiguous()) {
    auto* base = static_cast<uint8_t*>(target.data_ptr());
    for (const Entry* e : entries) reader.read(*e, base + e->elementOffset * elem);
    return;
  }
  at::Tensor staging = at::empty(target.sizes(), target.options().device(at::kCPU));
  auto* base = static_cast<uint8_t*>(staging.data_ptr());
  for (const Entry* e : entries) reader.read(*e, base + e->elementOffset * elem);
  target.copy_(staging);
}

namespace {

// Tensors to read, with the entries each comes from: gathered first, read in one spread.
using TensorReads = std::vector<std::pair<std::vector<const Entry*>, at::Tensor>>;

// Sets `opt`'s learning rates now, and makes its per-parameter state what was saved: state the
// run that saved it did not have is dropped, tensors to read go into `reads`.
void restoreOptimizer(const CheckpointReader& reader, const std::string& name,
                      torch::optim::Optimizer& opt, TensorReads& reads) {
  const std::string prefix = optimizerPrefix(name);
  auto& groups = opt.param_groups();
  at::Tensor lrs = at::empty({static_cast<int64_t>(groups.size())}, at::kDouble);
  readTensor(reader, tensorEntries(reader, prefix + "lr", lrs), lrs);
  std::string type = optimizerType(opt);
  auto& state = opt.state();
  for (size_t g = 0; g < groups.size(); ++g) {
    groups[g].options().set_lr(lrs[static_cast<int64_t>(g)].item<double>());
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      std::string at = fmt::format("{}{}.{}/", prefix, g, i);
      auto key = compat::optimizerStateKey(params[i]);
      // A parameter without saved state had never been stepped: it has none after restoring.
      auto probe = newParamState(type);
      StateFields probeFields = fieldsOf(*probe);
      bool saved = probeFields.step ? has(reader, at + "step") : false;
      for (const auto& [field, unused] : probeFields.tensors)
        saved = saved || has(reader, at + field);
      if (!saved) {
        state.erase(key);
        continue;
      }
      auto it = state.find(key);
      if (it == state.end()) it = state.emplace(key, std::move(probe)).first;
      StateFields fields = fieldsOf(*it->second);
      for (auto& [field, tensor] : fields.tensors) {
        if (!has(reader, at + field)) {
          *tensor = at::Tensor();
          continue;
        }
        if (!tensor->defined() || tensor->sizes() != params[i].sizes()) {
          *tensor = at::empty_like(params[i], at::MemoryFormat::Contiguous);
        }
        reads.emplace_back(tensorEntries(reader, at + field, *tensor), *tensor);
      }
      if (fields.step) *fields.step = readInt(reader, at + "step");
    }
  }
}

// Schedulers' step counts, scalers' state and (after a world-size change) samplers' positions.
void restoreCounters(const CheckpointReader& reader, Registry& registry, bool sameWorldSize) {
  for (auto& [name, scheduler] : registry.state.schedulers) {
    compat::schedulerStepCount(*scheduler) = static_cast<unsigned>(
        readInt(reader, "scheduler/" + name + "/step_count"));
  }
  for (auto& [name, scaler] : registry.state.scalers) {
    std::string prefix = "scaler/" + name + "/";
    GradScalerState s;
    s.scale = readNumber(reader, prefix + "scale");
    s.growthFactor = readNumber(reader, prefix + "growth_factor");
    s.backoffFactor = readNumber(reader, prefix + "backoff_factor");
    s.growthInterval = readInt(reader, prefix + "growth_interval");
    s.growthTracker = readInt(reader, prefix + "growth_tracker");
    scaler->loadState(s);
  }
  for (auto& entry : registry.state.samplers) {
    // At the same world size each rank loads its own position (restoreRankState); at another,
    // the global cursor is all there is, and it is the same for every rank.
    if (sameWorldSize) continue;
    entry.sampler->loadState(SamplerState::decode(
        readBytes(reader, single(reader, "sampler/" + entry.name, Kind::Bytes))));
  }
}

// The user's metadata (meta/<key>), replacing what `metadata` held.
void restoreMetadata(const CheckpointReader& reader,
                     std::map<std::string, MetadataValue>& metadata) {
  metadata.clear();
  for (const Entry& e : reader.entries()) {
    if (e.owner != kReplicated || e.name.rfind("meta/", 0) != 0 || e.isShard()) continue;
    std::string key = e.name.substr(5);
    switch (e.kind) {
      case Kind::String: {
        auto bytes = readBytes(reader, e);
        metadata[key] = std::string(bytes.begin(), bytes.end());
        break;
      }
      case Kind::Number:
        if (e.dtype == DType::Int64) {
          metadata[key] = readInt(reader, e.name);
        } else {
          metadata[key] = readNumber(reader, e.name);
        }
        break;
      case Kind::Tensor: {
        at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(toScalarType(e.dtype)));
        readTensor(reader, reader.find(e.name), t);
        metadata[key] = t;
        break;
      }
      case Kind::Bytes: break;
    }
  }
}

}  // namespace

void restoreReplicated(const CheckpointReader& reader, Registry& registry,
                       std::map<std::string, MetadataValue>& metadata, bool sameWorldSize,
                       const c10::Device& device) {
  // The bulk -- parameters, buffers, optimizer state -- is gathered first and read in one spread.
  TensorReads reads;
  for (auto& [name, module] : registry.state.modules) {
    for (auto& [key, t] : moduleTensors(*module)) {
      std::string entry = "module/" + name + "/" + key;
      if (fromShardRecords(reader, registry, entry, t)) continue;  // loadShards() writes it
      reads.emplace_back(tensorEntries(reader, entry, t), t);
    }
  }
  for (auto& [name, opt] : registry.state.optimizers) restoreOptimizer(reader, name, *opt, reads);
  forEachSpread(
      reads.size(), [&](size_t i) { return static_cast<uint64_t>(reads[i].second.nbytes()); },
      [&](size_t i) { readTensor(reader, reads[i].first, reads[i].second); },
      useDeviceInThread(device));
  restoreCounters(reader, registry, sameWorldSize);
  restoreMetadata(reader, metadata);
}

void restoreRankState(const CheckpointReader& reader, state::Registry& registered, uint32_t rank,
                      bool sameWorldSize) {
  if (rank >= reader.header().worldSize) {
    DTRAIN_LOG(Info,
               "checkpoint: rank {} did not exist when {} was saved (world size {}); its "
               "random generators keep their current state",
               rank, reader.name(), reader.header().worldSize);
    return;
  }
  auto own = [&](const std::string& what) -> const Entry* {
    for (const Entry* e : reader.find(fmt::format("rank/{}/{}", rank, what))) {
      if (e->owner == rank && e->kind == Kind::Bytes) return e;
    }
    return nullptr;
  };
  auto setGenerator = [&](at::Generator gen, const Entry& e) {
    at::Tensor state = at::empty({static_cast<int64_t>(e.size)}, at::kByte);
    reader.read(e, state.data_ptr());
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  };
  if (const Entry* e = own("rng/cpu")) setGenerator(at::detail::getDefaultCPUGenerator(), *e);
#if DTRAIN_WITH_TORCH_CUDA
  if (const Entry* e = own("rng/cuda"); e && c10::cuda::device_count() > 0) {
    setGenerator(at::cuda::detail::getDefaultCUDAGenerator(c10::cuda::current_device()), *e);
  }
#endif
  if (!sameWorldSize) return;
  for (auto& entry : registered.samplers) {
    const Entry* e = own("sampler/" + entry.name);
    DTRAIN_CHECK_T(CheckpointError, e != nullptr,
                   "checkpoint {}: rank {}'s position of sampler \"{}\" is missing", reader.name(),
                   rank, entry.name);
    entry.sampler->loadState(SamplerState::decode(readBytes(reader, *e)));
  }
}

}  // namespace dtrain::checkpoint
