#include "store_factories.h"

namespace dtrain::store::testing {

std::vector<StoreFactory> allStoreFactories() {
  std::vector<StoreFactory> out;
  out.push_back({"HashStore", [] { return std::make_shared<HashStore>(); },
                 [](const std::shared_ptr<Store>& first) { return first; }});
  out.push_back({"PrefixStoreOverHashStore",
                 [] { return std::make_shared<PrefixStore>("job", std::make_shared<HashStore>()); },
                 [](const std::shared_ptr<Store>& first) { return first; }});
  // TcpStore: added with the server.
  return out;
}

}  // namespace dtrain::store::testing
