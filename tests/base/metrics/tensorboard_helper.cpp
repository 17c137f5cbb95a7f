// Opens a TensorBoardSink as a separate process, for the tests that start it with an LD_PRELOAD
// library (flock_errno_shim: a filesystem without file locks) or beside a live writer:
//
//   tensorboard_helper DIR
//
// Opens DIR as launch --tensorboard-dir does and writes one record (wall time 1700000000.25,
// step 42, "loss" 0.125 of rank 1 on node-a). Exit 0 when both succeeded; 2 when open() refused
// the directory, 1 when the write failed (the error on stderr either way).
#include <cstdio>

#include "dtrain/base/error.h"
#include "dtrain/base/tensorboard.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: tensorboard_helper DIR\n");
    return 2;
  }
  std::shared_ptr<dtrain::metrics::TensorBoardSink> sink;
  try {
    sink = dtrain::metrics::TensorBoardSink::open(argv[1], "--tensorboard-dir");
  } catch (const dtrain::InvalidArgument& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  try {
    dtrain::metrics::Record r;
    r.time = 1700000000.25;
    r.node = "node-a";
    r.rank = 1;
    r.step = 42;
    r.fields = {{"loss", 0.125}};
    sink->write(r);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
