// DDP on N ranks (threads) with per-rank batch B equals one process with batch N*B.
#include <gtest/gtest.h>

#include "ddp_support.h"

namespace dtrain::testing::ddp_equivalence_test {
namespace {

constexpr int kSteps = 3;
constexpr int kPerRank = 4;
constexpr double kTolerance = 1e-5;

// Buckets small enough that the MLP's gradients travel in three buckets.
DdpOptions smallBuckets(bool asView) {
  DdpOptions o;
  o.firstBucketBytes = 256;
  o.bucketBytes = 1024;
  o.gradientAsBucketView = asView;
  return o;
}

template <typename Net>
void expectEquivalent(int world, const std::function<Net()>& make, const Batches& data,
                      const LossFn& loss, const DdpOptions& options) {
  Net reference = make();
  auto nets = rankModels<Net>(reference, world, make);
  trainSingle(reference, data, loss);

  auto threads = ThreadWorld::create(world);
  threads->run([&](int rank) {
    DistributedDataParallel<Net> ddp(nets[rank], threadGroup(*threads, rank), options);
    auto sgd = makeSgd(ddp.parameters());
    for (size_t s = 0; s < data.inputs.size(); ++s) {
      sgd.zero_grad();
      auto out = ddp(shard(data.inputs[s], rank, world));
      loss(out, shard(data.targets[s], rank, world)).backward();
      sgd.step();
    }
  });
  auto expected = reference->named_parameters();
  for (int r = 0; r < world; ++r) {
    for (const auto& p : nets[r]->named_parameters()) {
      EXPECT_LE(relativeError(p.value(), expected[p.key()]), kTolerance)
          << "world " << world << " rank " << r << " parameter " << p.key();
    }
  }
}

Batches mlpData(int world) {
  Batches d;
  for (int s = 0; s < kSteps; ++s) {
    d.inputs.push_back(torch::randn({world * kPerRank, 8}));
    d.targets.push_back(torch::randn({world * kPerRank, 4}));
  }
  return d;
}

Batches cnnData(int world) {
  Batches d;
  for (int s = 0; s < kSteps; ++s) {
    d.inputs.push_back(torch::randn({world * kPerRank, 3, 8, 8}));
    d.targets.push_back(torch::randint(0, 5, {world * kPerRank}, torch::kLong));
  }
  return d;
}

void checkMlpOnTwoThreeFourRanks() {
  for (int world : {2, 3, 4}) {
    torch::manual_seed(world);
    auto data = mlpData(world);
    expectEquivalent<Mlp>(
        world, [] { return Mlp(); }, data, mseLoss, smallBuckets(false));
  }
}

void checkMlpWithGradientsAsBucketViews() {
  for (int world : {2, 3}) {
    torch::manual_seed(10 + world);
    auto data = mlpData(world);
    expectEquivalent<Mlp>(
        world, [] { return Mlp(); }, data, mseLoss, smallBuckets(true));
  }
}

void checkMlpWithDefaultBuckets() {
  torch::manual_seed(20);
  auto data = mlpData(2);
  expectEquivalent<Mlp>(
      2, [] { return Mlp(); }, data, mseLoss, DdpOptions{});
}

TEST(DdpEquivalence, CnnOnTwoThreeFourRanks) {
  for (int world : {2, 3, 4}) {
    torch::manual_seed(30 + world);
    auto data = cnnData(world);
    expectEquivalent<Cnn>(
        world, [] { return Cnn(); }, data, crossEntropy, smallBuckets(false));
  }
}

void checkGradientsAsBucketViewsAliasTheBuckets() {
  torch::manual_seed(40);
  auto data = mlpData(2);
  Mlp reference;
  auto nets = rankModels<Mlp>(reference, 2, [] { return Mlp(); });
  auto threads = ThreadWorld::create(2);
  threads->run([&](int rank) {
    DistributedDataParallel<Mlp> ddp(nets[rank], threadGroup(*threads, rank), smallBuckets(true));
    for (int step = 0; step < 2; ++step) {
      for (auto& p : ddp.parameters()) {
        if (p.grad().defined()) p.mutable_grad().zero_();
      }
      mseLoss(ddp(shard(data.inputs[step], rank, 2)), shard(data.targets[step], rank, 2))
          .backward();
      // fc1.weight (first registered) and fc1.bias are neighbours in the last bucket.
      auto& w = nets[rank]->fc1->weight;
      auto& b = nets[rank]->fc1->bias;
      EXPECT_EQ(static_cast<char*>(w.grad().data_ptr()),
                static_cast<char*>(b.grad().data_ptr()) + b.numel() * sizeof(float))
          << "step " << step;
    }
  });
}

TEST(DdpEquivalence, MlpOnTwoThreeFourRanks) {
  checkMlpOnTwoThreeFourRanks();
  checkMlpWithGradientsAsBucketViews();
  checkMlpWithDefaultBuckets();
  checkGradientsAsBucketViewsAliasTheBuckets();
}

}  // namespace
}  // namespace dtrain::testing::ddp_equivalence_test
