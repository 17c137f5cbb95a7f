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
  // One unit gathered at a time: the memory of a unit beside the shards, not of the whole model.
  std::map<std::string, uint64_t> hashes;
  dtrain::visitFullParameters(*sharded, [&](const std::string& name, const torch::Tensor& full) {
    hashes[name] = tensorHash(full);
  });
  std::vector<uint64_t> inOrder;
  for (const auto& p : model.named_parameters()) {
    auto it = hashes.find(p.key());
    inOrder.push_back(it != hashes.end() ? it->second : tensorHash(p.value()));  // never sharded
  }
  for (const auto& b : model.buffers()) inOrder.push_back(tensorHash(b));
  return combineHashes(inOrder);
}

}  // namespace examples
