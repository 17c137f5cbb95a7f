#pragma once
// Which local address a CPU backend binds its connections to (docs/design.md#network-interface):
// an interface
// named by the user (GLOO_SOCKET_IFNAME or an option) wins; a job whose store is on loopback is a
// one-node job and stays on loopback; otherwise the address the kernel would use as the source of
// a route toward the store host (on the store's own node, that is the store's address). Never
// loopback when the store is elsewhere. It lives in dtrain_base so that `launch` applies the same
// rule when it sets NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME for a multi-node job.

#include <string>

namespace dtrain::net {

struct BindAddress {
  std::string address;    // numeric IP to bind
  std::string interface;  // its interface, when known ("lo", "eth0")
  std::string reason;     // how it was chosen, for logs and errors
};

// `interfaceName`: explicit choice (empty: none). `storeHost`: the rendezvous store's address
// (empty: unknown, treated as one node). Throws InvalidArgument naming `interfaceSource` when the
// named interface does not exist or has no IPv4 address.
BindAddress chooseBindAddress(const std::string& interfaceName, const std::string& interfaceSource,
                              const std::string& storeHost);

// True for 127.0.0.0/8, ::1 and "localhost".
bool isLoopbackHost(const std::string& host);

// The first IPv4 address of interface `name`; empty when it has none or does not exist.
std::string interfaceAddress(const std::string& name);

// The interface holding `address`; empty when none does.
std::string interfaceOfAddress(const std::string& address);

}  // namespace dtrain::net
