#include "net/net_interface.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "dtrain/base/error.h"

namespace dtrain::net {

namespace {

std::string ipv4Text(const sockaddr* sa) {
  char buf[INET_ADDRSTRLEN] = {0};
  const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
  inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
  return buf;
}

// The source address of a route toward `host` (a UDP connect sends nothing).
std::string sourceAddressToward(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), "9", &hints, &res);
  DTRAIN_CHECK_T(NetworkError, rc == 0 && res != nullptr,
                 "cannot resolve the store host \"{}\" to choose a network interface: {}", host,
                 gai_strerror(rc));
  int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  std::string out;
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      out = ipv4Text(reinterpret_cast<sockaddr*>(&local));
    }
  }
  int err = errno;
  if (fd >= 0) ::close(fd);
  freeaddrinfo(res);
  DTRAIN_CHECK_T(NetworkError, !out.empty(),
                 "no route toward the store host {}: {}. HINT: set GLOO_SOCKET_IFNAME to the "
                 "interface that reaches the other nodes",
                 host, std::strerror(err));
  return out;
}

}  // namespace

bool isLoopbackHost(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr a{};
  if (inet_pton(AF_INET, host.c_str(), &a) == 1) return (ntohl(a.s_addr) >> 24) == 127;
  return false;
}

std::string interfaceAddress(const std::string& name) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && name == i->ifa_name) {
      out = ipv4Text(i->ifa_addr);
      break;
    }
  }
  freeifaddrs(list);
  return out;
}

std::string interfaceOfAddress(const std::string& address) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && ipv4Text(i->ifa_addr) == address) {
      out = i->ifa_name;
      break;
    }
  }
  freeifaddrs(list);
  return out;
}

BindAddress chooseBindAddress(const std::string& interfaceName, const std::string& interfaceSource,
                              const std::string& storeHost) {
  BindAddress out;
  if (!interfaceName.empty()) {
    out.address = interfaceAddress(interfaceName);
    DTRAIN_CHECK_ARG(!out.address.empty(),
                     "{}={}: no such network interface with an IPv4 address. HINT: `ip -4 addr` "
                     "lists the interfaces",
                     interfaceSource, interfaceName);
    out.interface = interfaceName;
    out.reason = interfaceSource;
    return out;
  }
  if (storeHost.empty() || isLoopbackHost(storeHost)) {
    out.address = "127.0.0.1";
    out.interface = interfaceOfAddress(out.address);
    out.reason = "one node: the store is on loopback";
    return out;
  }
  out.address = sourceAddressToward(storeHost);
  out.interface = interfaceOfAddress(out.address);
  out.reason = "the route toward the store host " + storeHost;
  return out;
}

}  // namespace dtrain::net
