// Sharded optimizer state in checkpoints: blobs of shard records, owned shard entries, the ring of
// keepers and the re-assembly at any world size. See Note [Sharded checkpoint files].
#include "shard_entries.h"

#include <algorithm>
#include <cstring>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/optim/optimizer.h>

#include "byte_layout.h"
#include "dtrain/base/error.h"
#include "dtrain/torch/zero.h"

// Note [Sharded checkpoint files]
// A ShardedOptimizer's state is never gathered. Each rank's shard records (ShardRecord: a
// parameter's element range [begin, end) with its master weights, optimizer state fields and step
// count; independent of units and of the world size) become owned shard entries of the format:
//   optimizer/O/<parameter>/<field>   tensor, element offset = begin, count = end - begin, shape
//                                     the whole parameter's, owner = the rank that held it
//                                     (field: master, exp_avg, exp_avg_sq, momentum_buffer, ...)
//   optimizer/O/<parameter>/step      number (int64), owner = that rank
// beside the replicated optimizer/O/type ("sharded") and optimizer/O/lr, and
//   shards/records                    int64 [world size], element r owned by rank r: the number
//                                     of records rank r saved, over all sharded optimizers
// which lists every rank that saved, also one whose blocks are all padding and so has no record
// (a small model at many ranks: Linear(2, 1) at 4). A file written before it existed lists only
// the ranks with records. The parameters themselves are full on every rank (ZeRO-1/2) and are
// saved as module entries, once per node; those ZeRO-3 frees become owned module entries from
// the same records (Note [Stage-3 checkpoints]).
// Node i's file holds its own ranks' entries and those of node i+1 in ring order (nodes by id):
// at a save each rank broadcasts its records over a subgroup of itself and the two writers that
// keep them (shardKeepers(); the communicator has no send/recv; a backend without subgroups
// broadcasts over the whole group), so every shard is on two nodes and a node that comes back
// empty restores from its neighbour. LATEST moves only after a second agreement: the first says
// every node's `step-N` -- its shards and its replica of the next node's -- is durable. A restore
// takes the newest step whose shards are all somewhere (every rank of its world size an owner in
// some node's manifest; else the step is incomplete and passed over, and with no complete step
// left the restore refuses, naming the ranks whose shards no node holds), reads the module and
// the other replicated state from its own node's file (a copy when it lacks the step), then, for
// each rank that saved, one node holding its records reads them (checksums checked; damage: the
// next holder, none left: the next older complete step) and broadcasts them; each rank keeps what
// overlaps its ranges in today's layout and loads them (ShardedOptimizer::loadShardState), which
// re-shards exactly onto any world size.

// Note [One copy of a freed master]
// At stage 3 the module entry of a freed parameter's range is made from the record's `master`
// bytes (Note [Stage-3 checkpoints] in zero3.cpp); when the module entry has the master's dtype
// (float32 parameters, also with ZeroOptions::paramDtype, whose module entries are the float32
// masters) they are the same bytes, so the record is saved without its `master` entry and the
// file holds them once -- a third less for Adam. A 16-bit model keeps both: its module entry is
// the float32 master rounded. readShardBlob() takes a record's master from the owner's module
// entry of the same range when the file has no `master` entry for it, so a restore (and the
// blobs it broadcasts) sees the same records as from a file written before, which has both.

