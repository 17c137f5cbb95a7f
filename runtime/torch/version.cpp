#include "dtrain/dtrain.h"

namespace dtrain {

const char* version() { return DTRAIN_VERSION; }

}  // namespace dtrain
