// Runs checkpoint saves as a separate process, for the tests that kill it at every I/O call
// (DTRAIN_IO_FAULT=crash@io=K) or run it on a small tmpfs in a private mount namespace:
//
//   checkpoint_io_helper DIR FIRST_STEP LAST_STEP PAYLOAD_BYTES KEEP_LAST
//
// Saves steps FIRST..LAST with the code path of a Checkpointer (saveStep + writeCheckpointFile),
// printing "committed N" after each, then one summary line of what the directory holds:
//   state calls=C steps=5,4 latest=5 temporaries=0 verified=ok
// ("verified=" is followed by the first error when a committed file does not verify). Exit 0 when
// every save succeeded, 1 when one failed (its error on stderr), 2 on bad arguments.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "checkpoint_file_support.h"

int main(int argc, char** argv) {
  using namespace dtrain::checkpoint;
  if (argc != 6) {
    std::fprintf(stderr, "usage: checkpoint_io_helper DIR FIRST LAST PAYLOAD KEEP\n");
    return 2;
  }
  std::string dir = argv[1];
  long first = std::atol(argv[2]), last = std::atol(argv[3]);
  size_t payload = std::strtoul(argv[4], nullptr, 10);
  int keep = std::atoi(argv[5]);
  FileOps ops;  // DTRAIN_IO_FAULT
  int rc = 0;
  for (long step = first; step <= last; ++step) {
    try {
      saveStep(ops, dir, step, keep, [&](const std::string& tmp) {
        dtrain::testing::writeSample(ops, tmp, step, payload);
      });
      std::printf("committed %ld\n", step);
      std::fflush(stdout);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      rc = 1;
      break;
    }
  }
  auto listing = listDirectory(dir);
  std::string steps, verified = "ok";
  for (auto s : listing.steps) {
    steps += (steps.empty() ? "" : ",") + std::to_string(s);
    std::string error = dtrain::testing::verifyError(dir + "/" + stepFileName(s));
    if (!error.empty() && verified == "ok") verified = error;
  }
  std::printf("state calls=%lld steps=%s latest=%lld temporaries=%zu verified=%s\n",
              static_cast<long long>(ops.calls()), steps.c_str(),
              static_cast<long long>(listing.latest.value_or(-1)), listing.temporaries.size(),
              verified.c_str());
  return rc;
}
