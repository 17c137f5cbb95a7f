#pragma once
// The one header a training program includes, as torch/torch.h is libtorch's: errors, the store,
// metrics and their sinks (Prometheus through launch, JSONL, TensorBoard), progress reports, the
// communicators, and with the libtorch layer init(), DDP, the sampler, GradScaler, the training
// state and its checkpoints, autocast, ZeRO, recompute and the host memory cache.

#include "dtrain/base/error.h"
#include "dtrain/base/metrics.h"
#include "dtrain/base/progress.h"
#include "dtrain/base/store.h"
#include "dtrain/base/tensorboard.h"
#include "dtrain/comm/communicator.h"
#include "dtrain/config.h"

#if DTRAIN_WITH_TORCH
#include "dtrain/torch/autocast.h"
#include "dtrain/torch/checkpoint.h"
#include "dtrain/torch/ddp.h"
#include "dtrain/torch/distributed_sampler.h"
#include "dtrain/torch/fully_shard.h"
#include "dtrain/torch/grad_scaler.h"
#include "dtrain/torch/host_memory.h"
#include "dtrain/torch/init.h"
#include "dtrain/torch/recompute.h"
#include "dtrain/torch/training_state.h"
#include "dtrain/torch/zero.h"
#endif

namespace dtrain {

// The version of the dtrain library the program runs with.
const char* version();

}  // namespace dtrain
