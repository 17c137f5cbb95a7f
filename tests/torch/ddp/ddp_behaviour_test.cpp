// DDP's behaviours on ranks as threads: gradient accumulation, unused parameters, buffers,
// overlap, compression, and the errors it documents.
#include <gtest/gtest.h>

#include <thread>

#include "counting_allocator.h"
#include "ddp_support.h"

namespace dtrain::testing::ddp_behaviour_test {
namespace {

constexpr double kTolerance = 1e-5;

void expectSameParameters(torch::nn::Module& actual, torch::nn::Module& expected,
                          const std::string& what) {
  auto want = expected.named_parameters();
  for (const auto& p : actual.named_parameters()) {
    EXPECT_LE(relativeError(p.value(), want[p.key()]), kTolerance) << what << " " << p.key();
  }
}

// Runs fn(rank) expecting it to throw dtrain::Error whose message contains every one of `parts`.
void expectErrorOnEveryRank(ThreadWorld& world, const std::function<void(int)>& fn,
                            const std::vector<std::string>& parts) {
  world.run([&](int rank) {
    try {
      fn(rank);
      ADD_FAILURE() << "rank " << rank << ": no error";
    } catch (const Error& e) {
      for (const auto& part : parts) {
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
            << "rank " << rank << ": \"" << part << "\" missing from: " << e.what();
      }
    }
  });
}

TEST(DdpNoSync, MicroBatchesThenOneSyncedEqualOneBigBatch) {
  constexpr int kWorld = 2, kMicro = 4, kPer = 3;
  torch::manual_seed(1);
  auto x = torch::randn({kWorld * kMicro * kPer, 8});
  auto y = torch::randn({kWorld * kMicro * kPer, 4});
  Mlp reference;
  auto nets = rankModels<Mlp>(reference, kWorld, [] { return Mlp(); });
  trainSingle(reference, Batches{{x}, {y}}, mseLoss);

  auto world = ThreadWorld::create(kWorld);
  world->run([&](int rank) {
    DistributedDataParallel<Mlp> ddp(nets[rank], threadGroup(*world, rank));
    auto sgd = makeSgd(ddp.parameters());
    sgd.zero_grad();
    auto mine = shard(x, rank, kWorld);
    auto target = shard(y, rank, kWorld);
    auto micro = [&](int m) {
      auto loss = mseLoss(ddp(mine.narrow(0, m * kPer, kPer)), target.narrow(0, m * kPer, kPer));
      (loss / kMicro).backward();
    };
    int64_t before = world->issued(rank);
    {
      auto guard = ddp.noSync();
      for (int m = 0; m < kMicro - 1; ++m) micro(m);
    }
    EXPECT_EQ(world->issued(rank), before) << "noSync() must not communicate";
    micro(kMicro - 1);
    EXPECT_GT(world->issued(rank), before);
    sgd.step();
  });
  for (int r = 0; r < kWorld; ++r) {
    expectSameParameters(*nets[r], *reference, "rank " + std::to_string(r));
  }
}

// The reference for BranchNet: one process, loss = mean over ranks of each rank's loss (with that
// rank's choice of skipping fc2), which is what DDP's averaged gradients optimise.
torch::Tensor branchLoss(BranchNet& net, const torch::Tensor& x, const torch::Tensor& y,
                         const std::vector<bool>& skips) {
  int world = static_cast<int>(skips.size());
  torch::Tensor total;
  for (int r = 0; r < world; ++r) {
    auto l = mseLoss(net->forward(shard(x, r, world), skips[r]), shard(y, r, world));
    total = total.defined() ? total + l : l;
  }
  return total / world;
}

void checkSkippedLayerIsStillSynchronised(bool asView) {
  // Per step, which ranks skip fc2: one rank, the other, none, all (fc2 unused everywhere).
  const std::vector<std::vector<bool>> skips = {
      {true, false}, {false, true}, {false, false}, {true, true}};
  torch::manual_seed(2);
  std::vector<torch::Tensor> xs, ys;
  for (size_t s = 0; s < skips.size(); ++s) {
    xs.push_back(torch::randn({8, 6}));
    ys.push_back(torch::randn({8, 3}));
  }
  BranchNet reference;
  auto nets = rankModels<BranchNet>(reference, 2, [] { return BranchNet(); });
  {
    auto sgd = makeSgd(reference->parameters());
    for (size_t s = 0; s < skips.size(); ++s) {
      sgd.zero_grad();
      branchLoss(reference, xs[s], ys[s], skips[s]).backward();
      sgd.step();
    }
  }
  std::vector<torch::Tensor> fc2Grad(2);
  auto world = ThreadWorld::create(2);
  world->run([&](int rank) {
    DdpOptions options;
    options.gradientAsBucketView = asView;
    options.findUnusedParameters = true;
    DistributedDataParallel<BranchNet> ddp(nets[rank], threadGroup(*world, rank), options);
    auto sgd = makeSgd(ddp.parameters());
    for (size_t s = 0; s < skips.size(); ++s) {
      sgd.zero_grad();
      mseLoss(ddp(shard(xs[s], rank, 2), skips[s][rank]), shard(ys[s], rank, 2)).backward();
      if (s == 0) fc2Grad[rank] = nets[rank]->fc2->weight.grad().clone();
      sgd.step();
    }
  });
  // PyTorch #69031: the rank that skipped fc2 still ends with the averaged gradient.
  ASSERT_TRUE(fc2Grad[0].defined());
  EXPECT_GT(fc2Grad[0].abs().max().item<double>(), 0);
  EXPECT_TRUE(torch::equal(fc2Grad[0], fc2Grad[1]));
  for (int r = 0; r < 2; ++r)
    expectSameParameters(*nets[r], *reference, "rank " + std::to_string(r));
}

void checkUsedOnlyInsideNoSyncStillSynchronised(bool asView) {
  torch::manual_seed(3);
  auto x = torch::randn({8, 6});
  auto y = torch::randn({8, 3});
  BranchNet reference;
  auto nets = rankModels<BranchNet>(reference, 2, [] { return BranchNet(); });
  {
    // Micro-batch 0 uses fc2 on every rank, micro-batch 1 skips it everywhere.
    auto sgd = makeSgd(reference->parameters());
    sgd.zero_grad();
    auto half = [&](const torch::Tensor& t, int m) {
      std::vector<torch::Tensor> parts;
      for (int r = 0; r < 2; ++r) parts.push_back(shard(t, r, 2).narrow(0, m * 2, 2));
      return torch::cat(parts);
    };
    auto l0 = branchLoss(reference, half(x, 0), half(y, 0), {false, false});
    auto l1 = branchLoss(reference, half(x, 1), half(y, 1), {true, true});
    ((l0 + l1) / 2).backward();
    sgd.step();
  }
  auto world = ThreadWorld::create(2);
  world->run([&](int rank) {
    DdpOptions options;
    options.gradientAsBucketView = asView;
    options.findUnusedParameters = true;
    DistributedDataParallel<BranchNet> ddp(nets[rank], threadGroup(*world, rank), options);
    auto sgd = makeSgd(ddp.parameters());
    sgd.zero_grad();
    auto mine = shard(x, rank, 2);
    auto target = shard(y, rank, 2);
    {
      auto guard = ddp.noSync();
      (mseLoss(ddp(mine.narrow(0, 0, 2), false), target.narrow(0, 0, 2)) / 2).backward();
    }
    (mseLoss(ddp(mine.narrow(0, 2, 2), true), target.narrow(0, 2, 2)) / 2).backward();
    sgd.step();
  });
  for (int r = 0; r < 2; ++r)
    expectSameParameters(*nets[r], *reference, "rank " + std::to_string(r));
}

void checkWithoutFindUnusedTheBackwardNamesThem() {
  auto world = ThreadWorld::create(2);
  std::vector<BranchNet> nets(2);
  world->run([&](int rank) {
    DistributedDataParallel<BranchNet> ddp(nets[rank], threadGroup(*world, rank));
    auto x = torch::randn({4, 6});
    auto y = torch::randn({4, 3});
    try {
      mseLoss(ddp(x, /*skip=*/true), y).backward();
      ADD_FAILURE() << "rank " << rank << ": skipping fc2 was not reported";
    } catch (const Error& e) {
      std::string what = e.what();
      for (const char* part : {"fc2.weight", "fc2.bias", "no gradient", "findUnusedParameters"}) {
        EXPECT_NE(what.find(part), std::string::npos) << part << " missing from: " << what;
      }
    }
    // The failed pass still launched every bucket, so the ranks stay aligned and go on.
    mseLoss(ddp(x, false), y).backward();
    EXPECT_TRUE(nets[rank]->fc2->weight.grad().defined());
  });
}

struct TwoHeadsImpl : torch::nn::Module {
  TwoHeadsImpl() {
    a = register_module("a", torch::nn::Linear(4, 2));
    b = register_module("b", torch::nn::Linear(4, 2));
  }
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) { return {a(x), b(x)}; }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(TwoHeads);

struct Opaque {
  torch::Tensor value;
};
struct OpaqueOutputImpl : torch::nn::Module {
  OpaqueOutputImpl() { a = register_module("a", torch::nn::Linear(4, 2)); }
  Opaque forward(const torch::Tensor& x) { return {a(x)}; }
  torch::nn::Linear a{nullptr};
};
TORCH_MODULE(OpaqueOutput);

void checkSearchesTupleOutputsAndRejectsOpaqueOnes() {
  auto world = ThreadWorld::create(2);
  std::vector<TwoHeads> heads(2);
  std::vector<OpaqueOutput> opaque(2);
  world->run([&](int rank) {
    DdpOptions options;
    options.findUnusedParameters = true;
    DistributedDataParallel<TwoHeads> ddp(heads[rank], threadGroup(*world, rank), options);
    auto [a, b] = ddp(torch::randn({3, 4}));
    (a.sum() + b.sum()).backward();  // both heads reachable and used: no error
    DistributedDataParallel<OpaqueOutput> bad(opaque[rank], threadGroup(*world, rank), options);
    EXPECT_THROW(bad(torch::randn({3, 4})), InvalidArgument);
  });
}

void checkMismatchedModelsNameTheParameterAndRanks() {
  auto world = ThreadWorld::create(3);
  std::vector<Mlp> nets = {Mlp(8, 16, 4), Mlp(8, 17, 4), Mlp(8, 16, 4)};
  expectErrorOnEveryRank(
      *world,
      [&](int rank) { DistributedDataParallel<Mlp> ddp(nets[rank], threadGroup(*world, rank)); },
      {"differs across ranks", "fc1.weight", "ranks 0, 2 have parameter fc1.weight Float [16, 8]",
       "rank 1 has parameter fc1.weight Float [17, 8]", "HINT"});
}

void checkExtraParameterAndDtypeMismatchAreNamed() {
  auto world = ThreadWorld::create(2);
  std::vector<Mlp> nets = {Mlp(), Mlp()};
  nets[1]->register_module("fc4", torch::nn::Linear(4, 2));
  expectErrorOnEveryRank(
      *world,
      [&](int rank) { DistributedDataParallel<Mlp> ddp(nets[rank], threadGroup(*world, rank)); },
      {"at entry 6", "rank 0 has nothing (only 6 entries)",
       "rank 1 has parameter fc4.weight Float [2, 4]"});

  std::vector<Mlp> typed = {Mlp(), Mlp()};
  typed[1]->fc3->to(torch::kDouble);
  expectErrorOnEveryRank(
      *world,
      [&](int rank) { DistributedDataParallel<Mlp> ddp(typed[rank], threadGroup(*world, rank)); },
      {"fc3.weight Float [4, 16]", "fc3.weight Double [4, 16]"});
}

TEST(DdpConstruction, BroadcastsRankZerosParametersAndBuffers) {
  auto world = ThreadWorld::create(3);
  std::vector<BnCnn> nets(3);
  {
    torch::NoGradGuard noGrad;
    for (int r = 0; r < 3; ++r) nets[r]->bn1->running_mean.fill_(r + 1);
  }
  world->run(
      [&](int rank) { DistributedDataParallel<BnCnn> ddp(nets[rank], threadGroup(*world, rank)); });
  for (int r = 1; r < 3; ++r) {
    auto want = nets[0]->named_parameters();
    for (const auto& p : nets[r]->named_parameters())
      EXPECT_TRUE(torch::equal(p.value(), want[p.key()]));
    EXPECT_TRUE(torch::equal(nets[r]->bn1->running_mean, torch::ones({4})));
  }
}

// Five 12 MiB weights, each with a small bias.
struct WideImpl : torch::nn::Module {
  WideImpl() {
    for (int i = 0; i < 5; ++i) {
      layers.push_back(register_module(std::string("l").append(std::to_string(i)),
                                       torch::nn::Linear(1536, 2048)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& l : layers) x = l(x.narrow(1, 0, 1536));
    return x;
  }
  std::vector<torch::nn::Linear> layers;
};
TORCH_MODULE(Wide);

// A model as large as the memory left must not need a copy of itself: construction broadcasts
// rank 0's state in buckets of 32 MiB (c10d's DDP syncs module states in buckets of 250 MiB), so
// what it adds beside two ranks' 60 MiB models is at most a bucket each (measured by a counting
// allocator), where one flat copy per rank added 120 MiB. The values are rank 0's.
TEST(DdpConstruction, BroadcastsALargeModelInBucketsWithoutASecondCopy) {
  CountingCpuAllocator& counter = CountingCpuAllocator::install();
  auto world = ThreadWorld::create(2);
  std::vector<Wide> nets(2);
  {
    torch::NoGradGuard noGrad;
    for (int r = 0; r < 2; ++r) {
      for (auto& p : nets[r]->parameters()) p.fill_(r + 1);
    }
  }
  const int64_t before = counter.live();
  counter.resetPeak();
  world->run(
      [&](int rank) { DistributedDataParallel<Wide> ddp(nets[rank], threadGroup(*world, rank)); });
  const int64_t added = counter.peak() - before;
  RecordProperty("construction_added_bytes", std::to_string(added));
  EXPECT_LE(added, 2 * (int64_t{32} << 20) + (int64_t{2} << 20));
  auto want = nets[0]->named_parameters();
  for (const auto& p : nets[1]->named_parameters()) {
    EXPECT_TRUE(torch::equal(p.value(), want[p.key()])) << p.key();
    EXPECT_TRUE(torch::equal(p.value(), torch::ones_like(p.value()))) << p.key();
  }
}

enum class AfterTraining { Nothing, SyncBuffers, EvalForward };

// Trains BnCnn on 2 ranks; returns the models.
std::vector<BnCnn> trainBnCnn(bool broadcastBuffers, AfterTraining after) {
  torch::manual_seed(5);
  std::vector<BnCnn> nets(2);
  std::vector<torch::Tensor> xs;
  for (int s = 0; s < 3; ++s) xs.push_back(torch::randn({8, 3, 8, 8}) * (s + 1));
  auto ys = torch::randint(0, 5, {8}, torch::kLong);
  auto world = ThreadWorld::create(2);
  world->run([&](int rank) {
    DdpOptions options;
    options.broadcastBuffers = broadcastBuffers;
    DistributedDataParallel<BnCnn> ddp(nets[rank], threadGroup(*world, rank), options);
    auto sgd = makeSgd(ddp.parameters());
    for (const auto& x : xs) {
      sgd.zero_grad();
      crossEntropy(ddp(shard(x, rank, 2)), shard(ys, rank, 2)).backward();
      sgd.step();
    }
    if (after == AfterTraining::SyncBuffers) ddp.syncBuffers();
    if (after == AfterTraining::EvalForward) {
      ddp->eval();  // evaluation does not update the statistics
      torch::NoGradGuard noGrad;
      ddp(shard(xs[0], rank, 2));
    }
  });
  return nets;
}

bool sameBuffers(BnCnn& a, BnCnn& b) {
  auto want = b->named_buffers();
  for (const auto& buf : a->named_buffers()) {
    if (!torch::equal(buf.value(), want[buf.key()])) return false;
  }
  return true;
}

void checkBatchNormParametersAndBuffersIdenticalOnEveryRank() {
  auto nets = trainBnCnn(/*broadcastBuffers=*/true, AfterTraining::SyncBuffers);
  auto want = nets[0]->named_parameters();
  for (const auto& p : nets[1]->named_parameters()) {
    EXPECT_TRUE(torch::equal(p.value(), want[p.key()])) << p.key();
  }
  EXPECT_TRUE(sameBuffers(nets[0], nets[1]));
  EXPECT_EQ(nets[1]->bn1->num_batches_tracked.item<int64_t>(), 3);
}

void checkBroadcastBeforeEveryForward() {
  // Each rank's last training forward updated its statistics with its own batch ...
  auto unsynced = trainBnCnn(true, AfterTraining::Nothing);
  EXPECT_FALSE(sameBuffers(unsynced[0], unsynced[1]));
  // ... and the next forward starts from rank 0's.
  auto evaluated = trainBnCnn(true, AfterTraining::EvalForward);
  EXPECT_TRUE(sameBuffers(evaluated[0], evaluated[1]));
  // Unless switched off; then syncBuffers() still works on demand.
  auto local = trainBnCnn(false, AfterTraining::EvalForward);
  EXPECT_FALSE(sameBuffers(local[0], local[1]));
  auto onDemand = trainBnCnn(false, AfterTraining::SyncBuffers);
  EXPECT_TRUE(sameBuffers(onDemand[0], onDemand[1]));
}

// Identity whose backward sleeps: makes backward slow between layers, as real layers are.
constexpr std::chrono::milliseconds kLayerBackward{50};
struct SlowBackward : torch::autograd::Function<SlowBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, torch::Tensor x) {
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    std::this_thread::sleep_for(kLayerBackward);
    return {grads[0]};
  }
};

struct SlowMlpImpl : MlpImpl {
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = SlowBackward::apply(torch::tanh(fc1(x)));
    h = SlowBackward::apply(torch::tanh(fc2(h)));
    return fc3(h);
  }
};
TORCH_MODULE(SlowMlp);

// Timing-bound: registered RUN_SERIAL (tests/torch/torch.cmake).
TEST(DdpOverlap, BucketAllreducesRunWhileBackwardContinues) {
  // Every collective takes 40 ms; each layer's backward 50 ms. With one bucket per layer (fc3,
  // fc2, fc1), the fc3 and fc2 allreduces run during the next layer's backward, so only fc1's,
  // launched with the last gradient, is left when backward ends: about one collective's time
  // (t). Overlapping only one bucket of three would leave two (2t), none three (3t). The bound
  // is 1.5t, with t measured in the same run on the same link (the three allreduces issued back
  // to back after backward), so a loaded machine moves both sides of the comparison.
  ThreadWorldOptions link;
  link.latency = std::chrono::milliseconds(40);
  auto world = ThreadWorld::create(2, link);
  std::vector<SlowMlp> nets(2);
  std::vector<DdpIterationStats> stats(2);
  std::vector<std::chrono::nanoseconds> sequential(2);
  world->run([&](int rank) {
    DdpOptions options;
    options.firstBucketBytes = 256;  // one bucket per layer: fc3, fc2, fc1
    options.bucketBytes = 1024;
    auto group = threadGroup(*world, rank);
    DistributedDataParallel<SlowMlp> ddp(nets[rank], group, options);
    ASSERT_EQ(ddp.bucketNames().size(), 3u);
    mseLoss(ddp(torch::randn({4, 8})), torch::randn({4, 4})).backward();
    stats[rank] = ddp.lastIteration();
    // The no-overlap time: the same three gradients' allreduces, one after the other.
    auto start = std::chrono::steady_clock::now();
    for (auto* layer : {&nets[rank]->fc3, &nets[rank]->fc2, &nets[rank]->fc1}) {
      auto flat = torch::cat({(*layer)->weight.grad().flatten(), (*layer)->bias.grad()});
      group->allreduce(flat);
    }
    sequential[rank] = std::chrono::steady_clock::now() - start;
  });
  using std::chrono::milliseconds;
  auto us = [](std::chrono::nanoseconds d) {
    return std::chrono::duration_cast<std::chrono::microseconds>(d).count();
  };
  for (int rank = 0; rank < 2; ++rank) {
    const auto& s = stats[rank];
    ASSERT_EQ(s.bucketLaunched.size(), 3u);
    // The fc3 and fc2 buckets started while backward was still producing gradients (two 50 ms
    // layers before fc1's), not after it.
    EXPECT_LT(s.bucketLaunched[0] + milliseconds(60), s.lastGradient);
    EXPECT_LT(s.bucketLaunched[1], s.lastGradient);
    EXPECT_LE(s.lastGradient, s.backwardEnd);
    const auto oneCollective = sequential[rank] / 3;
    EXPECT_GE(oneCollective, milliseconds(35)) << "the simulated link is not 40 ms per collective";
    EXPECT_LT(s.waited, oneCollective * 3 / 2)
        << "rank " << rank << ": backward's end waited " << us(s.waited) << " us for "
        << "communication; one collective takes " << us(oneCollective) << " us (three back to "
        << "back: " << us(sequential[rank]) << " us): more than one bucket was left exposed";
    EXPECT_EQ(s.iteration, 1u);
  }
}

TEST(DdpStreams, BucketsAreWaitedOnTheStreamCurrentAtTheEndOfBackward) {
  // On CUDA the gradients are written back from the end-of-backward callback's current stream,
  // which need not be the stream a bucket was issued on: DDP must wait through waitOnStream()
  // with the stream current then (comm.h), as c10d orders the current stream at wait time. On
  // the CPU the stream is null; what is checked here is that no bucket is waited on with plain
  // wait(), which orders the issue-time stream.
  auto world = ThreadWorld::create(2);
  std::vector<Mlp> nets(2);
  std::vector<WaitRecordingCommunicator::Counts> counts(2);
  world->run([&](int rank) {
    auto recorder = std::make_shared<WaitRecordingCommunicator>(world->communicator(rank));
    auto group = std::make_shared<ProcessGroup>(recorder, rank, c10::Device(c10::kCPU));
    DdpOptions options;
    options.firstBucketBytes = 256;  // several buckets
    options.bucketBytes = 1024;
    options.broadcastBuffers = false;
    DistributedDataParallel<Mlp> ddp(nets[rank], group, options);
    // The first backward also rebuilds the buckets in arrival order (one broadcast of rank 0's
    // order, Note [Bucket rebuild]); counted from the second, whose buckets are the rebuilt ones.
    mseLoss(ddp(torch::randn({4, 8})), torch::randn({4, 4})).backward();
    auto before = recorder->counts();
    mseLoss(ddp(torch::randn({4, 8})), torch::randn({4, 4})).backward();
    auto after = recorder->counts();
    counts[rank] = {after.wait - before.wait, after.waitOnStream - before.waitOnStream};
    EXPECT_EQ(ddp.bucketNames().size(), static_cast<size_t>(counts[rank].waitOnStream));
  });
  for (const auto& c : counts) {
    EXPECT_EQ(c.wait, 0) << "a bucket was waited on the stream of its issue";
    EXPECT_GE(c.waitOnStream, 2);
  }
}

TEST(DdpCompression, HalfPrecisionAllreduceIsCloseToFullPrecision) {
  torch::manual_seed(6);
  auto x = torch::randn({8, 8});
  auto y = torch::randn({8, 4});
  auto gradients = [&](GradientCompression compression) {
    std::vector<Mlp> nets(2);
    std::vector<torch::Tensor> grads;
    auto world = ThreadWorld::create(2);
    world->run([&](int rank) {
      DdpOptions options;
      options.compression = compression;
      DistributedDataParallel<Mlp> ddp(nets[rank], threadGroup(*world, rank), options);
      mseLoss(ddp(shard(x, rank, 2)), shard(y, rank, 2)).backward();
    });
    for (auto& p : nets[0]->parameters()) grads.push_back(p.grad().clone());
    for (size_t i = 0; i < grads.size(); ++i) {
      EXPECT_TRUE(torch::equal(grads[i], nets[1]->parameters()[i].grad()));
    }
    return grads;
  };
  // The same seed before each run: the same models, hence the same gradients before reduction.
  torch::manual_seed(7);
  auto exact = gradients(GradientCompression::None);
  torch::manual_seed(7);
  auto fp16 = gradients(GradientCompression::Fp16);
  torch::manual_seed(7);
  auto bf16 = gradients(GradientCompression::Bf16);
  double worstFp16 = 0, worstBf16 = 0;
  for (size_t i = 0; i < exact.size(); ++i) {
    worstFp16 = std::max(worstFp16, relativeError(fp16[i], exact[i]));
    worstBf16 = std::max(worstBf16, relativeError(bf16[i], exact[i]));
  }
  EXPECT_GT(worstFp16, 0) << "fp16 compression changed nothing: was it applied?";
  EXPECT_LT(worstFp16, 2e-3);
  EXPECT_GT(worstBf16, worstFp16);
  EXPECT_LT(worstBf16, 2e-2);
}

TEST(DdpFailure, CommunicatorErrorComesOutOfBackward) {
  ThreadWorldOptions options;
  options.failAtCollective = 2;  // after construction's allgather and broadcast
  auto world = ThreadWorld::create(2, options);
  std::vector<Mlp> nets(2);
  expectErrorOnEveryRank(*world,
                         [&](int rank) {
                           DistributedDataParallel<Mlp> ddp(nets[rank], threadGroup(*world, rank));
                           mseLoss(ddp(torch::randn({2, 8})), torch::randn({2, 4})).backward();
                         },
                         {"injected failure of collective #2", "allreduce"});
}

TEST(DdpUnusedParameters, SkippedGradientsAreSynchronised) {
  for (bool asView : {true, false}) {  // gradients in the buckets (the default), and copies
    checkSkippedLayerIsStillSynchronised(asView);
    checkUsedOnlyInsideNoSyncStillSynchronised(asView);
  }
}

TEST(DdpUnusedParameters, Errors) {
  checkWithoutFindUnusedTheBackwardNamesThem();
  checkSearchesTupleOutputsAndRejectsOpaqueOnes();
}

TEST(DdpConstruction, MismatchedModelsAreNamed) {
  checkMismatchedModelsNameTheParameterAndRanks();
  checkExtraParameterAndDtypeMismatchAreNamed();
}

TEST(DdpBuffers, BatchNorm) {
  checkBatchNormParametersAndBuffersIdenticalOnEveryRank();
  checkBroadcastBeforeEveryForward();
}

}  // namespace
}  // namespace dtrain::testing::ddp_behaviour_test
