#pragma once
// The NCCL_* (and GLOO_SOCKET_IFNAME) variables launch sets on each node: --nccl-socket-ifname
// (default auto: docs/design.md's interface rule, never `lo` for a multi-node job),
// --nccl-ib-disable,
// --nccl-debug LEVEL, --nccl-debug-subsys LIST. A variable the user set -- in the environment,
// `.dtrain_env` or --env -- always wins over launch's choice.

#include <map>
#include <string>

#include "launcher/config/nccl_options.h"

namespace dtrain::launcher {

// What the interface rule found on one node (see resolveSocketInterface).
struct InterfaceChoice {
  std::string name;     // empty: leave NCCL_SOCKET_IFNAME unset (one node, auto)
  std::string address;  // its IPv4 address, for messages and --check
  std::string reason;
};

// Pure: the interface to use. `ownerOfStoreAddress` is the interface holding the store's
// address on this node (empty when none does: the store is elsewhere); `routeInterface` the one
// holding the source address of the route toward it. Throws InvalidArgument naming `label` when
// a multi-node job would end up on loopback.
InterfaceChoice pickSocketInterface(const NcclOptions& options, bool multiNode,
                                    const std::string& storeAddress,
                                    const std::string& ownerOfStoreAddress,
                                    const std::string& routeInterface,
                                    const std::string& routeAddress, const std::string& label);

// The same, looking at this machine's interfaces and routes.
InterfaceChoice resolveSocketInterface(const NcclOptions& options, bool multiNode,
                                       const std::string& storeAddress, const std::string& label);

// The variables to add for `options` and `iface`, leaving out any the user set in `userEnv`.
std::map<std::string, std::string> ncclEnvironment(
    const NcclOptions& options, const InterfaceChoice& iface,
    const std::map<std::string, std::string>& userEnv);

}  // namespace dtrain::launcher
