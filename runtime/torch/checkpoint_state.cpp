#include "checkpoint_state.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/nn/module.h>
#include <torch/optim.h>

#include "byte_layout.h"
#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "dtrain/config.h"
#include "dtrain/torch/distributed_sampler.h"
#include "dtrain/torch/grad_scaler.h"
#include "torch_compat.h"

#if DTRAIN_WITH_TORCH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

// Note [Checkpoint entries]
// Entry names, by what they come from (M, O, S, ... the names given to the Checkpointer):
//   module/M/<parameter or buffer name>     tensors, as named_parameters()/named_buffers() name them
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
// A parameter the optimizer has no state for yet (never stepped) has no entries; restoring
// drops any state it has, so the optimizer ends exactly as it was saved.

namespace dtrain::checkpoint {

namespace {

const char* optimizerType(const torch::optim::Optimizer& o) {
  if (dynamic_cast<const torch::optim::SGD*>(&o)) return "SGD";
  if (dynamic_cast<const torch::optim::Adam*>(&o)) return "Adam";
  if (dynamic_cast<const torch::optim::AdamW*>(&o)) return "AdamW";
  if (dynamic_cast<const torch::optim::Adagrad*>(&o)) return "Adagrad";
  if (dynamic_cast<const torch::optim::RMSprop*>(&o)) return "RMSprop";
  return nullptr;
}

// The tensors and the step count of one parameter's optimizer state.
struct StateFields {
  std::vector<std::pair<const char*, at::Tensor*>> tensors;
  int64_t* step = nullptr;
};

StateFields fieldsOf(torch::optim::OptimizerParamState& s) {
  using namespace torch::optim;
  if (auto* p = dynamic_cast<SGDParamState*>(&s)) return {{{"momentum_buffer", &p->momentum_buffer()}}, nullptr};
  if (auto* p = dynamic_cast<AdamParamState*>(&s)) {
    return {{{"exp_avg", &p->exp_avg()}, {"exp_avg_sq", &p->exp_avg_sq()},
             {"max_exp_avg_sq", &p->max_exp_avg_sq()}},
            &p->step()};
  }
  if (auto* p = dynamic_cast<AdamWParamState*>(&s)) {
    return {{{"exp_avg", &p->exp_avg()}, {"exp_avg_sq", &p->exp_avg_sq()},
             {"max_exp_avg_sq", &p->max_exp_avg_sq()}},
            &p->step()};
  }
  if (auto* p = dynamic_cast<AdagradParamState*>(&s)) return {{{"sum", &p->sum()}}, &p->step()};
  if (auto* p = dynamic_cast<RMSpropParamState*>(&s)) {
    return {{{"square_avg", &p->square_avg()}, {"momentum_buffer", &p->momentum_buffer()},
             {"grad_avg", &p->grad_avg()}},
            &p->step()};
  }
  return {};
}

std::unique_ptr<torch::optim::OptimizerParamState> newParamState(const std::string& type) {
  using namespace torch::optim;
  if (type == "SGD") return std::make_unique<SGDParamState>();
  if (type == "Adam") return std::make_unique<AdamParamState>();
  if (type == "AdamW") return std::make_unique<AdamWParamState>();
  if (type == "Adagrad") return std::make_unique<AdagradParamState>();
  if (type == "RMSprop") return std::make_unique<RMSpropParamState>();
  return nullptr;
}

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

std::string optimizerPrefix(const std::string& name) { return "optimizer/" + name + "/"; }

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

std::vector<std::pair<std::string, at::Tensor>> moduleTensors(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) out.emplace_back(p.key(), p.value());
  for (const auto& b : module.named_buffers(/*recurse=*/true)) out.emplace_back(b.key(), b.value());
  return out;
}

std::vector<uint8_t> tensorBytes(const at::Tensor& t) {
  at::Tensor c = t.contiguous().cpu();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

// Rank-blob encoding: u32 count, then per item u16 name length, name, u64 size, bytes.
void putBlob(std::vector<uint8_t>& out, const std::string& name, const std::vector<uint8_t>& bytes) {
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
  for (const auto& [name, module] : registry.modules) {
    for (const auto& [key, t] : moduleTensors(*module)) {
      items.push_back(tensorItem("module/" + name + "/" + key, t));
    }
  }
  for (const auto& [name, opt] : registry.optimizers) {
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
        auto it = state.find(compat::optimizerStateKey(*opt, params[i]));
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
  for (const auto& [name, scheduler] : registry.schedulers) {
    items.push_back(intItem("scheduler/" + name + "/step_count",
                            static_cast<int64_t>(compat::schedulerStepCount(*scheduler))));
  }
  for (const auto& [name, scaler] : registry.scalers) {
    GradScalerState s = scaler->state();
    std::string prefix = "scaler/" + name + "/";
    items.push_back(numberItem(prefix + "scale", s.scale));
    items.push_back(numberItem(prefix + "growth_factor", s.growthFactor));
    items.push_back(numberItem(prefix + "backoff_factor", s.backoffFactor));
    items.push_back(intItem(prefix + "growth_interval", s.growthInterval));
    items.push_back(intItem(prefix + "growth_tracker", s.growthTracker));
  }
  for (const auto& [name, sampler] : registry.samplers) {
    items.push_back(bytesItem("sampler/" + name, sampler->state().encode()));
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

std::vector<uint8_t> encodeRankState(const Registry& registry) {
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
  for (const auto& [name, sampler] : registry.samplers) {
    putBlob(out, "sampler/" + name, sampler->state().encode());
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

void checkRestorable(const CheckpointReader& reader, const Registry& registry) {
  for (const auto& [name, module] : registry.modules) {
    for (const auto& [key, t] : moduleTensors(*module)) {
      tensorEntries(reader, "module/" + name + "/" + key, t);
    }
  }
  for (const auto& [name, opt] : registry.optimizers) {
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
                   "checkpoint {}: entry \"{}params\" is not an int64 vector", reader.name(), prefix);
    reader.read(counts, savedCounts.data());
    DTRAIN_CHECK_T(CheckpointError, savedCounts == mineCounts,
                   "checkpoint {}: optimizer \"{}\" was saved with parameter groups of sizes {}, "
                   "the one registered has {}",
                   reader.name(), name, shapeOf(savedCounts), shapeOf(mineCounts));
    at::Tensor lrs = at::empty({static_cast<int64_t>(mineCounts.size())}, at::kDouble);
    tensorEntries(reader, prefix + "lr", lrs);
  }
  for (const auto& [name, scheduler] : registry.schedulers) {
    single(reader, "scheduler/" + name + "/step_count", Kind::Number);
  }
  for (const auto& [name, scaler] : registry.scalers) {
    single(reader, "scaler/" + name + "/scale", Kind::Number);
  }
  for (const auto& [name, sampler] : registry.samplers) {
    single(reader, "sampler/" + name, Kind::Bytes);
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

void forEachSpread(size_t n, const std::function<uint64_t(size_t)>& weight,
                   const std::function<void(size_t)>& job) {
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
  for (size_t lane = 1; lane < lanes; ++lane) threads.emplace_back(runLane, lane);
  runLane(0);
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

void restoreReplicated(const CheckpointReader& reader, Registry& registry,
                       std::map<std::string, MetadataValue>& metadata, bool sameWorldSize) {
  // The bulk -- parameters, buffers, optimizer state -- is gathered first and read in one spread.
  std::vector<std::pair<std::vector<const Entry*>, at::Tensor>> reads;
  for (auto& [name, module] : registry.modules) {
    for (auto& [key, t] : moduleTensors(*module)) {
      std::string entry = "module/" + name + "/" + key;
      reads.emplace_back(tensorEntries(reader, entry, t), t);
    }
  }
  for (auto& [name, opt] : registry.optimizers) {
    const std::string prefix = optimizerPrefix(name);
    auto& groups = opt->param_groups();
    at::Tensor lrs = at::empty({static_cast<int64_t>(groups.size())}, at::kDouble);
    readTensor(reader, tensorEntries(reader, prefix + "lr", lrs), lrs);
    std::string type = optimizerType(*opt);
    auto& state = opt->state();
    for (size_t g = 0; g < groups.size(); ++g) {
      groups[g].options().set_lr(lrs[static_cast<int64_t>(g)].item<double>());
      const auto& params = groups[g].params();
      for (size_t i = 0; i < params.size(); ++i) {
        std::string at = fmt::format("{}{}.{}/", prefix, g, i);
        auto key = compat::optimizerStateKey(*opt, params[i]);
        // A parameter without saved state had never been stepped: it has none after restoring.
        auto probe = newParamState(type);
        StateFields probeFields = fieldsOf(*probe);
        bool saved = probeFields.step ? has(reader, at + "step") : false;
        for (const auto& [field, unused] : probeFields.tensors) saved = saved || has(reader, at + field);
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
  forEachSpread(
      reads.size(), [&](size_t i) { return static_cast<uint64_t>(reads[i].second.nbytes()); },
      [&](size_t i) { readTensor(reader, reads[i].first, reads[i].second); });
  for (auto& [name, scheduler] : registry.schedulers) {
    compat::schedulerStepCount(*scheduler) =
        static_cast<unsigned>(readInt(reader, "scheduler/" + name + "/step_count"));
  }
  for (auto& [name, scaler] : registry.scalers) {
    std::string prefix = "scaler/" + name + "/";
    GradScalerState s;
    s.scale = readNumber(reader, prefix + "scale");
    s.growthFactor = readNumber(reader, prefix + "growth_factor");
    s.backoffFactor = readNumber(reader, prefix + "backoff_factor");
    s.growthInterval = readInt(reader, prefix + "growth_interval");
    s.growthTracker = readInt(reader, prefix + "growth_tracker");
    scaler->loadState(s);
  }
  for (auto& [name, sampler] : registry.samplers) {
    // At the same world size each rank loads its own position (restoreRankState); at another,
    // the global cursor is all there is, and it is the same for every rank.
    if (sameWorldSize) continue;
    sampler->loadState(SamplerState::decode(readBytes(reader, single(reader, "sampler/" + name, Kind::Bytes))));
  }
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

void restoreRankState(const CheckpointReader& reader, Registry& registry, uint32_t rank,
                      bool sameWorldSize) {
  if (rank >= reader.header().worldSize) {
    DTRAIN_LOG(Info, "checkpoint: rank {} did not exist when {} was saved (world size {}); its "
               "random generators keep their current state", rank, reader.name(),
               reader.header().worldSize);
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
  for (auto& [name, sampler] : registry.samplers) {
    const Entry* e = own("sampler/" + name);
    DTRAIN_CHECK_T(CheckpointError, e != nullptr,
                   "checkpoint {}: rank {}'s position of sampler \"{}\" is missing", reader.name(),
                   rank, name);
    sampler->loadState(SamplerState::decode(readBytes(reader, *e)));
  }
}

}  // namespace dtrain::checkpoint
