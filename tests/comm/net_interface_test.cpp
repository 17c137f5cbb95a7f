#include <gtest/gtest.h>

#include <net/if.h>

#include "dtrain/base/error.h"
#include "net/net_interface.h"

namespace dtrain::net::net_interface_test {
namespace {

TEST(NetInterface, OneNodeJobsStayOnLoopback) {
  EXPECT_EQ(chooseBindAddress("", "GLOO_SOCKET_IFNAME", "").address, "127.0.0.1");
  EXPECT_EQ(chooseBindAddress("", "GLOO_SOCKET_IFNAME", "127.0.0.1").address, "127.0.0.1");
  EXPECT_EQ(chooseBindAddress("", "GLOO_SOCKET_IFNAME", "localhost").interface, "lo");
}

TEST(NetInterface, ANamedInterfaceWinsAndAnUnknownOneIsRejectedByName) {
  auto lo = chooseBindAddress("lo", "GLOO_SOCKET_IFNAME", "10.1.2.3");
  EXPECT_EQ(lo.address, "127.0.0.1");
  EXPECT_EQ(lo.reason, "GLOO_SOCKET_IFNAME");
  try {
    chooseBindAddress("nosuch0", "GLOO_SOCKET_IFNAME", "");
    ADD_FAILURE() << "accepted an unknown interface";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("GLOO_SOCKET_IFNAME=nosuch0"), std::string::npos)
        << e.what();
  }
}

TEST(NetInterface, RemoteStoreUsesTheRouteSourceAddressNeverLoopback) {
  // The address of a non-loopback interface of this machine stands in for a store host: the
  // route toward a local address has that address as its source.
  std::string eth;
  if (struct if_nameindex* names = if_nameindex()) {
    for (auto* i = names; i->if_name != nullptr; ++i) {
      std::string addr = interfaceAddress(i->if_name);
      if (eth.empty() && !addr.empty() && !isLoopbackHost(addr)) eth = i->if_name;
    }
    if_freenameindex(names);
  }
  if (eth.empty()) GTEST_SKIP() << "no non-loopback interface found";
  auto choice = chooseBindAddress("", "GLOO_SOCKET_IFNAME", interfaceAddress(eth));
  EXPECT_EQ(choice.address, interfaceAddress(eth));
  EXPECT_FALSE(isLoopbackHost(choice.address));
}

TEST(NetInterface, LoopbackHosts) {
  EXPECT_TRUE(isLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(isLoopbackHost("127.0.1.1"));
  EXPECT_TRUE(isLoopbackHost("::1"));
  EXPECT_FALSE(isLoopbackHost("10.0.0.1"));
}

}  // namespace
}  // namespace dtrain::net::net_interface_test
