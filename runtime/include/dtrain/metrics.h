#pragma once
// Forwarding header: the metrics API lives in dtrain/base/metrics.h (include that in new code).
#include "dtrain/base/metrics.h"
