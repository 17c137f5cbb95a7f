#pragma once
// The fingerprint train_resnet prints at the end: equal on every rank when the ranks hold
// bitwise-equal models, and equal across runs that trained the same values.

#include <cstdint>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

namespace examples {

// examples::fingerprint over the model's parameters and buffers, in the module's order. Under a
// ZeRO-3 ShardedOptimizer each rank holds 1/N of the parameters: they are gathered one unit at a
// time (dtrain::visitFullParameters), so the value is the one the same model would give
// unsharded, in the memory of one unit.
// Collective at stage 3 (every rank calls it).
uint64_t trainedFingerprint(const torch::nn::Module& model, torch::optim::Optimizer& optimizer);

}  // namespace examples
