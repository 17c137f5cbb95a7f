// ZeRO's overlap, observed through the collectives each rank has issued and waited for at chosen
// moments (no timing): stage 2 reduce-scatters unit by unit while backward still runs, and a
// step's all-gathers run while the next units step (Note [Sharded backward], ShardedOptimizer::
// step).
#include <gtest/gtest.h>

#include <memory>
#include <utility>
#include <vector>

#include "dtrain/torch/fully_shard.h"
#include "zero_support.h"

namespace dtrain::testing::zero_overlap_test {
namespace {

// What a unit's optimizer saw when its step began: collectives issued and waits made since
// ShardedOptimizer::step() was called.
struct StepMoment {
  int64_t issued = 0;
  int waited = 0;
};

struct StepLog {
  std::shared_ptr<ThreadWorld> world;
  std::shared_ptr<WaitRecordingCommunicator> recorder;
  int rank = 0;
  int64_t issuedAtStep = 0;
  int waitedAtStep = 0;
  std::vector<StepMoment> moments;

  int waits() const {
    const auto c = recorder->counts();
    return c.wait + c.waitOnStream;
  }
};

// SGD that notes, as each unit's step begins, what the communicator has done since step().
class RecordingSgd : public torch::optim::SGD {
 public:
  RecordingSgd(std::vector<torch::optim::OptimizerParamGroup> groups,
               torch::optim::SGDOptions options, StepLog* log)
      : SGD(std::move(groups), options), log_(log) {}
  torch::Tensor step(LossClosure closure = nullptr) override {
    log_->moments.push_back(
        {log_->world->issued(log_->rank) - log_->issuedAtStep, log_->waits() - log_->waitedAtStep});
    return SGD::step(std::move(closure));
  }

 private:
  StepLog* log_;
};

// Rank `rank`'s Mlp(7, 13, 5) under DDP (no buffer broadcast), over a communicator that records
// its waits into `log`; zeroOptions(): units small enough that there are at least three.
struct RankModel {
  Mlp net = buildSeeded(4, [] { return Mlp(7, 13, 5); });
  std::unique_ptr<DistributedDataParallel<Mlp>> ddp;