namespace dtrain::checkpoint {

namespace {

// Blob: records, each
//   u16 optimizer name length, name; u16 parameter name length, name; u8 ndim, i64 shape[ndim];
//   i64 begin, end; u8 has step, i64 step; u8 fields; per field: u16 name length, name,
//   u8 format dtype, zero padding to 8, the data (end - begin elements), zero padding to 8.
// Data stays 8-aligned, so a blob's entries are written straight from it.
// A blob is written in two passes of the same code (blobOf()): the first, with no buffer, only
// counts its bytes; the second writes them into a tensor of that size -- one allocation, no
// copy on growth, no bytes cleared that are written anyway.
class BlobWriter {
 public:
  BlobWriter() = default;  // counting
  BlobWriter(uint8_t* out, size_t size) : out_(out), size_(size) {}
  void u(uint64_t v, size_t n) {
    if (uint8_t* at = room(n)) putLE(at, v, n);
  }
  void str(const std::string& s) {
    u(s.size(), 2);
    if (uint8_t* at = room(s.size())) std::memcpy(at, s.data(), s.size());
  }
  void pad() {
    const size_t n = (at_ + 7) / 8 * 8 - at_;
    if (uint8_t* at = room(n)) std::memset(at, 0, n);
  }
  // Room for n bytes of data, 8-aligned before and after; nullptr while counting.
  uint8_t* data(size_t n) {
    pad();
    uint8_t* at = room(n);
    pad();
    return at;
  }
  size_t size() const { return at_; }

 private:
  uint8_t* room(size_t n) {
    uint8_t* at = out_ ? out_ + at_ : nullptr;
    at_ += n;
    DTRAIN_CHECK(!out_ || at_ <= size_, "shard blob: {} bytes written into {}", at_, size_);
    return at;
  }
  uint8_t* out_ = nullptr;
  size_t size_ = 0;
  size_t at_ = 0;
};

// The blob `emit(BlobWriter&)` writes, in a byte tensor of its size.
template <typename Emit>
at::Tensor blobOf(const Emit& emit) {
  BlobWriter counting;
  emit(counting);
  counting.pad();
  at::Tensor blob = at::empty({static_cast<int64_t>(counting.size())}, at::kByte);
  BlobWriter w(blob.data_ptr<uint8_t>(), counting.size());
  emit(w);
  w.pad();
  DTRAIN_CHECK(w.size() == counting.size(), "shard blob: {} bytes written, {} counted", w.size(),
               counting.size());
  return blob;
}

struct BlobField {
  std::string name;
  DType dtype = DType::Float32;
  size_t offset = 0;  // of the data, in the blob
};

struct BlobRecord {
  std::string optimizer, param;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;
  std::optional<int64_t> step;
  std::vector<BlobField> fields;
};

class BlobReader {
 public:
  BlobReader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool done() const { return at_ >= n_; }
  uint64_t u(size_t n) {
    need(n);
    uint64_t v = getLE(p_ + at_, n);
    at_ += n;
    return v;
  }
  std::string str() {
    size_t len = u(2);
    need(len);
    std::string s(reinterpret_cast<const char*>(p_ + at_), len);
    at_ += len;
    return s;
  }
  size_t data(size_t n) {
    at_ = (at_ + 7) / 8 * 8;
    need(n);
    size_t at = at_;
    at_ += n;
    at_ = std::min(n_, (at_ + 7) / 8 * 8);
    return at;
  }
  BlobRecord record() {
    BlobRecord r;
    r.optimizer = str();
    r.param = str();
    const size_t ndim = u(1);
    for (size_t d = 0; d < ndim; ++d) r.shape.push_back(static_cast<int64_t>(u(8)));
    r.begin = static_cast<int64_t>(u(8));
    r.end = static_cast<int64_t>(u(8));
    const bool hasStep = u(1) != 0;
    const int64_t step = static_cast<int64_t>(u(8));
    if (hasStep) r.step = step;
    DTRAIN_CHECK_T(CheckpointError, r.begin >= 0 && r.end > r.begin,
                   "shard blob: record of {} has the range [{}, {})", r.param, r.begin, r.end);
    const size_t fields = u(1);
    for (size_t f = 0; f < fields; ++f) {
      BlobField field;
      field.name = str();
      field.dtype = static_cast<DType>(u(1));
      field.offset = data(static_cast<size_t>(r.end - r.begin) * dtypeSize(field.dtype));
      r.fields.push_back(field);
    }
    return r;
  }

