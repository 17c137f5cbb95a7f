// libFuzzer target (scripts/fuzz.sh): arbitrary bytes through the checkpoint reader. See
// checkpoint_fuzz_target.h for what is checked beyond "no crash, no leak, no UB".
#include <cstddef>
#include <cstdint>

#include "checkpoint_fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dtrain::fuzz::fuzzCheckpointReader(data, size);
  return 0;
}
