#include "state.h"

#include <algorithm>
#include <numeric>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/nn/module.h>
#include <torch/optim.h>

#include "../torch_compat.h"
#include "byte_layout.h"
#include "dtrain/base/error.h"
#include "dtrain/config.h"
#include "dtrain/torch/distributed_sampler.h"
#include "dtrain/torch/grad_scaler.h"

#if DTRAIN_WITH_TORCH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

// Note [Checkpoint entries]
// Entry names, by what they come from (M, O, S, ... the names given to the Checkpointer):
//   module/M/<parameter or buffer name>     tensors, as named_parameters() and named_buffers()
//                                            name them (a parameter ZeRO-3 frees: each rank's
//                                            range, owned; Note [Stage-3 checkpoints])
//   optimizer/M/type                         string: SGD, Adam, AdamW, Adagrad, RMSprop
//   optimizer/O/params                       int64 [groups]: parameters per group
//   optimizer/O/lr                           float64 [groups]: each group's learning rate
//   optimizer/O/<g>.<i>/<field>              tensors of parameter i of group g: momentum_buffer,
//                                            exp_avg, exp_avg_sq, max_exp_avg_sq, sum, square_avg,
//                                            grad_avg (those the optimizer has)
//   optimizer/O/<g>.<i>/step                 number (int64), for optimizers that count steps
//   scheduler/S/step_count                   number
//   scaler/S/{scale,growth_factor,backoff_factor,growth_interval,growth_tracker}   numbers
//   sampler/N                                bytes: SamplerState::encode() of the writing rank
//   meta/<key>                               the user's metadata: string, number or tensor
//   rank/<r>/rng/cpu                         bytes: rank r's CPU generator state (owner r)
//   rank/<r>/rng/cuda                        bytes: rank r's current CUDA device's generator
//   rank/<r>/sampler/N                       bytes: rank r's own sampler position (owner r)
//   optimizer/O/<parameter>/<field>, /step   a ShardedOptimizer's shards, each owned by its rank,
//   shards/records                           and the ranks that saved them (Note [Sharded
//                                            checkpoint files])
// A parameter the optimizer has no state for yet (never stepped) has no entries; restoring
// drops any state it has, so the optimizer ends exactly as it was saved.

