#pragma once
// Shared by the node-loss thread tests (node_loss_*_test.cpp): ranks as threads over real Gloo
// communicators on one HashStore, the test playing the launcher's master -- it writes the
// membership epoch (runtime/base/membership.h) into the store -- and the small model and data
// whose one-process run every survivor must end equal to.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "ddp_models.h"
#include "dtrain/base/store.h"
#include "dtrain/torch/ddp.h"
#include "dtrain/torch/distributed_sampler.h"
#include "dtrain/torch/init.h"
#include "dtrain/torch/training_state.h"
#include "membership.h"

namespace dtrain::testing {

// Rank `rank` of `world`, local rank `localRank` on node `node` (its id in the epochs), re-forming
// on a lost node when `reform`; taken into the running round in `joinEpoch` when > 0 (-1: as
// DTRAIN_JOIN_EPOCH says).
inline std::shared_ptr<ProcessGroup> nodeLossRank(const std::shared_ptr<store::Store>& store,
                                                  int rank, int world, int localRank, int node,
                                                  bool reform = true, int joinEpoch = -1) {
  InitOptions o;
  o.backend = "gloo";
  o.sharedMemory = false;
  o.rank = rank;
  o.worldSize = world;
  o.localRank = localRank;
  o.store = store;
  o.node = "node" + std::to_string(node);
  o.reformOnNodeLoss = reform;
  o.nodeId = std::to_string(node);
  o.joinEpoch = joinEpoch;
  o.hostMemoryCache = false;
  o.timeout = std::chrono::seconds(60);
  return init(o);
}

// What the master writes: epoch `epoch` of `nodes` ({node id, rank offset, local world size}),
// `joining` of whose ranks are taken in (it takes effect once they are ready).
inline void publishEpoch(store::Store& store, int epoch, std::vector<membership::EpochNode> nodes,
                         const std::string& why, int joining = 0) {
  membership::Epoch e;
  e.epoch = epoch;
  e.joining = joining;
  for (const auto& n : nodes) e.worldSize += n.localWorldSize;
  e.nodes = std::move(nodes);
  e.why = why;
  store.set(membership::epochKey(), store::toBytes(membership::encodeEpoch(e)));
}

// `make()` right after torch::manual_seed(seed), under one lock: the ranks are threads and
// libtorch's default generator is one for the process -- unguarded, their draws interleave and
// rank 0's model (which DDP broadcasts) differs from the reference's.
template <typename Make>
auto seeded(uint64_t seed, Make make) {
  static std::mutex generator;
  std::lock_guard<std::mutex> lock(generator);
  torch::manual_seed(seed);
  return make();
}

// The model and data of the 6-rank tests: 8 inputs, 2 outputs, sample i a fixed function of i.
inline torch::nn::Sequential makeNodeLossNet() {
  return seeded(7, [] {
    return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                                 torch::nn::Linear(16, 2));
  });
}
inline at::Tensor nodeLossInput(size_t i) {
  return torch::sin(torch::arange(8, torch::kFloat) * 0.37 + static_cast<double>(i) * 0.11);
}
inline at::Tensor nodeLossTarget(size_t i) {
  return torch::cos(torch::arange(2, torch::kFloat) + static_cast<double>(i) * 0.05);
}
// Forward and backward of the samples `indices` (through `ddp` when given).
inline void nodeLossStep(torch::nn::Sequential& net,
                         DistributedDataParallel<torch::nn::Sequential>* ddp,
                         const std::vector<size_t>& indices) {
  std::vector<at::Tensor> xs, ys;
  for (size_t i : indices) {
    xs.push_back(nodeLossInput(i));
    ys.push_back(nodeLossTarget(i));
  }
  auto out = ddp ? (*ddp)(torch::stack(xs)) : net->forward(torch::stack(xs));
  torch::mse_loss(out, torch::stack(ys)).backward();
}

// The parameters of one process that trains `steps` steps on the whole global batch
// (`globalBatch` samples of a `samples`-sample dataset), step by step (SGD with momentum, no
// schedule): what every rank of the tests must end with.
inline std::vector<at::Tensor> oneProcessParameters(size_t samples, int64_t steps,
                                                    int64_t globalBatch) {
  auto reference = makeNodeLossNet();
  torch::optim::SGD sgd(reference->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  DistributedSampler all(samples, 1, 0);
  for (int64_t step = 0; step < steps; ++step) {
    sgd.zero_grad();
    nodeLossStep(reference, nullptr, *all.next(static_cast<size_t>(globalBatch)));
    sgd.step();
  }
  return reference->parameters();
}

// One rank's trainer of the 6-rank tests: the model under DDP, SGD with momentum and a sampler,
// all registered in a TrainingState.
struct NodeLossTrainer {
  NodeLossTrainer(std::shared_ptr<ProcessGroup> g, size_t samples)
      : group(std::move(g)),
        net(makeNodeLossNet()),
        ddp(net, group),
        sgd(ddp.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9)),
        sampler(samples, group->size(), group->rank()),
        state(std::make_shared<TrainingState>(group)) {
    state->addModule("net", net);
    state->addOptimizer("sgd", sgd);
    state->addSampler("data", sampler);
  }

  std::shared_ptr<ProcessGroup> group;
  torch::nn::Sequential net;
  DistributedDataParallel<torch::nn::Sequential> ddp;
  torch::optim::SGD sgd;
  DistributedSampler sampler;
  std::shared_ptr<TrainingState> state;
};

// Rank `rank`'s parameters `got`: within 1e-5 of `expected` (relative to its largest element)
// and bitwise equal to `first` (rank 0's).
inline void expectParametersMatch(const std::vector<at::Tensor>& got,
                                  const std::vector<at::Tensor>& expected,
                                  const std::vector<at::Tensor>& first, int rank) {
  ASSERT_EQ(got.size(), expected.size()) << "rank " << rank;
  ASSERT_EQ(first.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_LE(relativeError(got[i], expected[i]), 1e-5) << "rank " << rank << " parameter " << i;
    EXPECT_TRUE(torch::equal(got[i], first[i]))
        << "rank " << rank << " differs from rank 0 in parameter " << i;
  }
}

}  // namespace dtrain::testing
