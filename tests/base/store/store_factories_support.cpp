#include <memory>
#include <string>

#include "dtrain/base/tcp_store.h"
#include "store_factories_support.h"

namespace dtrain::store::testing {

namespace {

// Test values, short: a loaded 2-core machine still connects within seconds.
TcpStoreOptions clientOptions(uint16_t port) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.connectTimeout = Millis(10000);
  o.timeout = Millis(10000);
  return o;
}

// A client that keeps alive whatever it depends on (its server, or the first client and so its
// server), so handles can be dropped in any order.
struct KeptClient {
  std::shared_ptr<void> keepAlive;
  std::shared_ptr<TcpStore> client;
};

std::shared_ptr<Store> keptClient(std::shared_ptr<void> keepAlive, uint16_t port) {
  auto kept = std::make_shared<KeptClient>();
  kept->keepAlive = std::move(keepAlive);
  kept->client = std::make_shared<TcpStore>(clientOptions(port));
  return std::shared_ptr<Store>(kept, kept->client.get());
}

std::shared_ptr<Store> newServedClient() {
  TcpStoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  std::shared_ptr<TcpStoreServer> server = TcpStoreServer::start(o);
  return keptClient(server, server->port());
}

// "127.0.0.1:41234" -> 41234.
uint16_t portOf(const Store& store) {
  std::string where = store.describe();
  return static_cast<uint16_t>(std::stoi(where.substr(where.rfind(':') + 1)));
}

}  // namespace

std::vector<StoreFactory> allStoreFactories() {
  std::vector<StoreFactory> out;
  out.push_back({"HashStore", [] { return std::make_shared<HashStore>(); },
                 [](const std::shared_ptr<Store>& first) { return first; }});
  out.push_back({"PrefixStoreOverHashStore",
                 [] { return std::make_shared<PrefixStore>("job", std::make_shared<HashStore>()); },
                 [](const std::shared_ptr<Store>& first) { return first; }});
  out.push_back(
      {"TcpStore", [] { return newServedClient(); },
       [](const std::shared_ptr<Store>& first) { return keptClient(first, portOf(*first)); }});
  out.push_back({"PrefixStoreOverTcpStore",
                 [] { return std::make_shared<PrefixStore>("job", newServedClient()); },
                 [](const std::shared_ptr<Store>& first) -> std::shared_ptr<Store> {
                   return std::make_shared<PrefixStore>("job", keptClient(first, portOf(*first)));
                 }});
  return out;
}

}  // namespace dtrain::store::testing
