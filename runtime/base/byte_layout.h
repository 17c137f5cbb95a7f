#pragma once
// How dtrain lays out the bytes of its own formats (store frames, checkpoint files, the sampler's
// state, the shared-memory segment): integers little-endian whatever the host's order, offsets
// rounded up to an alignment. Internal to this tree; not installed.

#include <cstddef>
#include <cstdint>

namespace dtrain {

// Writes the low `bytes` (1-8) bytes of `value` at `p`, least significant first.
inline void putLE(uint8_t* p, uint64_t value, size_t bytes = 8) {
  for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(value >> (8 * i));
}

// Reads a `bytes`-byte (1-8) little-endian integer at `p`.
inline uint64_t getLE(const uint8_t* p, size_t bytes = 8) {
  uint64_t value = 0;
  for (size_t i = 0; i < bytes; ++i) value |= uint64_t{p[i]} << (8 * i);
  return value;
}

// The least multiple of `align` (> 0) that is >= `value`.
constexpr uint64_t roundUp(uint64_t value, uint64_t align) {
  return (value + align - 1) / align * align;
}

}  // namespace dtrain
