#pragma once
// Small checkpoint files for the torch-free checkpoint tests, the crash-point helper and the
// fuzz corpus: every kind of entry, a sharded tensor, and padding between entries.

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/file_io.h"
#include "checkpoint/format.h"

namespace dtrain::testing {

// The entries of a sample checkpoint of `step`, with `payload` bytes in its largest tensor.
struct SampleCheckpoint {
  checkpoint::Layout layout;
  std::vector<std::vector<uint8_t>> data;  // per entry
  checkpoint::EntryData pointers() const;
};
SampleCheckpoint sampleCheckpoint(int64_t step, size_t payload = 1000);

// Writes the sample of `step` at `path` (a whole file, fsynced); returns its layout with checksums.
checkpoint::Layout writeSample(checkpoint::FileOps& ops, const std::string& path, int64_t step,
                               size_t payload = 1000);

// The bytes of a sample file of `step`.
std::vector<uint8_t> sampleFileBytes(int64_t step, size_t payload = 1000);

// Reads and fully verifies `path`; "" when intact, else the error.
std::string verifyError(const std::string& path);

}  // namespace dtrain::testing
