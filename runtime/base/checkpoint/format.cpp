#include "checkpoint/format.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <xxhash.h>

#include "byte_layout.h"
#include "dtrain/base/error.h"

namespace dtrain::checkpoint {

namespace {

std::string shapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

}  // namespace

size_t dtypeSize(DType dtype) {
  switch (dtype) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Float16: return 2;
    case DType::BFloat16: return 2;
    case DType::Int8: return 1;
    case DType::UInt8: return 1;
    case DType::Int16: return 2;
    case DType::Int32: return 4;
    case DType::Int64: return 8;
    case DType::Bool: return 1;
    case DType::Complex64: return 8;
    case DType::Complex128: return 16;
  }
  return 0;
}

const char* dtypeName(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Int8: return "int8";
    case DType::UInt8: return "uint8";
    case DType::Int16: return "int16";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::Bool: return "bool";
    case DType::Complex64: return "complex64";
    case DType::Complex128: return "complex128";
  }
  return "unknown";
}

const char* kindName(Kind kind) {
  switch (kind) {
    case Kind::Tensor: return "tensor";
    case Kind::String: return "string";
    case Kind::Bytes: return "bytes";
    case Kind::Number: return "number";
  }
  return "unknown";
}

uint64_t Entry::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

bool Entry::isShard() const { return elementOffset != 0 || elementCount != numel(); }

std::string Entry::describe() const {
  std::string out = fmt::format("{} \"{}\" {} {}", kindName(kind), name, dtypeName(dtype),
                                shapeText(shape));
  if (owner != kReplicated) out += fmt::format(" of rank {}", owner);
  if (isShard())
    out += fmt::format(" (elements {}..{})", elementOffset, elementOffset + elementCount);
  return out;
}

uint64_t checksum(const void* data, size_t size) { return XXH3_64bits(data, size); }

Layout planLayout(int64_t step, int64_t epoch, uint32_t worldSize, const std::string& torchVersion,
                  const std::vector<EntrySpec>& specs) {
  DTRAIN_CHECK_ARG(step >= 0 && epoch >= 0, "checkpoint: step {} and epoch {} must be >= 0", step,
                   epoch);
  DTRAIN_CHECK_ARG(worldSize >= 1, "checkpoint: world size {} must be >= 1", worldSize);
  Layout layout;
  layout.header.step = step;
  layout.header.epoch = epoch;
  layout.header.worldSize = worldSize;
  layout.header.torchVersion = torchVersion.substr(0, 16);
  uint64_t offset = kHeaderSize;
  for (const auto& spec : specs) {
    DTRAIN_CHECK_ARG(!spec.name.empty() && spec.name.size() <= kMaxNameBytes,
                     "checkpoint: entry name \"{}\" must have 1..{} bytes", spec.name.substr(0, 80),
                     kMaxNameBytes);
    DTRAIN_CHECK_ARG(spec.shape.size() <= kMaxDims,
                     "checkpoint: entry \"{}\" has {} dimensions (at most {})", spec.name,
                     spec.shape.size(), kMaxDims);
    Entry e;
    e.name = spec.name;
    e.kind = spec.kind;
    e.dtype = spec.dtype;
    e.shape = spec.shape;
    e.owner = spec.owner;
    e.elementOffset = spec.elementOffset;
    e.elementCount = spec.elementCount ? spec.elementCount : e.numel() - spec.elementOffset;
    e.offset = offset;
    e.size = e.elementCount * dtypeSize(e.dtype);
    offset = roundUp(offset + e.size, kDataAlignment);
    layout.entries.push_back(std::move(e));
  }
  layout.header.dataOffset = kHeaderSize;
  layout.header.dataSize = offset - kHeaderSize;
  layout.header.manifestOffset = offset;
  layout.header.entryCount = layout.entries.size();
  return layout;
}

std::vector<uint8_t> encodeManifest(const std::vector<Entry>& entries) {
  size_t total = 0;
  for (const auto& e : entries) {
    total += roundUp(kRecordFixedSize + 8 * e.shape.size() + e.name.size(), 8);
  }
  std::vector<uint8_t> out(total, 0);
  size_t at = 0;
  for (const auto& e : entries) {
    putLE(out.data() + at + 0, e.name.size(), 2);
    out[at + 2] = static_cast<uint8_t>(e.kind);
    out[at + 3] = static_cast<uint8_t>(e.dtype);
    out[at + 4] = static_cast<uint8_t>(e.shape.size());
    putLE(out.data() + at + 8, e.owner, 4);
    putLE(out.data() + at + 16, e.elementOffset, 8);
    putLE(out.data() + at + 24, e.elementCount, 8);
    putLE(out.data() + at + 32, e.offset, 8);
    putLE(out.data() + at + 40, e.size, 8);
    putLE(out.data() + at + 48, e.checksum, 8);
    size_t p = at + kRecordFixedSize;
    for (int64_t d : e.shape) {
      putLE(out.data() + p, static_cast<uint64_t>(d), 8);
      p += 8;
    }
    std::memcpy(out.data() + p, e.name.data(), e.name.size());
    at += roundUp(kRecordFixedSize + 8 * e.shape.size() + e.name.size(), 8);
  }
  return out;
}

std::vector<uint8_t> encodeHeader(Header& h, const std::vector<uint8_t>& manifest) {
  h.manifestSize = manifest.size();
  h.manifestChecksum = checksum(manifest.data(), manifest.size());
  h.fileSize = h.manifestOffset + h.manifestSize;
  std::vector<uint8_t> out(kHeaderSize, 0);
  std::memcpy(out.data(), kMagic, sizeof(kMagic));
  putLE(out.data() + 8, kFormatVersion, 4);
  putLE(out.data() + 12, kHeaderSize, 4);
  putLE(out.data() + 16, static_cast<uint64_t>(h.step), 8);
  putLE(out.data() + 24, static_cast<uint64_t>(h.epoch), 8);
  putLE(out.data() + 32, h.worldSize, 4);
  std::memcpy(out.data() + 40, h.torchVersion.data(), std::min<size_t>(16, h.torchVersion.size()));
  putLE(out.data() + 56, h.dataOffset, 8);
  putLE(out.data() + 64, h.dataSize, 8);
  putLE(out.data() + 72, h.manifestOffset, 8);
  putLE(out.data() + 80, h.manifestSize, 8);
  putLE(out.data() + 88, h.entryCount, 8);
  putLE(out.data() + 96, h.manifestChecksum, 8);
  putLE(out.data() + 104, h.fileSize, 8);
  putLE(out.data() + 120, checksum(out.data(), 120), 8);
  return out;
}

}  // namespace dtrain::checkpoint
