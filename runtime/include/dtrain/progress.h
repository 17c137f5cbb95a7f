#pragma once
// Forwarding header: the progress API lives in dtrain/base/progress.h (include that in new code).
#include "dtrain/base/progress.h"
