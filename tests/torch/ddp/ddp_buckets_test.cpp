// DDP's bucket rebuild (Note [Bucket rebuild]): after the first synchronised backward the buckets
// follow the order in which gradients arrived, rank 0's order on every rank, and training stays
// equal to one process on the whole batch.
#include <gtest/gtest.h>

#include "ddp_support.h"

namespace dtrain::testing::ddp_buckets_test {
namespace {

// Registers its layers in the opposite order of use: the initial buckets (reverse registration)
// put the first layer's gradients, which arrive last, into the small first bucket.
struct ReversedMlpImpl : torch::nn::Module {
  ReversedMlpImpl() {
    out = register_module("out", torch::nn::Linear(16, 4));
    mid = register_module("mid", torch::nn::Linear(16, 16));
    in = register_module("in", torch::nn::Linear(8, 16));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return out(torch::tanh(mid(torch::tanh(in(x)))));
  }
  torch::nn::Linear out{nullptr}, mid{nullptr}, in{nullptr};
};
TORCH_MODULE(ReversedMlp);

// Two independent branches summed; `aFirst` decides which one the forward computes first, and so
// which one's gradients autograd produces first (the later-built branch goes first).
struct TwoBranchesImpl : torch::nn::Module {
  TwoBranchesImpl() {
    a = register_module("a", torch::nn::Linear(8, 4));
    b = register_module("b", torch::nn::Linear(8, 4));
  }
  torch::Tensor forward(const torch::Tensor& x, bool aFirst) {
    torch::Tensor ya, yb;
    if (aFirst) {
      ya = torch::tanh(a(x));
      yb = torch::tanh(b(x));
    } else {
      yb = torch::tanh(b(x));
      ya = torch::tanh(a(x));
    }
    return ya + yb;
  }
  torch::Tensor forward(const torch::Tensor& x) { return forward(x, true); }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(TwoBranches);

DdpOptions layerBuckets(bool asView = false) {
  DdpOptions o;
  o.firstBucketBytes = 256;  // about one layer per bucket
  o.bucketBytes = 1024;
  o.gradientAsBucketView = asView;
  return o;
}

using Names = std::vector<std::vector<std::string>>;

std::string first(const Names& names) { return names.empty() ? "" : names.front().front(); }

TEST(DdpBucketRebuild, BucketsFollowTheOrderGradientsArrived) {
  for (bool asView : {false, true}) {
    constexpr int kWorld = 2, kSteps = 4;
    torch::manual_seed(3);
    Batches data;
    for (int s = 0; s < kSteps; ++s) {
      data.inputs.push_back(torch::randn({8, 8}));
      data.targets.push_back(torch::randn({8, 4}));
    }
    ReversedMlp reference;
    auto nets = rankModels<ReversedMlp>(reference, kWorld, [] { return ReversedMlp(); });
    trainSingle(reference, data, mseLoss);
    std::vector<Names> before(kWorld), after(kWorld);
    auto world = ThreadWorld::create(kWorld);
    world->run([&](int rank) {
      DistributedDataParallel<ReversedMlp> ddp(nets[rank], threadGroup(*world, rank),
                                               layerBuckets(asView));
      auto sgd = makeSgd(ddp.parameters());
      for (int s = 0; s < kSteps; ++s) {
        if (s == 0) before[rank] = ddp.bucketNames();
        sgd.zero_grad();
        mseLoss(ddp(shard(data.inputs[s], rank, kWorld)), shard(data.targets[s], rank, kWorld))
            .backward();
        if (s == 0) after[rank] = ddp.bucketNames();
        sgd.step();
      }
    });
    EXPECT_EQ(first(before[0]).rfind("in.", 0), 0u)
        << "reverse registration starts with the layer used first: " << first(before[0]);
    EXPECT_EQ(first(after[0]).rfind("out.", 0), 0u)
        << "after the rebuild the first bucket holds the gradients that arrive first: "
        << first(after[0]);
    EXPECT_EQ(after[0], after[1]) << "every rank buckets alike";
    size_t total = 0;
    for (const auto& b : after[0]) total += b.size();
    EXPECT_EQ(total, 6u) << "every parameter in exactly one bucket";
    for (int r = 0; r < kWorld; ++r) {
      for (const auto& p : nets[r]->named_parameters()) {
        EXPECT_LE(relativeError(p.value(), reference->named_parameters()[p.key()]), 1e-5)
            << "asView " << asView << " rank " << r << " " << p.key();
      }
    }
  }
}

TEST(DdpBucketRebuild, EveryRankTakesRankZerosOrder) {
  constexpr int kWorld = 2;
  torch::manual_seed(4);
  auto x = torch::randn({6, 8});
  auto y = torch::randn({6, 4});
  TwoBranches reference;
  auto nets = rankModels<TwoBranches>(reference, kWorld, [] { return TwoBranches(); });
  {
    auto sgd = makeSgd(reference->parameters());
    for (int s = 0; s < 3; ++s) {
      sgd.zero_grad();
      mseLoss(reference->forward(x, true), y).backward();
      sgd.step();
    }
  }
  std::vector<Names> after(kWorld);
  auto world = ThreadWorld::create(kWorld);
  world->run([&](int rank) {
    DistributedDataParallel<TwoBranches> ddp(nets[rank], threadGroup(*world, rank), layerBuckets());
    auto sgd = makeSgd(ddp.parameters());
    for (int s = 0; s < 3; ++s) {
      sgd.zero_grad();
      // Rank 0 builds branch a first (so b's gradients come first), rank 1 the other way round.
      mseLoss(ddp(shard(x, rank, kWorld), rank == 0), shard(y, rank, kWorld)).backward();
      if (s == 0) after[rank] = ddp.bucketNames();
      sgd.step();
    }
  });
  EXPECT_EQ(first(after[0]).rfind("b.", 0), 0u) << first(after[0]);
  EXPECT_EQ(after[1], after[0])
      << "rank 1's gradients arrived the other way, but it follows rank 0";
  for (int r = 0; r < kWorld; ++r) {
    for (const auto& p : nets[r]->named_parameters()) {
      EXPECT_LE(relativeError(p.value(), reference->named_parameters()[p.key()]), 1e-5)
          << "rank " << r << " " << p.key();
    }
  }
}

TEST(DdpBucketRebuild, KeptWhenTurnedOffOrWithUnusedParameters) {
  for (bool findUnused : {false, true}) {
    auto world = ThreadWorld::create(2);
    std::vector<ReversedMlp> nets(2);
    world->run([&](int rank) {
      DdpOptions o = layerBuckets();
      o.rebuildBuckets = findUnused;  // off, or on but overridden by findUnusedParameters
      o.findUnusedParameters = findUnused;
      DistributedDataParallel<ReversedMlp> ddp(nets[rank], threadGroup(*world, rank), o);
      const Names before = ddp.bucketNames();
      for (int s = 0; s < 2; ++s)
        mseLoss(ddp(torch::randn({4, 8})), torch::randn({4, 4})).backward();
      EXPECT_EQ(ddp.bucketNames(), before) << "findUnused " << findUnused;
    });
  }
}

}  // namespace
}  // namespace dtrain::testing::ddp_buckets_test