namespace dtrain::checkpoint {

namespace {

Item tensorItem(std::string name, const at::Tensor& t) {
  Item item;
  item.spec.name = std::move(name);
  item.spec.kind = Kind::Tensor;
  item.spec.dtype = toFormatDType(t.scalar_type(), item.spec.name);
  item.spec.shape = t.sizes().vec();
  item.tensor = t.detach();
  return item;
}

Item numberItem(std::string name, double value) {
  Item item = tensorItem(std::move(name), at::scalar_tensor(value, at::kDouble));
  item.spec.kind = Kind::Number;
  return item;
}

Item intItem(std::string name, int64_t value) {
  Item item = tensorItem(std::move(name), at::scalar_tensor(value, at::kLong));
  item.spec.kind = Kind::Number;
  return item;
}

Item bytesItem(std::string name, std::vector<uint8_t> bytes, Kind kind = Kind::Bytes) {
  Item item;
  item.spec.name = std::move(name);
  item.spec.kind = kind;
  item.spec.dtype = DType::UInt8;
  item.spec.shape = {static_cast<int64_t>(bytes.size())};
  item.bytes = std::move(bytes);
  return item;
}

std::vector<uint8_t> tensorBytes(const at::Tensor& t) {
  at::Tensor c = t.contiguous().cpu();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

// Rank-blob encoding: u32 count, then per item u16 name length, name, u64 size, bytes.
void putBlob(std::vector<uint8_t>& out, const std::string& name,
             const std::vector<uint8_t>& bytes) {
  auto put = [&](uint64_t v, size_t n) {
    out.resize(out.size() + n);
    putLE(out.data() + out.size() - n, v, n);
  };
  put(name.size(), 2);
  out.insert(out.end(), name.begin(), name.end());
  put(bytes.size(), 8);
  out.insert(out.end(), bytes.begin(), bytes.end());
}

}  // namespace

std::string optimizerPrefix(const std::string& name) { return "optimizer/" + name + "/"; }

std::vector<std::pair<std::string, at::Tensor>> moduleTensors(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    out.emplace_back(p.key(), p.value());
  }
  for (const auto& b : module.named_buffers(/*recurse=*/true)) out.emplace_back(b.key(), b.value());
  return out;
}

size_t Item::size() const {
  if (spec.kind == Kind::String || spec.kind == Kind::Bytes) return bytes.size();
  return static_cast<size_t>(tensor.numel()) * tensor.element_size();
}

DType toFormatDType(at::ScalarType type, const std::string& what) {
  switch (type) {
    case at::kFloat: return DType::Float32;
    case at::kDouble: return DType::Float64;
    case at::kHalf: return DType::Float16;
    case at::kBFloat16: return DType::BFloat16;
    case at::kChar: return DType::Int8;
    case at::kByte: return DType::UInt8;
    case at::kShort: return DType::Int16;
    case at::kInt: return DType::Int32;
    case at::kLong: return DType::Int64;
    case at::kBool: return DType::Bool;
    case at::kComplexFloat: return DType::Complex64;
    case at::kComplexDouble: return DType::Complex128;
    default:
      DTRAIN_THROW(CheckpointError, "checkpoint: {} has type {}, which checkpoints cannot hold",
                   what, c10::toString(type));
  }
}

at::ScalarType toScalarType(DType dtype) {
  switch (dtype) {
    case DType::Float32: return at::kFloat;
    case DType::Float64: return at::kDouble;
    case DType::Float16: return at::kHalf;
    case DType::BFloat16: return at::kBFloat16;
    case DType::Int8: return at::kChar;
    case DType::UInt8: return at::kByte;
    case DType::Int16: return at::kShort;
    case DType::Int32: return at::kInt;
    case DType::Int64: return at::kLong;
    case DType::Bool: return at::kBool;
    case DType::Complex64: return at::kComplexFloat;
    case DType::Complex128: return at::kComplexDouble;
  }
  return at::kByte;
}

std::vector<Item> replicatedItems(const Registry& registry,
                                  const std::map<std::string, MetadataValue>& metadata) {
  std::vector<Item> items;
  for (const auto& [name, module] : registry.state.modules) {
    for (const auto& [key, t] : moduleTensors(*module)) {
      // A freed parameter's values are its owners' shard records (Note [Stage-3 checkpoints]).
      const ShardedParam* sharded = shardedParamOf(registry, t);
      if (sharded && sharded->freed) continue;
      checkHoldsMemory(name, key, t);
      items.push_back(tensorItem("module/" + name + "/" + key, t));
    }
  }
  for (const auto& [name, opt] : registry.state.optimizers) {
    const std::string prefix = optimizerPrefix(name);
    const char* type = optimizerType(*opt);
    DTRAIN_CHECK_T(CheckpointError, type != nullptr,
                   "checkpoint: optimizer \"{}\" is of a type checkpoints do not know (SGD, Adam, "
                   "AdamW, Adagrad and RMSprop are supported)",
                   name);
    std::string typeName = type;
    items.push_back(bytesItem(prefix + "type", {typeName.begin(), typeName.end()}, Kind::String));
    std::vector<int64_t> counts;
    std::vector<double> lrs;
    for (const auto& group : opt->param_groups()) {
      counts.push_back(static_cast<int64_t>(group.params().size()));
      lrs.push_back(group.options().get_lr());
    }
    items.push_back(tensorItem(prefix + "params", at::tensor(counts, at::kLong)));
    items.push_back(tensorItem(prefix + "lr", at::tensor(lrs, at::kDouble)));
    const auto& state = opt->state();
    for (size_t g = 0; g < opt->param_groups().size(); ++g) {
      const auto& params = opt->param_groups()[g].params();
      for (size_t i = 0; i < params.size(); ++i) {
        auto it = state.find(compat::optimizerStateKey(params[i]));
        if (it == state.end()) continue;
        std::string at = fmt::format("{}{}.{}/", prefix, g, i);
        StateFields fields = fieldsOf(*it->second);
        for (const auto& [field, tensor] : fields.tensors) {
          if (tensor->defined()) items.push_back(tensorItem(at + field, *tensor));
        }
        if (fields.step) items.push_back(intItem(at + "step", *fields.step));
      }
    }
  }
  for (const auto& [name, scheduler] : registry.state.schedulers) {
    items.push_back(intItem("scheduler/" + name + "/step_count",
                            static_cast<int64_t>(compat::schedulerStepCount(*scheduler))));
  }
  for (const auto& [name, scaler] : registry.state.scalers) {
    GradScalerState s = scaler->state();
    std::string prefix = "scaler/" + name + "/";
    items.push_back(numberItem(prefix + "scale", s.scale));
    items.push_back(numberItem(prefix + "growth_factor", s.growthFactor));
    items.push_back(numberItem(prefix + "backoff_factor", s.backoffFactor));
    items.push_back(intItem(prefix + "growth_interval", s.growthInterval));
    items.push_back(intItem(prefix + "growth_tracker", s.growthTracker));
  }
  for (const auto& entry : registry.state.samplers) {
    items.push_back(bytesItem("sampler/" + entry.name, entry.state().encode()));
  }
  for (const auto& [key, value] : metadata) {
    std::string name = "meta/" + key;
    if (auto* s = std::get_if<std::string>(&value)) {
      items.push_back(bytesItem(name, {s->begin(), s->end()}, Kind::String));
    } else if (auto* d = std::get_if<double>(&value)) {
      items.push_back(numberItem(name, *d));
    } else if (auto* i = std::get_if<int64_t>(&value)) {
      items.push_back(intItem(name, *i));
    } else {
      items.push_back(tensorItem(name, std::get<at::Tensor>(value)));
    }
  }
  return items;
}

std::vector<uint8_t> encodeRankState(const state::Registry& registered) {
  std::vector<uint8_t> out(4, 0);
  uint32_t count = 0;
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    putBlob(out, "rng/cpu", tensorBytes(gen.get_state()));
    ++count;
  }
#if DTRAIN_WITH_TORCH_CUDA
  if (c10::cuda::device_count() > 0) {
    auto gen = at::cuda::detail::getDefaultCUDAGenerator(c10::cuda::current_device());
    std::lock_guard<std::mutex> lock(gen.mutex());
    putBlob(out, "rng/cuda", tensorBytes(gen.get_state()));
    ++count;
  }
#endif
  for (const auto& entry : registered.samplers) {
    putBlob(out, "sampler/" + entry.name, entry.state().encode());
    ++count;
  }
  putLE(out.data(), count, 4);
  return out;
}

