#pragma once
// Forwarding header: the store API lives in dtrain/base/store.h (include that in new code).
#include "dtrain/base/store.h"
