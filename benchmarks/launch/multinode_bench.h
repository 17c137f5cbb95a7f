#pragma once
// launch_bench --multinode: see multinode_bench.cpp.

#include <string>

namespace dtrain::bench {

struct MultinodeBenchOptions {
  int reps = 7;
  bool torchrun = true;
  std::string launch;
  std::string worker;
  std::string python = DTRAIN_PYTHON;
  std::string torchrunPath = DTRAIN_TORCHRUN;
  std::string clusterScript;
};

// Needs root (network namespaces, sshd). Prints the table; returns 0 when every run worked.
int multinodeBench(const MultinodeBenchOptions& o);

}  // namespace dtrain::bench
