// Uses the installed headers and libraries through the one header a training program includes:
// the config header, the store, and (when the torch layer was built) the library's version
// symbol.
#include <cstdio>

#include "dtrain/dtrain.h"

int main() {
  dtrain::store::HashStore store;
  store.setString("hello", "world");
  std::printf("consumer: store says %s; built with dtrain %s", store.getString("hello").c_str(),
              DTRAIN_VERSION);
#if CONSUMER_HAS_TORCH_LAYER
  std::printf("; torch layer %s", dtrain::version());
#endif
  std::printf("\n");
  return 0;
}