std::vector<Item> rankItems(uint32_t rank, const std::vector<uint8_t>& blob) {
  std::vector<Item> items;
  size_t at = 0;
  auto need = [&](size_t n) {
    DTRAIN_CHECK_T(CheckpointError, blob.size() - at >= n,
                   "checkpoint: rank {}'s state is malformed ({} bytes, cut at {})", rank,
                   blob.size(), at);
  };
  auto get = [&](int n) {
    need(static_cast<size_t>(n));
    const uint64_t v = getLE(blob.data() + at, static_cast<size_t>(n));
    at += static_cast<size_t>(n);
    return v;
  };
  uint64_t count = get(4);
  for (uint64_t k = 0; k < count; ++k) {
    size_t nameLen = static_cast<size_t>(get(2));
    need(nameLen);
    std::string name(reinterpret_cast<const char*>(blob.data() + at), nameLen);
    at += nameLen;
    uint64_t size = get(8);
    need(size);
    std::vector<uint8_t> bytes(blob.begin() + static_cast<std::ptrdiff_t>(at),
                               blob.begin() + static_cast<std::ptrdiff_t>(at + size));
    at += size;
    Item item = bytesItem(fmt::format("rank/{}/{}", rank, name), std::move(bytes));
    item.spec.owner = rank;
    items.push_back(std::move(item));
  }
  return items;
}

std::function<void()> useDeviceInThread(const c10::Device& device) {
#if DTRAIN_WITH_TORCH_CUDA
  if (device.is_cuda()) {
    const auto index = device.has_index() ? device.index() : c10::cuda::current_device();
    return [index] { c10::cuda::set_device(index); };
  }
#endif
  (void)device;
  return nullptr;
}

void forEachSpread(size_t n, const std::function<uint64_t(size_t)>& weight,
                   const std::function<void(size_t)>& job,
                   const std::function<void()>& enterThread) {
  constexpr uint64_t kSmall = 4 << 20;  // below this in all, threads cost more than they save
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) total += weight(i);
  // As many threads as the program gives ATen (launch sets OMP_NUM_THREADS to cores / local
  // workers), at most 4: more threads than that budget slow everyone down on a busy machine.
  size_t lanes = static_cast<size_t>(std::clamp(at::get_num_threads(), 1, 4));
  if (total < kSmall || lanes == 1 || n < 2) {
    for (size_t i = 0; i < n; ++i) job(i);
    return;
  }
  // Largest first, each to the least loaded lane.
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return weight(a) > weight(b); });
  std::vector<std::vector<size_t>> work(lanes);
  std::vector<uint64_t> load(lanes, 0);
  for (size_t i : order) {
    size_t lane = std::min_element(load.begin(), load.end()) - load.begin();
    work[lane].push_back(i);
    load[lane] += weight(i);
  }
  std::vector<std::exception_ptr> errors(lanes);
  auto runLane = [&](size_t lane) {
    try {
      for (size_t i : work[lane]) job(i);
    } catch (...) {
      errors[lane] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  for (size_t lane = 1; lane < lanes; ++lane) {
    threads.emplace_back([&, lane] {
      if (enterThread) {
        try {
          enterThread();
        } catch (...) {
          errors[lane] = std::current_exception();
          return;
        }
      }
      runLane(lane);
    });
  }
  runLane(0);
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace dtrain::checkpoint
