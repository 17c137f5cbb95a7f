#include "dtrain/config.h"

namespace dtrain::launcher {

const char* launcherVersion() { return DTRAIN_VERSION; }

}  // namespace dtrain::launcher
