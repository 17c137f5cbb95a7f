// ShardedOptimizer as an API: what it refuses (and how it says so), how it behaves as a
// torch::optim::Optimizer (schedulers, closures, zero_grad, unused parameters), bfloat16
// parameters with float32 master shards, and noSync() misuse.
#include <gtest/gtest.h>

#include <mutex>

#include <torch/optim/schedulers/step_lr.h>

#include "zero_expect.h"

namespace dtrain::testing::zero_api_test {
namespace {

// Runs fn on each rank of a world of `n` threads with a fresh DDP-wrapped Mlp(7, 13, 5).
void withDdp(int n, const std::function<void(int, DistributedDataParallel<Mlp>&)>& fn) {
  auto threads = ThreadWorld::create(n);
  threads->run([&](int rank) {
    auto group = threadGroup(*threads, rank);
    Mlp net = buildSeeded(2, [] { return Mlp(7, 13, 5); });
    DistributedDataParallel<Mlp> ddp(net, group);
    fn(rank, ddp);
  });
}

std::string errorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

void expectContains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "\"" << part << "\" not in: " << text;
}

TEST(ZeroApi, RefusesWhatItCannotShard) {
  withDdp(2, [](int, DistributedDataParallel<Mlp>& ddp) {
    ZeroOptions four;
    four.stage = 4;
    expectContains(errorOf([&] { ShardedOptimizer(ddp, factoryFor("adam"), four); }),
                   "stages 1, 2 and 3 exist");
    ZeroOptions three;  // stage 3 without a module marked as a unit
    three.stage = 3;
    expectContains(errorOf([&] { ShardedOptimizer(ddp, factoryFor("adam"), three); }),
                   "the model has none");
    ZeroOptions offloadOne;  // stage 1 reduces in place on the device: nothing to offload
    offloadOne.stage = 1;
    offloadOne.offload = true;
    expectContains(errorOf([&] { ShardedOptimizer(ddp, factoryFor("adam"), offloadOne); }),
                   "offload needs stage 2 or 3");
    std::vector<torch::optim::OptimizerParamGroup> partial;
    partial.emplace_back(std::vector<torch::Tensor>{ddp->fc1->weight});
    expectContains(errorOf([&] { ShardedOptimizer(ddp, std::move(partial), factoryFor("adam")); }),
                   "in no group: fc1.bias, fc2.weight");
    std::vector<torch::optim::OptimizerParamGroup> twice;
    twice.emplace_back(ddp.parameters());
    twice.emplace_back(std::vector<torch::Tensor>{ddp->fc3->bias});
    expectContains(errorOf([&] { ShardedOptimizer(ddp, std::move(twice), factoryFor("adam")); }),
                   "fc3.bias is in group 0 and in group 1");
    std::vector<torch::optim::OptimizerParamGroup> stranger;
    stranger.emplace_back(std::vector<torch::Tensor>{torch::zeros({3}, torch::requires_grad())});
    expectContains(errorOf([&] { ShardedOptimizer(ddp, std::move(stranger), factoryFor("adam")); }),
                   "not a trained parameter");
    ShardedOptimizer once(ddp, factoryFor("adam"));
    expectContains(errorOf([&] { ShardedOptimizer(ddp, factoryFor("adam")); }),
                   "another ShardedOptimizer");
    torch::serialize::OutputArchive archive;
    expectContains(errorOf([&] { once.save(archive); }), "shardRecords()");
  });
}

TEST(ZeroApi, RanksWithOtherOptionsFailOnEveryRankNamingThem) {
  withDdp(2, [](int rank, DistributedDataParallel<Mlp>& ddp) {
    ZeroOptions zo;
    zo.stage = rank == 0 ? 1 : 2;
    expectContains(errorOf([&] { ShardedOptimizer(ddp, factoryFor("adam"), zo); }),
                   "ranks disagree on the ZeroOptions");
  });
}

// A step whose last backward ran under noSync() would use gradients no rank has averaged (stage
// 1, and Accumulation::Local); under the default accumulation of stages 2 and 3 every noSync()
// backward has reduce-scattered its gradients, and the step is taken.
TEST(ZeroApi, StepAfterOnlyNoSyncBackwardsIsRefused) {
  withDdp(2, [](int, DistributedDataParallel<Mlp>& ddp) {
    ZeroOptions zo;
    zo.stage = 2;
    ShardedOptimizer adam(ddp, factoryFor("adam"), zo);
    {
      auto guard = ddp.noSync();
      torch::mse_loss(ddp(torch::randn({2, 7})), torch::randn({2, 5})).backward();
    }
    adam.step();  // averaged already
  });
  for (int stage : {1, 2}) {
    withDdp(2, [stage](int, DistributedDataParallel<Mlp>& ddp) {
      ZeroOptions zo;
      zo.stage = stage;
      zo.accumulation = ZeroOptions::Accumulation::Local;
      ShardedOptimizer adam(ddp, factoryFor("adam"), zo);
      {
        auto guard = ddp.noSync();
        torch::mse_loss(ddp(torch::randn({2, 7})), torch::randn({2, 5})).backward();
      }
      expectContains(errorOf([&] { adam.step(); }), "outside noSync()");
      torch::mse_loss(ddp(torch::randn({2, 7})), torch::randn({2, 5})).backward();
      adam.step();  // after the synchronising backward
    });
  }
}

using Params = std::map<std::string, torch::Tensor>;

// The optimizer of a comparison: stage 0 the factory's own over the module (plain DDP), else a
// ShardedOptimizer of that stage with small units.
template <typename Net>
std::unique_ptr<torch::optim::Optimizer> optimizerFor(int stage, DistributedDataParallel<Net>& ddp,
                                                      const OptimizerFactory& factory) {
  if (stage == 0) return factory.make({torch::optim::OptimizerParamGroup(ddp.parameters())});
  ZeroOptions zo;
  zo.stage = stage;
  zo.firstUnitBytes = 64;
  zo.unitBytes = 512;
  return std::make_unique<ShardedOptimizer>(ddp, factory, zo);
}

template <typename Net>
Params paramsOf(Net& net) {
  Params out;
  for (const auto& p : net->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

// Runs `train(stage, rank, group)` on `world` ranks as threads for DDP (stage 0) and for stages 1
// and 2; each returns its module's parameters; rank 0's must agree within 1e-6.
void expectStagesMatchDdp(
    int world, const std::function<Params(int, int, std::shared_ptr<ProcessGroup>)>& train) {
  auto run = [&](int stage) {
    Params out;
    auto threads = ThreadWorld::create(world);
    threads->run([&](int rank) {
      Params mine = train(stage, rank, threadGroup(*threads, rank));
      if (rank == 0) out = std::move(mine);
    });
    return out;
  };
  const Params ddp = run(0);
  for (int stage : {1, 2}) {
    const Params zero = run(stage);
    for (const auto& [name, t] : ddp) {
      EXPECT_LE(relativeError(zero.at(name), t), 1e-6) << "stage " << stage << " " << name;
    }
  }
}

// A scheduler changes the learning rate of the groups this optimizer shows; the shards' own
// optimizers step with it. A closure runs forward and backward, as libtorch's optimizers do.
TEST(ZeroApi, SchedulersAndClosuresWorkAsWithAnyOptimizer) {
  expectStagesMatchDdp(2, [](int stage, int rank, std::shared_ptr<ProcessGroup> group) {
    Mlp net = buildSeeded(2, [] { return Mlp(7, 13, 5); });
    DistributedDataParallel<Mlp> ddp(net, group);
    auto opt = optimizerFor(stage, ddp,
                            optimizerFactory<torch::optim::SGD>(torch::optim::SGDOptions(0.2)));
    torch::optim::StepLR schedule(*opt, 1, 0.5);
    for (int s = 0; s < 4; ++s) {
      auto x = randnSeeded({4, 7}, 40 + s), y = randnSeeded({4, 5}, 80 + s);
      opt->step([&] {
        opt->zero_grad();
        auto loss = torch::mse_loss(ddp(shard(x, rank, 2)), shard(y, rank, 2));
        loss.backward();
        return loss;
      });
      schedule.step();
    }
    return paramsOf(net);
  });
}

// Gradients accumulate until zero_grad(), as with any optimizer (Note [Accumulating into the
// shard]): two synchronising backwards per step, and zero_grad() only every other step, so the
// shard's gradient is folded into the next reduce-scatter at every kind of step.
TEST(ZeroApi, GradientsAccumulateUntilZeroGradAsWithAnyOptimizer) {
  expectStagesMatchDdp(3, [](int stage, int rank, std::shared_ptr<ProcessGroup> group) {
    Mlp net = buildSeeded(5, [] { return Mlp(7, 13, 5); });
    DistributedDataParallel<Mlp> ddp(net, group);
    auto opt = optimizerFor(
        stage, ddp,
        optimizerFactory<torch::optim::SGD>(torch::optim::SGDOptions(0.02).momentum(0.9)));
    for (int s = 0; s < 6; ++s) {
      if (s % 2 == 0) opt->zero_grad();
      for (int b = 0; b < 2; ++b) {
        auto x = randnSeeded({6, 7}, 10 * s + b), y = randnSeeded({6, 5}, 100 + 10 * s + b);
        torch::mse_loss(ddp(shard(x, rank, 3)), shard(y, rank, 3)).backward();
      }
      opt->step();
    }
    return paramsOf(net);
  });
}

// findUnusedParameters: a parameter some rank skips takes part with zeros, as under DDP.
TEST(ZeroApi, UnusedParametersMatchDdp) {
  expectStagesMatchDdp(3, [](int stage, int rank, std::shared_ptr<ProcessGroup> group) {
    BranchNet net = buildSeeded(4, [] { return BranchNet(); });
    DdpOptions o;
    o.findUnusedParameters = true;
    DistributedDataParallel<BranchNet> ddp(net, group, o);
    auto opt = optimizerFor(stage, ddp,
                            optimizerFactory<torch::optim::SGD>(torch::optim::SGDOptions(0.1)));
    for (int s = 0; s < 4; ++s) {
      auto x = randnSeeded({6, 6}, 60 + s), y = randnSeeded({6, 3}, 90 + s);
      opt->zero_grad();
      const bool skip = (s + rank) % 3 == 0;  // some rank uses fc2 at every step
      torch::mse_loss(ddp(shard(x, rank, 3), skip), shard(y, rank, 3)).backward();
      opt->step();
    }
    return paramsOf(net);
  });
}

// Without findUnusedParameters a parameter without a gradient fails the backward naming it, on
// every rank, and the ranks' collectives still line up.
TEST(ZeroApi, AMissingGradientFailsTheBackwardNamingIt) {
  auto threads = ThreadWorld::create(2);
  threads->run([&](int rank) {
    auto group = threadGroup(*threads, rank);
    BranchNet net;
    DistributedDataParallel<BranchNet> ddp(net, group);
    ShardedOptimizer adam(ddp, factoryFor("adam"));
    auto loss = torch::mse_loss(ddp(torch::randn({2, 6}), /*skip=*/true), torch::randn({2, 3}));
    expectContains(errorOf([&] { loss.backward(); }),
                   "received no gradient in this backward pass: fc2.weight");
  });
}

// bfloat16 parameters, float32 master shards, against one process keeping a float32 master copy
// of the whole model and stepping it with the average of the same per-rank bfloat16 gradients
// (each divided by N in bfloat16 and summed, as the reduce-scatter of a 16-bit unit does).
TEST(ZeroApi, Bfloat16ParametersWithFloat32MasterShards) {
  const int world = 2, steps = 12;
  for (int stage : {1, 2}) {
    SCOPED_TRACE(stage);
    ZeroRun run;
    run.world = world;
    run.stage = stage;
    run.steps = steps;
    run.optimizer = "adam";
    run.dtype = at::kBFloat16;
    std::mutex mutex;
    std::map<std::string, torch::Tensor> masters;  // whole, from every rank's records
    const ZeroResult zero = trainMlp(run, [&](int, ShardedOptimizer& opt) {
      std::lock_guard<std::mutex> lock(mutex);
      for (const auto& r : opt.shardRecords()) {
        EXPECT_EQ(r.master.scalar_type(), at::kFloat);
        int64_t numel = 1;
        for (int64_t d : r.shape) numel *= d;
        auto& full = masters[r.param];
        if (!full.defined()) full = torch::zeros({numel});
        full.narrow(0, r.begin, r.end - r.begin).copy_(r.master);
      }
    });
    expectRanksBitwiseEqual(zero);

    torch::manual_seed(run.seed);
    Mlp net(7, 13, 5);
    net->to(at::kBFloat16);
    std::vector<torch::Tensor> master;
    for (auto& p : net->parameters()) master.push_back(p.detach().to(at::kFloat).clone());
    torch::optim::Adam adam(master, torch::optim::AdamOptions(1e-2));
    for (int s = 0; s < steps; ++s) {
      auto [x, y] = wholeBatch(run, s, 0, 7, 5);
      std::vector<torch::Tensor> sum(master.size());
      for (int r = 0; r < world; ++r) {
        net->zero_grad();
        torch::mse_loss(net->forward(shard(x, r, world).to(at::kBFloat16)).to(at::kFloat),
                        shard(y, r, world))
            .backward();
        auto params = net->parameters();
        for (size_t i = 0; i < params.size(); ++i) {
          auto part = (params[i].grad() * (1.0 / world)).to(at::kFloat);
          sum[i] = sum[i].defined() ? sum[i] + part : part;
        }
      }
      for (size_t i = 0; i < master.size(); ++i) {
        master[i].mutable_grad() = sum[i].to(at::kBFloat16).to(at::kFloat);
      }
      adam.step();
      torch::NoGradGuard noGrad;
      auto params = net->parameters();
      for (size_t i = 0; i < params.size(); ++i) params[i].copy_(master[i]);
    }
    size_t i = 0;
    for (const auto& p : net->named_parameters()) {
      EXPECT_LE(relativeError(masters.at(p.key()), master[i].reshape({-1})), 1e-5) << p.key();
      EXPECT_TRUE(torch::equal(zero.params[0].at(p.key()), p.value()))
          << p.key() << ": the parameters are the master weights rounded";
      ++i;
    }
  }
}

}  // namespace
}  // namespace dtrain::testing::zero_api_test
