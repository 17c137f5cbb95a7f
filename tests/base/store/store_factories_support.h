#pragma once
// The Store implementations the conformance suite runs over. `another(first)` returns a second
// handle on the same data (another client for TcpStore, the same object for HashStore).
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "dtrain/base/store.h"

namespace dtrain::store::testing {

struct StoreFactory {
  std::string name;
  std::function<std::shared_ptr<Store>()> make;
  std::function<std::shared_ptr<Store>(const std::shared_ptr<Store>&)> another;
};

std::vector<StoreFactory> allStoreFactories();

inline void PrintTo(const StoreFactory& factory, std::ostream* os) { *os << factory.name; }

}  // namespace dtrain::store::testing
