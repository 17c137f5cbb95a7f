#pragma once
// Forwarding header: the fault API lives in dtrain/base/fault.h (include that in new code).
#include "dtrain/base/fault.h"
