// Uses the installed headers and libraries: the config header, the store, and (when the torch
// layer was built) the library's version symbol. The include paths of earlier releases
// (dtrain/store.h, dtrain/progress.h, dtrain/metrics.h, dtrain/fault.h, dtrain/init.h) must keep
// working beside the per-library folders (dtrain/base/, dtrain/comm/, dtrain/torch/).
#include <cstdio>

#include "dtrain/base/store.h"
#include "dtrain/comm/communicator.h"
#include "dtrain/config.h"
#include "dtrain/fault.h"
#include "dtrain/metrics.h"
#include "dtrain/progress.h"
#include "dtrain/store.h"
#if CONSUMER_HAS_TORCH_LAYER
#include "dtrain/dtrain.h"
#include "dtrain/init.h"
#endif

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
