#include "collective.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace dtrain::comm {

// Note [Tags]
// Every message of a collective carries a tag that mixes the collective's sequence number with
// its kind, type, count, reduction and root. Two ranks exchange data only when their tags agree,
// so a rank that skipped a collective (sequence numbers differ) or passes a buffer of another
// size never mixes its data into a peer's result: both sides wait, time out, and the failure
// report (failure_report.h) says which rank is where. The shape is left out on purpose: two
// tensors of the same size and type but different shapes reduce correctly. The caller's label
// is in (CallOptions::label): ZeRO-3's gathers of two units of the same size differ only there.

const char* collectiveKindName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::Allreduce: return "allreduce";
    case CollectiveKind::Broadcast: return "broadcast";
    case CollectiveKind::Allgather: return "allgather";
    case CollectiveKind::ReduceScatter: return "reduceScatter";
    case CollectiveKind::Barrier: return "barrier";
  }
  return "collective";
}

namespace {
CollectiveInfo make(CollectiveKind kind, DataType dtype, size_t count) {
  CollectiveInfo info;
  info.kind = kind;
  info.dtype = dtype;
  info.count = count;
  return info;
}
}  // namespace

// Note [Payload bytes]
// Communicator::payloadBytes() counts what a bandwidth-optimal algorithm sends per rank, not what
// this backend happens to put on a wire: the shared-memory backend sends nothing (peers read the
// segment), Gloo's direct exchange at two ranks sends the whole buffer, a ring 2(n-1)/n of it.
// The bus bytes of nccl-tests are that algorithm's bytes, and the same on every backend, so
// two ways of training can be compared on any machine: DDP's allreduce of B bytes counts
// 2(n-1)/n B, ZeRO's reduce-scatter and allgather of the same B (n-1)/n B each. Counted when the
// collective is issued.
uint64_t payloadBytes(const CollectiveInfo& info, int ranks) {
  if (ranks <= 1) return 0;
  const uint64_t n = static_cast<uint64_t>(ranks);
  const uint64_t bytes = info.count * elementSize(info.dtype);
  switch (info.kind) {
    case CollectiveKind::Allreduce: return 2 * (n - 1) * bytes / n;
    case CollectiveKind::Allgather:
    case CollectiveKind::ReduceScatter: return (n - 1) * bytes;  // count is per rank
    case CollectiveKind::Broadcast: return bytes;
    case CollectiveKind::Barrier: return 0;
  }
  return 0;
}

CollectiveInfo wrongShape(CollectiveInfo info) {
  if (info.count == 0) return info;
  if (!info.shape.empty() && info.shape.back() > 1) {
    info.count = info.count / static_cast<size_t>(info.shape.back()) *
                 static_cast<size_t>(info.shape.back() - 1);
    info.shape.back() -= 1;
  } else {
    info.count -= 1;
    info.shape.clear();
  }
  return info;
}

CollectiveInfo CollectiveInfo::allreduce(DataType dtype, size_t count, ReduceOp op) {
  CollectiveInfo info = make(CollectiveKind::Allreduce, dtype, count);
  info.op = op;
  return info;
}

CollectiveInfo CollectiveInfo::broadcast(DataType dtype, size_t count, int root) {
  CollectiveInfo info = make(CollectiveKind::Broadcast, dtype, count);
  info.root = root;
  return info;
}

CollectiveInfo CollectiveInfo::allgather(DataType dtype, size_t count) {
  return make(CollectiveKind::Allgather, dtype, count);
}

CollectiveInfo CollectiveInfo::reduceScatter(DataType dtype, size_t count, ReduceOp op) {
  CollectiveInfo info = make(CollectiveKind::ReduceScatter, dtype, count);
  info.op = op;
  return info;
}

CollectiveInfo CollectiveInfo::barrier() { return CollectiveInfo{}; }

std::string CollectiveInfo::describe() const {
  if (kind == CollectiveKind::Barrier) return "barrier()";
  std::string size = shape.empty() ? fmt::format("x {}", count)
                                   : fmt::format("[{}]", fmt::join(shape, ", "));
  std::string text = fmt::format("{}({} {}", collectiveKindName(kind), dataTypeName(dtype), size);
  if (kind == CollectiveKind::Allreduce || kind == CollectiveKind::ReduceScatter) {
    text += fmt::format(", {}", reduceOpName(op));
  }
  if (kind == CollectiveKind::Broadcast) text += fmt::format(", root {}", root);
  text += ")";
  if (!label.empty()) text += fmt::format(" [{}]", label);
  return text;
}

std::string CollectiveInfo::describeWithSeq() const {
  return fmt::format("seq {} {}", seq, describe());
}

uint32_t CollectiveInfo::tag() const {
  // FNV-1a over the fields; cheap and well mixed enough to tell collectives apart.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xffu;
      h *= 1099511628211ull;
    }
  };
  mix(seq);
  mix(static_cast<uint64_t>(kind));
  mix(static_cast<uint64_t>(dtype));
  mix(static_cast<uint64_t>(op));
  mix(count);
  mix(static_cast<uint64_t>(static_cast<int64_t>(root)));
  for (size_t i = 0; i < label.size() && i < CallOptions::kMaxLabelBytes; ++i) {
    mix(static_cast<unsigned char>(label[i]));
  }
  return static_cast<uint32_t>(h ^ (h >> 32));
}

Fingerprint Fingerprint::of(const CollectiveInfo& info) {
  Fingerprint f;
  std::memset(&f, 0, sizeof(f));
  f.seq = info.seq;
  f.count = info.count;
  f.kind = static_cast<uint8_t>(info.kind);
  f.dtype = static_cast<uint8_t>(info.dtype);
  f.op = static_cast<uint8_t>(info.op);
  f.root = info.root;
  std::memcpy(f.label, info.label.data(), std::min(info.label.size(), CallOptions::kMaxLabelBytes));
  if (info.shape.empty() || info.shape.size() > static_cast<size_t>(kMaxDims)) {
    f.ndim = -1;
  } else {
    f.ndim = static_cast<int32_t>(info.shape.size());
    for (size_t i = 0; i < info.shape.size(); ++i) f.dims[i] = info.shape[i];
  }
  return f;
}

CollectiveInfo Fingerprint::toInfo() const {
  CollectiveInfo info;
  info.seq = seq;
  info.count = count;
  info.kind = static_cast<CollectiveKind>(kind);
  info.dtype = static_cast<DataType>(dtype);
  info.op = static_cast<ReduceOp>(op);
  info.root = root;
  info.label.assign(label, strnlen(label, CallOptions::kMaxLabelBytes));
  for (int i = 0; i < ndim && i < kMaxDims; ++i) info.shape.push_back(dims[i]);
  return info;
}

bool Fingerprint::sameCollective(const Fingerprint& o) const {
  if (kind != o.kind || dtype != o.dtype || op != o.op || count != o.count || root != o.root ||
      std::strncmp(label, o.label, sizeof(label)) != 0) {
    return false;
  }
  if (ndim < 0 || o.ndim < 0) return true;
  if (ndim != o.ndim) return false;
  for (int i = 0; i < ndim; ++i) {
    if (dims[i] != o.dims[i]) return false;
  }
  return true;
}

}  // namespace dtrain::comm
