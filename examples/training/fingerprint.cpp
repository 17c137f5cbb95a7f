#include "fingerprint.h"

#include <map>
#include <string>
#include <vector>

#include <dtrain/torch/fully_shard.h>
#include <dtrain/torch/zero.h>

#include "models/resnet.h"

namespace examples {

uint64_t trainedFingerprint(const torch::nn::Module& model, torch::optim::Optimizer& optimizer) {
  auto* sharded = dynamic_cast<dtrain::ShardedOptimizer*>(&optimizer);
  if (sharded == nullptr || sharded->options().stage != 3) return fingerprint(model);
  std::map<std::string, torch::Tensor> full;
  for (auto& [name, tensor] : dtrain::gatherFullParameters(*sharded)) full[name] = tensor;
  std::vector<torch::Tensor> tensors;
  for (const auto& p : model.named_parameters()) {
    auto it = full.find(p.key());
    tensors.push_back(it != full.end() ? it->second : p.value());  // not trained: never sharded
  }
  for (const auto& b : model.buffers()) tensors.push_back(b);
  return fingerprint(tensors);
}

}  // namespace examples
