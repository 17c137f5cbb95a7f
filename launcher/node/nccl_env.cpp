#include "launcher/node/nccl_env.h"

#include "dtrain/base/error.h"
#include "net/net_interface.h"

namespace dtrain::launcher {

InterfaceChoice pickSocketInterface(const NcclOptions& options, bool multiNode,
                                    const std::string& storeAddress,
                                    const std::string& ownerOfStoreAddress,
                                    const std::string& routeInterface,
                                    const std::string& routeAddress, const std::string& label) {
  InterfaceChoice c;
  if (options.socketIfname != kAutoInterface) {
    c.name = options.socketIfname;
    c.reason = label;
    return c;
  }
  if (!multiNode || net::isLoopbackHost(storeAddress)) {
    // A store on loopback: every node of the job is this machine.
    c.reason = "one machine: NCCL picks its own interface";
    return c;
  }
  if (!ownerOfStoreAddress.empty()) {
    c.name = ownerOfStoreAddress;
    c.address = storeAddress;
    c.reason = "this node hosts the store at " + storeAddress;
  } else {
    c.name = routeInterface;
    c.address = routeAddress;
    c.reason = "the route toward the store at " + storeAddress;
  }
  DTRAIN_CHECK_ARG(!c.name.empty() && c.name != "lo",
                   "{} auto: a multi-node job would use {} ({}), which other nodes cannot "
                   "reach; HINT: give --rdzv-endpoint a routable address of the master, or "
                   "--nccl-socket-ifname IFACE (`ip -4 addr` lists them)",
                   label, c.name.empty() ? "no interface" : "interface " + c.name, c.reason);
  return c;
}

InterfaceChoice resolveSocketInterface(const NcclOptions& options, bool multiNode,
                                       const std::string& storeAddress, const std::string& label) {
  if (options.socketIfname != kAutoInterface || !multiNode || net::isLoopbackHost(storeAddress)) {
    InterfaceChoice c = pickSocketInterface(options, multiNode, storeAddress, "", "", "", label);
    if (!c.name.empty() && c.name.find_first_of("^=,") == std::string::npos) {
      c.address = net::interfaceAddress(c.name);
      DTRAIN_CHECK_ARG(!c.address.empty(),
                       "{} {}: no such interface with an IPv4 address on "
                       "this node; HINT: `ip -4 addr` lists them",
                       label, c.name);
    }
    return c;
  }
  const std::string owner = net::interfaceOfAddress(storeAddress);
  std::string routeAddress;
  std::string routeIface;
  if (owner.empty()) {
    net::BindAddress b = net::chooseBindAddress("", label, storeAddress);
    routeAddress = b.address;
    routeIface = b.interface;
  }
  return pickSocketInterface(options, multiNode, storeAddress, owner, routeIface, routeAddress,
                             label);
}

std::map<std::string, std::string> ncclEnvironment(
    const NcclOptions& options, const InterfaceChoice& iface,
    const std::map<std::string, std::string>& userEnv) {
  std::map<std::string, std::string> out;
  auto offer = [&](const char* key, const std::string& value) {
    if (!value.empty() && userEnv.find(key) == userEnv.end()) out[key] = value;
  };
  offer("NCCL_SOCKET_IFNAME", iface.name);
  // Gloo takes one interface name, not NCCL's list syntax.
  if (iface.name.find_first_of("^=,") == std::string::npos) offer("GLOO_SOCKET_IFNAME", iface.name);
  if (options.ibDisable) offer("NCCL_IB_DISABLE", "1");
  offer("NCCL_DEBUG", options.debug);
  offer("NCCL_DEBUG_SUBSYS", options.debugSubsys);
  return out;
}

}  // namespace dtrain::launcher
