#pragma once
// Forwarding header: the init API lives in dtrain/torch/init.h (include that in new code).
#include "dtrain/torch/init.h"
