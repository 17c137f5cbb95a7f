#pragma once
// One input of the checkpoint reader's fuzz target: shared by the libFuzzer binary
// (checkpoint_reader_fuzz.cpp, scripts/fuzz.sh) and the unit test that replays the corpus
// (tests/unit/checkpoint_format_test.cpp). Arbitrary bytes go through the reader as a file would;
// the only acceptable outcomes are a CheckpointError or a file whose every promise holds:
//   - every entry's data lies inside the input, aligned, and reading it touches only its bytes;
//   - the manifest re-encodes to exactly the bytes it came from (one encoding per file);
//   - verify() and read() agree with the checksums.
// Anything else -- another exception type, a crash, an allocation beyond the input -- is a bug.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "checkpoint/format.h"
#include "dtrain/error.h"

namespace dtrain::fuzz {

inline void fuzzCheckpointReader(const uint8_t* data, size_t size) {
  using namespace dtrain::checkpoint;
  auto check = [](bool ok) {
    if (!ok) std::abort();
  };
  try {
    CheckpointReader reader(memorySource(data, size, "fuzz input"));
    const Header& h = reader.header();
    check(h.fileSize == size);
    for (const Entry& e : reader.entries()) {
      check(e.offset % kDataAlignment == 0 && e.offset >= h.dataOffset);
      check(e.offset <= size && e.size <= size - e.offset);
    }
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
