// TensorBoard event records: protobuf fields and TFRecord framing by hand (Note [TensorBoard event
// files] in event_file.h).
#include "metrics/event_file.h"

#include <cstring>
#include <limits>

#include <isa-l/crc.h>

#include "byte_layout.h"

namespace dtrain::metrics::tensorboard {
namespace {

// Protobuf wire types.
constexpr uint32_t kVarint = 0;
constexpr uint32_t kFixed64 = 1;
constexpr uint32_t kLengthDelimited = 2;
constexpr uint32_t kFixed32 = 5;

void putVarint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void putKey(std::string& out, uint32_t field, uint32_t wireType) {
  putVarint(out, (uint64_t{field} << 3) | wireType);
}

void putFixed(std::string& out, uint64_t value, size_t bytes) {
  uint8_t buffer[8];
  putLE(buffer, value, bytes);
  out.append(reinterpret_cast<const char*>(buffer), bytes);
}

void putBytes(std::string& out, uint32_t field, std::string_view bytes) {
  putKey(out, field, kLengthDelimited);
  putVarint(out, bytes.size());
  out.append(bytes.data(), bytes.size());
}

void putDouble(std::string& out, uint32_t field, double value) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  putKey(out, field, kFixed64);
  putFixed(out, bits, 8);
}

void putFloat(std::string& out, uint32_t field, float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  putKey(out, field, kFixed32);
  putFixed(out, bits, 4);
}

// int64 is a plain varint of the two's-complement value (not zigzag): -1 takes 10 bytes.
void putInt64(std::string& out, uint32_t field, int64_t value) {
  putKey(out, field, kVarint);
  putVarint(out, static_cast<uint64_t>(value));
}

// Field numbers of tensorboard.Event, Summary and Summary.Value.
constexpr uint32_t kEventWallTime = 1;
constexpr uint32_t kEventStep = 2;
constexpr uint32_t kEventFileVersion = 3;
constexpr uint32_t kEventSummary = 5;
constexpr uint32_t kSummaryValue = 1;
constexpr uint32_t kValueTag = 1;
constexpr uint32_t kValueSimpleValue = 2;

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  // crc32_iscsi takes an int length and no final inversion: chunks, then the usual ~.
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  uint32_t crc = 0xffffffffu;
  constexpr size_t kChunk = std::numeric_limits<int>::max() / 2;
  while (size > 0) {
    const size_t n = size < kChunk ? size : kChunk;
    crc = crc32_iscsi(p, static_cast<int>(n), crc);
    p += n;
    size -= n;
  }
  return crc ^ 0xffffffffu;
}

uint32_t maskedCrc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string frameRecord(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  uint8_t length[8];
  putLE(length, data.size(), 8);
  out.append(reinterpret_cast<const char*>(length), 8);
  putFixed(out, maskedCrc32c(length, 8), 4);
  out.append(data.data(), data.size());
  putFixed(out, maskedCrc32c(data.data(), data.size()), 4);
  return out;
}

std::string fileVersionEvent(double wallTime) {
  std::string event;
  putDouble(event, kEventWallTime, wallTime);
  putInt64(event, kEventStep, 0);
  putBytes(event, kEventFileVersion, kFileVersion);
  return event;
}

std::string scalarsEvent(double wallTime, int64_t step, const std::vector<Scalar>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    putBytes(v, kValueTag, tag);
    putFloat(v, kValueSimpleValue, value);
    putBytes(summary, kSummaryValue, v);
  }
  std::string event;
  putDouble(event, kEventWallTime, wallTime);
  putInt64(event, kEventStep, step);
  putBytes(event, kEventSummary, summary);
  return event;
}

}  // namespace dtrain::metrics::tensorboard
