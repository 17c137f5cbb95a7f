#pragma once
// One input of the checkpoint reader's fuzz target: shared by the libFuzzer binary
// (checkpoint_reader_fuzz.cpp, scripts/fuzz.sh) and the unit test that replays the corpus
// (tests/base/checkpoint/checkpoint_format_test.cpp).
// Arbitrary bytes go through the reader as a file would;
// the only acceptable outcomes are a CheckpointError or a file whose every promise holds:
//   - every entry's data lies inside the input, aligned, and reading it touches only its bytes;
//   - no two non-empty entries share a byte;
//   - the manifest re-encodes to exactly the bytes it came from (one encoding per file);
//   - verify() and read() agree with the checksums.
// Anything else -- another exception type, a crash, an allocation beyond the input -- is a bug.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "byte_layout.h"
#include "checkpoint/format.h"
#include "dtrain/base/error.h"

namespace dtrain::fuzz {

namespace detail {

// Recomputes the manifest's and the header's checksums, so that mutations reach the checks
// behind them (a fuzzer cannot guess an XXH3).
inline void resign(std::vector<uint8_t>& b) {
  using namespace dtrain::checkpoint;
  if (b.size() < kHeaderSize) return;
  uint64_t offset = getLE(&b[72]), size = getLE(&b[80]);
  if (offset <= b.size() && size <= b.size() - offset)
    putLE(&b[96], checksum(b.data() + offset, size));
  putLE(&b[120], checksum(b.data(), 120));
}

}  // namespace detail

inline void checkCheckpointBytes(const uint8_t* data, size_t size);

// Three passes per input: as it is; with the header's and manifest's checksums recomputed; and,
// when that parses, with every entry's checksum recomputed too, so that the deepest checks and
// the read paths are reached.
inline void fuzzCheckpointReader(const uint8_t* data, size_t size) {
  using namespace dtrain::checkpoint;
  checkCheckpointBytes(data, size);
  if (size < kHeaderSize) return;
  std::vector<uint8_t> b(data, data + size);
  detail::resign(b);
  checkCheckpointBytes(b.data(), b.size());
  try {
    CheckpointReader reader(memorySource(b.data(), b.size(), "fuzz input"));
    std::vector<Entry> entries = reader.entries();
    for (auto& e : entries) e.checksum = checksum(b.data() + e.offset, e.size);
    auto manifest = encodeManifest(entries);
    std::memcpy(b.data() + reader.header().manifestOffset, manifest.data(), manifest.size());
  } catch (const dtrain::CheckpointError&) {
    return;
  }
  detail::resign(b);
  checkCheckpointBytes(b.data(), b.size());
}

inline void checkCheckpointBytes(const uint8_t* data, size_t size) {
  using namespace dtrain::checkpoint;
  auto check = [](bool ok) {
    if (!ok) std::abort();
  };
  try {
    CheckpointReader reader(memorySource(data, size, "fuzz input"));
    const Header& h = reader.header();
    check(h.fileSize == size);
    std::vector<std::pair<uint64_t, uint64_t>> spans;  // [offset, end) of non-empty entries
    for (const Entry& e : reader.entries()) {
      check(e.offset % kDataAlignment == 0 && e.offset >= h.dataOffset);
      check(e.offset <= size && e.size <= size - e.offset);
      if (e.size) spans.emplace_back(e.offset, e.offset + e.size);
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) check(spans[i - 1].second <= spans[i].first);
    auto manifest = encodeManifest(reader.entries());
    check(manifest.size() == h.manifestSize &&
          std::memcmp(manifest.data(), data + h.manifestOffset, manifest.size()) == 0);
    reader.verify();
    for (const Entry& e : reader.entries()) {
      std::vector<uint8_t> out(e.size);
      reader.read(e, out.data());
      check(e.size == 0 || std::memcmp(out.data(), data + e.offset, e.size) == 0);
    }
  } catch (const dtrain::CheckpointError&) {
    // A clean refusal.
  }
}

}  // namespace dtrain::fuzz