  RankModel(StepLog& log, const std::shared_ptr<ThreadWorld>& world, int rank) {
    log.world = world;
    log.rank = rank;
    log.recorder = std::make_shared<WaitRecordingCommunicator>(world->communicator(rank));
    auto group = std::make_shared<ProcessGroup>(log.recorder, rank, c10::Device(c10::kCPU));
    DdpOptions ddpOptions;
    ddpOptions.broadcastBuffers = false;
    ddp = std::make_unique<DistributedDataParallel<Mlp>>(net, group, ddpOptions);
  }
  static ZeroOptions zeroOptions(int stage) {
    ZeroOptions zo;
    zo.stage = stage;
    zo.firstUnitBytes = 128;
    zo.unitBytes = 256;
    return zo;
  }
};

// One synchronising step of Mlp(7, 13, 5) in small units on 2 ranks; returns rank 0's log and
// the collectives rank 0 had issued since the forward when fc1.weight's gradient (the last one
// backward computes) was about to be accumulated.
std::pair<StepLog, int64_t> oneStep(int stage, bool overlapAllgather) {
  auto world = ThreadWorld::create(2);
  std::vector<StepLog> logs(2);
  std::vector<int64_t> issuedBeforeLastGradient(2, -1);
  world->run([&](int rank) {
    StepLog& log = logs[static_cast<size_t>(rank)];
    RankModel model(log, world, rank);
    Mlp& net = model.net;
    DistributedDataParallel<Mlp>& ddp = *model.ddp;
    const torch::optim::SGDOptions sgd(0.1);
    OptimizerFactory factory;
    factory.defaults = std::make_shared<torch::optim::SGDOptions>(sgd);
    factory.make = [sgd, &log](std::vector<torch::optim::OptimizerParamGroup> groups) {
      return std::make_unique<RecordingSgd>(std::move(groups), sgd, &log);
    };
    ZeroOptions zo = RankModel::zeroOptions(stage);
    zo.overlapAllgather = overlapAllgather;
    ShardedOptimizer optimizer(ddp, {}, factory, zo);
    ASSERT_GE(optimizer.stats().units, 3u);

    const auto x = randnSeeded({8, 7}, 10 + rank);
    const auto y = randnSeeded({8, 5}, 20 + rank);
    const int64_t issuedAtForward = world->issued(rank);
    net->fc1->weight.register_hook([&, rank](torch::Tensor g) {
      issuedBeforeLastGradient[static_cast<size_t>(rank)] = world->issued(rank) - issuedAtForward;
      return g;
    });
    torch::mse_loss(ddp(x), y).backward();
    EXPECT_EQ(world->issued(rank) - issuedAtForward, static_cast<int64_t>(optimizer.stats().units))
        << "one reduce-scatter per unit";
    log.issuedAtStep = world->issued(rank);
    log.waitedAtStep = log.waits();
    optimizer.step();
    EXPECT_EQ(log.moments.size(), optimizer.stats().units);
  });
  return {logs[0], issuedBeforeLastGradient[0]};
}

TEST(ZeroOverlap, ReduceScattersStartWhileBackwardRuns) {
  for (int stage : {1, 2}) {
    auto [log, issuedBeforeLast] = oneStep(stage, true);
    // fc1.weight is the first parameter registered: the last gradient, in the last unit (units
    // are cut from the last registered parameter on). When it is about to be accumulated, the
    // units of the later layers are complete and on their way.
    EXPECT_GE(issuedBeforeLast, 1) << "stage " << stage << ": no reduce-scatter started before "
                                   << "backward's last gradient (all at the end of backward?)";
    EXPECT_LT(issuedBeforeLast, static_cast<int64_t>(log.moments.size()))
        << "stage " << stage << ": the first unit cannot be complete before its last gradient";
  }
}

TEST(ZeroOverlap, AllgathersRunWhileTheNextUnitsStep) {
  for (int stage : {1, 2}) {
    const StepLog overlapped = oneStep(stage, true).first;
    for (size_t i = 0; i < overlapped.moments.size(); ++i) {
      // The i units stepped before this one have their all-gathers issued and not waited for.
      EXPECT_EQ(overlapped.moments[i].issued, static_cast<int64_t>(i)) << "unit step " << i;
      EXPECT_EQ(overlapped.moments[i].waited, 0)
          << "stage " << stage << ", unit step " << i << ": an all-gather was waited for before it";
    }
    const StepLog serial = oneStep(stage, false).first;
    for (size_t i = 0; i < serial.moments.size(); ++i) {
      EXPECT_EQ(serial.moments[i].issued, static_cast<int64_t>(i)) << "unit step " << i;
      EXPECT_EQ(serial.moments[i].waited, static_cast<int>(i))
          << "overlapAllgather = false waits for each all-gather before the next step";
    }
  }
}

// Note [Deferred all-gathers]: with deferAllgatherWait, step() issues every unit's all-gather
// and waits for none; the wrapper's next forward waits for all of them before the module runs
// (its output is the one the stepped parameters give), and waitForParameters() after that has
// nothing left to wait for.
TEST(ZeroOverlap, DeferredAllgathersAreWaitedForByTheNextForward) {
  for (int stage : {1, 2}) {
    auto world = ThreadWorld::create(2);
    world->run([&](int rank) {
      StepLog log;
      RankModel model(log, world, rank);
      Mlp& net = model.net;
      DistributedDataParallel<Mlp>& ddp = *model.ddp;
      ZeroOptions zo = RankModel::zeroOptions(stage);
      zo.deferAllgatherWait = true;
      ShardedOptimizer optimizer(
          ddp, {}, optimizerFactory<torch::optim::SGD>(torch::optim::SGDOptions(0.1)), zo);
      const size_t units = optimizer.stats().units;
      ASSERT_GE(units, 3u);
      const auto x = randnSeeded({8, 7}, 10 + rank);
      const auto y = randnSeeded({8, 5}, 20 + rank);
      torch::mse_loss(ddp(x), y).backward();
      const int64_t issued = world->issued(rank);
      const int waited = log.waits();
      optimizer.step();
      EXPECT_EQ(world->issued(rank) - issued, static_cast<int64_t>(units)) << "one per unit";
      EXPECT_EQ(log.waits() - waited, 0) << "stage " << stage << ": step() waited";
      torch::Tensor out;
      {
        at::NoGradGuard noGrad;
        out = ddp(x);
      }
      EXPECT_EQ(log.waits() - waited, static_cast<int>(units))
          << "stage " << stage << ": the forward waits for every unit's all-gather";
      at::NoGradGuard noGrad;
      EXPECT_TRUE(torch::equal(out, net->forward(x))) << "the forward ran before the gathers";
      optimizer.waitForParameters();
      EXPECT_EQ(log.waits() - waited, static_cast<int>(units)) << "nothing left to wait for";
    });
  }
}

// gatherFullParameters() right after a step that deferred its all-gathers waits for them, as
// every reader of the parameters does, and copies this step's parameters.
TEST(ZeroOverlap, GatherFullParametersWaitsForDeferredAllgathers) {
  for (int stage : {1, 2}) {
    SCOPED_TRACE(stage);
    auto world = ThreadWorld::create(2);
    world->run([&](int rank) {
      StepLog log;
      RankModel model(log, world, rank);
      ZeroOptions zo = RankModel::zeroOptions(stage);
      zo.deferAllgatherWait = true;
      ShardedOptimizer optimizer(
          *model.ddp, {}, optimizerFactory<torch::optim::SGD>(torch::optim::SGDOptions(0.1)), zo);
      torch::mse_loss((*model.ddp)(randnSeeded({8, 7}, 10 + rank)), randnSeeded({8, 5}, 20 + rank))
          .backward();
      optimizer.step();
      std::vector<std::pair<std::string, torch::Tensor>> full;
      EXPECT_NO_THROW(full = gatherFullParameters(optimizer));
      const int waited = log.waits();
      optimizer.waitForParameters();
      EXPECT_EQ(log.waits(), waited) << "gatherFullParameters() left an all-gather running";
      const auto params = model.net->named_parameters();
      ASSERT_EQ(full.size(), params.size());
      for (const auto& [name, t] : full) {
        EXPECT_TRUE(torch::equal(t, params[name])) << name << ": not this step's parameters";
      }
    });
  }
}

}  // namespace
}  // namespace dtrain::testing::zero_overlap_test
