#pragma once
// The NCCL options of a launch (--nccl-socket-ifname, --nccl-ib-disable, --nccl-debug,
// --nccl-debug-subsys), as LaunchConfig holds them. What they turn into on a node -- the interface
// rule and the variables -- is launcher/node/nccl_env.h.

#include <string>

namespace dtrain::launcher {

constexpr const char* kAutoInterface = "auto";

struct NcclOptions {
  std::string socketIfname = kAutoInterface;  // a name, a NCCL list ("^docker,lo"), or auto
  bool ibDisable = false;
  std::string debug;        // NCCL_DEBUG; empty: not set
  std::string debugSubsys;  // NCCL_DEBUG_SUBSYS; empty: not set
};

}  // namespace dtrain::launcher
