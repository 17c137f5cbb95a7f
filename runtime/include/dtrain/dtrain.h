#pragma once
// The one header a training program includes.

#include "dtrain/config.h"
#include "dtrain/error.h"

#if DTRAIN_WITH_TORCH
#include "dtrain/checkpoint.h"
#include "dtrain/ddp.h"
#include "dtrain/distributed_sampler.h"
#include "dtrain/grad_scaler.h"
#include "dtrain/init.h"
#endif

namespace dtrain {

// The version of the dtrain library the program runs with.
const char* version();

}  // namespace dtrain