 private:
  void need(size_t n) const {
    DTRAIN_CHECK_T(CheckpointError, at_ + n <= n_, "shard blob: truncated at byte {} of {}", at_,
                   n_);
  }
  const uint8_t* p_;
  size_t n_;
  size_t at_ = 0;
};

void putRecordHead(BlobWriter& w, const std::string& optimizer, const std::string& param,
                   const std::vector<int64_t>& shape, int64_t begin, int64_t end,
                   std::optional<int64_t> step, size_t fields) {
  w.str(optimizer);
  w.str(param);
  w.u(shape.size(), 1);
  for (int64_t d : shape) w.u(static_cast<uint64_t>(d), 8);
  w.u(static_cast<uint64_t>(begin), 8);
  w.u(static_cast<uint64_t>(end), 8);
  w.u(step ? 1 : 0, 1);
  w.u(static_cast<uint64_t>(step.value_or(0)), 8);
  w.u(fields, 1);
}

std::vector<BlobRecord> decode(const uint8_t* p, size_t n) {
  BlobReader r(p, n);
  std::vector<BlobRecord> out;
  while (!r.done()) out.push_back(r.record());
  return out;
}

bool hasField(const std::vector<const Entry*>& fields, const std::string& name) {
  for (const Entry* e : fields) {
    if (e->name.size() > name.size() &&
        e->name.compare(e->name.size() - name.size() - 1, std::string::npos, "/" + name) == 0) {
      return true;
    }
  }
  return false;
}

// "optimizer/O/" of the sharded optimizer `name` starts, or nullptr.
const ShardedEntry* optimizerOf(const std::string& entry,
                                const std::vector<ShardedEntry>& sharded) {
  for (const auto& s : sharded) {
    if (entry.rfind(optimizerPrefix(s.name), 0) == 0) return &s;
  }
  return nullptr;
}

// The owned module entry of a freed parameter's range (Note [Stage-3 checkpoints]): the record's
// `master` bytes, or their rounding to the parameter's dtype.
Item moduleShardItem(uint32_t owner, const at::Tensor& blob, const BlobRecord& r,
                     const BlobField& master, const ModuleShard& module) {
  Item item;
  item.spec.name = module.entry;
  item.spec.kind = Kind::Tensor;
  item.spec.dtype = toFormatDType(module.dtype, module.entry);
  item.spec.shape = r.shape;
  item.spec.owner = owner;
  item.spec.elementOffset = static_cast<uint64_t>(r.begin);
  item.spec.elementCount = static_cast<uint64_t>(r.end - r.begin);
  const int64_t n = r.end - r.begin;
  const at::ScalarType saved = toScalarType(master.dtype);
  at::Tensor values = blob.narrow(0, static_cast<int64_t>(master.offset),
                                  n * static_cast<int64_t>(dtypeSize(master.dtype)));
  item.tensor = saved == module.dtype ? values : values.view(saved).to(module.dtype);
  return item;
}

}  // namespace

std::vector<std::vector<int>> shardKeepers(const std::vector<int>& nodeOf,
                                           const std::map<int, int>& writerOf) {
  std::vector<int> nodes;
  for (const auto& [node, w] : writerOf) nodes.push_back(node);
  std::vector<std::vector<int>> out;
  for (int node : nodeOf) {
    const size_t i = std::find(nodes.begin(), nodes.end(), node) - nodes.begin();
    const int prev = nodes[(i + nodes.size() - 1) % nodes.size()];
    std::vector<int> keepers = {writerOf.at(node)};
    if (prev != node) keepers.push_back(writerOf.at(prev));
    out.push_back(keepers);
  }
  return out;
}

at::Tensor encodeShards(const std::vector<ShardedEntry>& sharded) {
  std::vector<std::pair<std::string, ShardRecord>> records;
  for (const auto& s : sharded) {
    for (ShardRecord& r : s.optimizer->shardRecords()) {
      if (r.end > r.begin) records.emplace_back(s.name, std::move(r));
    }
  }
  at::NoGradGuard noGrad;
  return blobOf([&records](BlobWriter& w) {
    for (const auto& [optimizer, r] : records) {
      std::vector<std::pair<std::string, at::Tensor>> fields = {{"master", r.master}};
      fields.insert(fields.end(), r.state.begin(), r.state.end());
      putRecordHead(w, optimizer, r.param, r.shape, r.begin, r.end, r.step, fields.size());
      for (const auto& [name, t] : fields) {
        w.str(name);
        w.u(static_cast<uint64_t>(toFormatDType(t.scalar_type(), r.param + "/" + name)), 1);
        // Straight from the tensor, wherever it lives, into the blob: one copy.
        if (uint8_t* to = w.data(t.nbytes())) {
          at::from_blob(to, t.sizes(), t.options().device(at::kCPU)).copy_(t.detach());
        }
      }
    }
  });
}

std::vector<Item> shardItems(uint32_t owner, uint32_t world, const at::Tensor& blob,
                             const ModuleShards& freed) {
  std::vector<Item> items;
  const auto* base = blob.data_ptr<uint8_t>();
  const std::vector<BlobRecord> records = decode(base, static_cast<size_t>(blob.numel()));
  Item saver;
  saver.spec.name = kShardSaversEntry;
  saver.spec.kind = Kind::Tensor;
  saver.spec.dtype = DType::Int64;
  saver.spec.shape = {static_cast<int64_t>(world)};
  saver.spec.owner = owner;
  saver.spec.elementOffset = owner;
  saver.spec.elementCount = 1;
  saver.tensor = at::full({1}, static_cast<int64_t>(records.size()), at::kLong);
  items.push_back(std::move(saver));
  for (const BlobRecord& r : records) {
    const std::string at = optimizerPrefix(r.optimizer) + r.param + "/";
    auto module = freed.find({r.optimizer, r.param});
    for (const BlobField& f : r.fields) {
      if (f.name == "master" && module != freed.end()) {
        items.push_back(moduleShardItem(owner, blob, r, f, module->second));
        // The module entry holds these very bytes: Note [One copy of a freed master].
        if (toFormatDType(module->second.dtype, module->second.entry) == f.dtype) continue;
      }
      Item item;
      item.spec.name = at + f.name;
      item.spec.kind = Kind::Tensor;
      item.spec.dtype = f.dtype;
      item.spec.shape = r.shape;
      item.spec.owner = owner;
      item.spec.elementOffset = static_cast<uint64_t>(r.begin);
      item.spec.elementCount = static_cast<uint64_t>(r.end - r.begin);
      const int64_t bytes = (r.end - r.begin) * static_cast<int64_t>(dtypeSize(f.dtype));
      item.tensor = blob.narrow(0, static_cast<int64_t>(f.offset), bytes);
      items.push_back(std::move(item));
    }
    if (r.step) {
      Item item;
      item.spec.name = at + "step";
      item.spec.kind = Kind::Number;
      item.spec.dtype = DType::Int64;
      item.spec.owner = owner;
      item.tensor = at::scalar_tensor(*r.step, at::kLong);
      items.push_back(std::move(item));
    }
  }
  return items;
}

std::vector<Item> shardedReplicatedItems(const std::vector<ShardedEntry>& sharded) {
  std::vector<Item> items;
  for (const auto& s : sharded) {
    const std::string prefix = optimizerPrefix(s.name);
    Item type;
    type.spec.name = prefix + "type";
    type.spec.kind = Kind::String;
    type.spec.dtype = DType::UInt8;
    const std::string text = "sharded";
    type.bytes.assign(text.begin(), text.end());
    type.spec.shape = {static_cast<int64_t>(type.bytes.size())};
    items.push_back(std::move(type));
    std::vector<double> lrs;
    for (const auto& group : s.optimizer->param_groups()) lrs.push_back(group.options().get_lr());
    Item lr;
    lr.spec.name = prefix + "lr";
    lr.tensor = at::tensor(lrs, at::kDouble);
    lr.spec.dtype = DType::Float64;
    lr.spec.shape = {static_cast<int64_t>(lrs.size())};
    items.push_back(std::move(lr));
  }
  return items;
}

std::vector<uint32_t> shardOwners(const CheckpointReader& reader) {
  std::vector<uint32_t> out;
  for (const Entry& e : reader.entries()) {
    if (e.owner != kReplicated && e.kind == Kind::Tensor) out.push_back(e.owner);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

namespace {

// One record of rank `owner` in a checkpoint file: its fields' entries (a freed master's from its
// module entry) and its step's.
struct SavedRecord {
  std::string optimizer, param;
  const Entry* any = nullptr;  // one of its fields: the shape and range
  std::vector<std::pair<std::string, const Entry*>> fields;
  const Entry* step = nullptr;
  int64_t begin() const { return static_cast<int64_t>(any->elementOffset); }
  int64_t end() const { return begin() + static_cast<int64_t>(any->elementCount); }
};

std::vector<SavedRecord> savedRecords(const CheckpointReader& reader, uint32_t owner,
                                      const std::vector<ShardedEntry>& sharded,
                                      const ModuleShards& modules) {
  // (optimizer, parameter) -> its fields and step, in manifest order.
  struct Parts {
    const Entry* any = nullptr;
    std::vector<const Entry*> fields;
    const Entry* step = nullptr;
  };
  std::map<std::pair<std::string, std::string>, Parts> records;
  for (const Entry& e : reader.entries()) {
    if (e.owner != owner) continue;
    const ShardedEntry* s = optimizerOf(e.name, sharded);
    const size_t slash = e.name.rfind('/');
    if (!s || slash == std::string::npos) continue;
    const size_t from = optimizerPrefix(s->name).size();
    if (slash <= from) continue;
    Parts& p = records[{s->name, e.name.substr(from, slash - from)}];
    if (e.name.compare(slash + 1, std::string::npos, "step") == 0 && e.kind == Kind::Number) {
      p.step = &e;
    } else if (e.kind == Kind::Tensor) {
      DTRAIN_CHECK_T(CheckpointError,
                     !p.any || (p.any->elementOffset == e.elementOffset &&
                                p.any->elementCount == e.elementCount),
                     "checkpoint {}: the fields of \"{}\" of rank {} hold different ranges",
                     reader.name(), e.name, owner);
      p.any = &e;
      p.fields.push_back(&e);
    }
  }
  // A freed parameter's master saved only as its module entry (Note [One copy of a freed
  // master]): that entry is the master field.
  std::map<std::pair<std::string, std::string>, const Entry*> masters;
  for (const auto& [key, module] : modules) {
    auto it = records.find(key);
    if (it != records.end() && hasField(it->second.fields, "master")) continue;
    for (const Entry* e : reader.find(module.entry)) {
      if (e->owner != owner || e->kind != Kind::Tensor) continue;
      Parts& p = records[key];
      DTRAIN_CHECK_T(CheckpointError,
                     !p.any || (p.any->elementOffset == e->elementOffset &&
                                p.any->elementCount == e->elementCount),
                     "checkpoint {}: entry \"{}\" of rank {} holds another range than the "
                     "optimizer state of its parameter",
                     reader.name(), e->name, owner);
      if (!p.any) p.any = e;
      masters[key] = e;
    }
  }
  std::vector<SavedRecord> out;
  for (const auto& [key, p] : records) {
    if (!p.any) continue;
    SavedRecord r;
    r.optimizer = key.first;
    r.param = key.second;
    r.any = p.any;
    r.step = p.step;
    auto master = masters.find(key);
    if (master != masters.end()) r.fields.emplace_back("master", master->second);
    for (const Entry* e : p.fields)
      r.fields.emplace_back(e->name.substr(e->name.rfind('/') + 1), e);
    out.push_back(std::move(r));
  }
  return out;
}

std::optional<int64_t> readStep(const CheckpointReader& reader, const SavedRecord& r) {
  if (!r.step) return std::nullopt;
  DTRAIN_CHECK_T(CheckpointError, r.step->dtype == DType::Int64 && r.step->size == 8,
                 "checkpoint {}: entry \"{}\" is not an int64", reader.name(), r.step->name);
  int64_t v = 0;
  reader.read(*r.step, &v);
  return v;
}

}  // namespace

at::Tensor readShardBlob(const CheckpointReader& reader, uint32_t owner,
                         const std::vector<ShardedEntry>& sharded, const ModuleShards& modules) {
  std::vector<std::pair<SavedRecord, std::optional<int64_t>>> records;
  for (SavedRecord& r : savedRecords(reader, owner, sharded, modules)) {
    std::optional<int64_t> step = readStep(reader, r);
    records.emplace_back(std::move(r), step);
  }
  return blobOf([&](BlobWriter& w) {
    for (const auto& [r, step] : records) {
      putRecordHead(w, r.optimizer, r.param, r.any->shape, r.begin(), r.end(), step,
                    r.fields.size());
      for (const auto& [name, e] : r.fields) {
        w.str(name);
        w.u(static_cast<uint64_t>(e->dtype), 1);
        if (uint8_t* to = w.data(e->size)) reader.read(*e, to);
      }
    }
  });
}

void checkShardedRestorable(const CheckpointReader& reader,
                            const std::vector<ShardedEntry>& sharded) {
  for (const auto& s : sharded) {
    const std::string prefix = optimizerPrefix(s.name);
    auto type = reader.find(prefix + "type");
    std::string saved;
    if (!type.empty() && type[0]->kind == Kind::String) {
      std::vector<uint8_t> bytes(type[0]->size);
      reader.read(*type[0], bytes.data());
      saved.assign(bytes.begin(), bytes.end());
    }
    DTRAIN_CHECK_T(CheckpointError, saved == "sharded",
                   "checkpoint {}: optimizer \"{}\" was saved {}, but the one registered is a "
                   "ShardedOptimizer. HINT: register the same kind of optimizer as the run that "
                   "saved it",
                   reader.name(), s.name, saved.empty() ? "by no optimizer" : "as " + saved);
    auto lr = reader.find(prefix + "lr");
    const size_t groups = s.optimizer->param_groups().size();
    DTRAIN_CHECK_T(CheckpointError,
                   lr.size() == 1 && lr[0]->dtype == DType::Float64 &&
                       lr[0]->elementCount == groups,
                   "checkpoint {}: optimizer \"{}\" was saved with another number of parameter "
                   "groups than the {} of the one registered",
                   reader.name(), s.name, groups);
  }
}

void restoreShardedReplicated(const CheckpointReader& reader,
                              const std::vector<ShardedEntry>& sharded) {
  for (const auto& s : sharded) {
    const Entry& e = *reader.find(optimizerPrefix(s.name) + "lr")[0];
    std::vector<double> lrs(e.elementCount);
    reader.read(e, lrs.data());
    auto& groups = s.optimizer->param_groups();
    for (size_t g = 0; g < groups.size(); ++g) groups[g].options().set_lr(lrs[g]);
  }
}

ShardAssembly::ShardAssembly(const std::vector<ShardedEntry>& sharded) : sharded_(sharded) {
  for (const auto& s : sharded_) {
    for (const ShardRecord& r : s.optimizer->shardRecords()) {
      Need& need = needs_[{s.name, r.param}];
      need.begin = r.begin;
      need.end = r.end;
    }
  }
}

ShardAssembly::Overlap ShardAssembly::overlap(const std::string& optimizer,
                                              const std::string& param, int64_t begin,
                                              int64_t end) {
  auto it = needs_.find({optimizer, param});
  if (it == needs_.end()) return {};
  const int64_t lo = std::max(begin, it->second.begin), hi = std::min(end, it->second.end);
  return lo < hi ? Overlap{&it->second, lo, hi} : Overlap{};
}

uint8_t* ShardAssembly::place(Need& need, const std::string& param, const std::string& name,
                              DType dtype, int64_t element) {
  at::Tensor& into = need.fields[name];
  if (!into.defined()) into = at::empty({need.end - need.begin}, toScalarType(dtype));
  DTRAIN_CHECK_T(CheckpointError, static_cast<size_t>(into.element_size()) == dtypeSize(dtype),
                 "checkpoint: field {} of {} was saved with different dtypes", name, param);
  return static_cast<uint8_t*>(into.data_ptr()) + (element - need.begin) * dtypeSize(dtype);
}

void ShardAssembly::add(const uint8_t* blob, size_t size) {
  for (const BlobRecord& r : decode(blob, size)) {
    const Overlap o = overlap(r.optimizer, r.param, r.begin, r.end);
    if (!o.need) continue;
    if (r.step) o.need->step = r.step;
    for (const BlobField& f : r.fields) {
      const size_t es = dtypeSize(f.dtype);
      std::memcpy(place(*o.need, r.param, f.name, f.dtype, o.lo),
                  blob + f.offset + (o.lo - r.begin) * es, static_cast<size_t>(o.hi - o.lo) * es);
      o.need->covered[f.name] += o.hi - o.lo;
    }
  }
}

void ShardAssembly::read(const CheckpointReader& reader, uint32_t owner,
                         const ModuleShards& modules) {
  // What this owner covers is counted once all of it was read: a checksum failure half-way
  // leaves the counts as they were, and the records come again from a holder's blob (add()).
  std::vector<std::pair<int64_t*, int64_t>> covered;
  std::vector<std::pair<Need*, int64_t>> steps;
  const std::vector<SavedRecord> records = savedRecords(reader, owner, sharded_, modules);
  // Every entry this rank reads, asked for at once, up to the reader's bound (Note [Reading
  // ahead], reader.cpp).
  uint64_t asked = 0;
  const uint64_t budget = reader.readAheadBytes();
  for (const SavedRecord& r : records) {
    if (!overlap(r.optimizer, r.param, r.begin(), r.end()).need) continue;
    for (const auto& field : r.fields) {
      if (asked >= budget) break;
      reader.willRead(*field.second, budget - asked);
      asked += std::min(budget - asked, field.second->size);
    }
  }
  for (const SavedRecord& r : records) {
    const Overlap o = overlap(r.optimizer, r.param, r.begin(), r.end());
    if (!o.need) continue;
    if (auto step = readStep(reader, r)) steps.emplace_back(o.need, *step);
    for (const auto& [name, e] : r.fields) {
      const uint64_t es = dtypeSize(e->dtype);
      // Straight into place; of an entry wanted in part the rest only passes the checksum.
      reader.readPart(*e, static_cast<uint64_t>(o.lo - r.begin()) * es,
                      static_cast<uint64_t>(o.hi - o.lo) * es,
                      place(*o.need, r.param, name, e->dtype, o.lo));
      covered.emplace_back(&o.need->covered[name], o.hi - o.lo);
    }
  }
  for (auto& [count, n] : covered) *count += n;
  for (auto& [need, step] : steps) need->step = step;
}

std::string ShardAssembly::missing() const {
  for (const auto& [key, need] : needs_) {
    if (need.end <= need.begin) continue;  // a range of padding only: nothing to load
    if (!need.covered.count("master")) {
      return fmt::format("optimizer \"{}\": the checkpoint holds no shard of parameter {} "
                         "(another model?)",
                         key.first, key.second);
    }
    for (const auto& [field, n] : need.covered) {
      if (n != need.end - need.begin) {
        return fmt::format("optimizer \"{}\": the shards of {} of parameter {} cover {} of "
                           "elements [{}, {})",
                           key.first, field, key.second, n, need.begin, need.end);
      }
    }
  }
  return "";
}

void ShardAssembly::load() {
  for (const auto& s : sharded_) {
    const std::string name = s.name;
    s.optimizer->loadShardState([this, name](const ShardField& what, at::Tensor& out) {
      auto it = needs_.find({name, what.param});
      if (it == needs_.end()) return false;
      const Need& need = it->second;
      if (what.end <= what.begin) return what.field == "master";  // no elements: nothing to read
      if (what.field == "step") {
        if (!need.step) return false;
        out.fill_(*need.step);
        return true;
      }
      auto f = need.fields.find(what.field);
      if (f == need.fields.end()) return false;
      out.copy_(f->second.narrow(0, what.begin - need.begin, what.end - what.begin));
      return true;
    });
  }
}

}  // namespace dtrain::checkpoint
