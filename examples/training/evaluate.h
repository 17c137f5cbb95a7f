#pragma once
// The test accuracy of a data-parallel job's model, every rank evaluating its share.

#include <cstdint>

#include <c10/core/Device.h>

#include <dtrain/torch/process_group.h>

#include "data/cifar10.h"
#include "models/resnet.h"

namespace examples {

// Accuracy over the whole test set: each rank evaluates every world-th image (no padding, so no
// image counts twice), then the counts are summed across ranks. Every rank runs the same number
// of forwards (a ZeRO-3 model's are collective). Collective; the model is in training mode again
// afterwards.
double evaluate(ResNet& model, const CifarSplit& test, dtrain::ProcessGroup& group,
                const c10::Device& device, int64_t batchSize);

}  // namespace examples
