#pragma once
// What the torch layer reads of a libtorch optimizer's per-parameter state, by optimizer type:
// the seam the checkpoints (checkpoint/state.cpp, checkpoint/state_read.cpp) and ZeRO's shards
// (zero/shard_records.cpp, zero/sharded_optimizer.cpp) share. Private to the torch layer.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torch::optim {
class Optimizer;
class OptimizerParamState;
}  // namespace torch::optim

namespace dtrain::optim_state {

// "SGD", "Adam", "AdamW", "Adagrad", "RMSprop"; nullptr for an optimizer dtrain does not know.
const char* optimizerType(const torch::optim::Optimizer& optimizer);
// The tensors and the step count of one parameter's optimizer state.
struct StateFields {
  std::vector<std::pair<const char*, at::Tensor*>> tensors;
  int64_t* step = nullptr;
};
StateFields fieldsOf(torch::optim::OptimizerParamState& state);
// An empty state of an optimizer of `type` (optimizerType()), for a parameter the optimizer has
// not stepped yet; nullptr for a type dtrain does not know.
std::unique_ptr<torch::optim::OptimizerParamState> newParamState(const std::string& type);

}  // namespace dtrain::optim_state
