// ZeRO stages 1 and 2 against plain DDP, ranks as threads: the same model, data and optimizer end
// within 1e-6 (relative) of DDP's parameters, and every rank bitwise equal after the all-gather.
// Real processes over shared memory and Gloo: tests/torch/zero/zero_processes_test.cpp.
#include <gtest/gtest.h>

#include "zero_expect.h"

namespace dtrain::testing::zero_equivalence_test {
namespace {

struct Param {
  int world;
  int stage;
};

class ZeroEquivalence : public ::testing::TestWithParam<Param> {};

// AdamW steps of 3 micro-batches (noSync), an enabled GradScaler whose step 7 overflows on one
// rank only (so every rank must agree to skip it), units with padding; ZeRO with `accumulation`
// against DDP.
void adamWWithAccumulationAndAnOverflow(const Param& param, int steps,
                                        ZeroOptions::Accumulation accumulation) {
  ZeroRun run;
  run.world = param.world;
  run.steps = steps;
  run.micro = 3;
  run.scaler = true;
  run.overflowStep = 7;
  run.overflowRank = run.world - 1;
  const ZeroResult ddp = trainMlp(run);
  run.stage = param.stage;
  run.localAccumulation = accumulation == ZeroOptions::Accumulation::Local;
  const ZeroResult zero = trainMlp(run);
  EXPECT_EQ(ddp.skipped, 1);
  EXPECT_EQ(zero.skipped, 1) << "the overflow on one rank skips the step on all";
  expectRanksBitwiseEqual(zero);
  expectClose(zero, ddp, 1e-6);
}

TEST_P(ZeroEquivalence, AdamWWithAccumulationAndAnOverflow) {
  adamWWithAccumulationAndAnOverflow(GetParam(), 50, ZeroOptions::Accumulation::ReduceScatter);
}

// Accumulation::Local: noSync() micro-batches keep full gradients and the synchronising backward
// reduce-scatters their sum (at stage 1 the option changes nothing).
TEST_P(ZeroEquivalence, AdamWWithLocalAccumulationAndAnOverflow) {
  adamWWithAccumulationAndAnOverflow(GetParam(), 20, ZeroOptions::Accumulation::Local);
}

// SGD with momentum and weight decay, and a second group (the biases) with its own options.
TEST_P(ZeroEquivalence, SgdMomentumWithTwoParameterGroups) {
  ZeroRun run;
  run.world = GetParam().world;
  run.steps = 20;
  run.optimizer = "sgd-groups";
  const ZeroResult ddp = trainMlp(run);
  run.stage = GetParam().stage;
  const ZeroResult zero = trainMlp(run);
  expectRanksBitwiseEqual(zero);
  expectClose(zero, ddp, 1e-6);
}

// The global norm over the shards is the full model's, and clipping scales alike.
TEST_P(ZeroEquivalence, ClipGradNormByTheGlobalNorm) {
  ZeroRun run;
  run.world = GetParam().world;
  run.steps = 8;
  run.optimizer = "adam";
  run.clip = 0.05;
  const ZeroResult ddp = trainMlp(run);
  run.stage = GetParam().stage;
  const ZeroResult zero = trainMlp(run);
  ASSERT_EQ(zero.clipNorms.size(), ddp.clipNorms.size());
  for (size_t s = 0; s < ddp.clipNorms.size(); ++s) {
    EXPECT_NEAR(zero.clipNorms[s], ddp.clipNorms[s], 1e-6 * ddp.clipNorms[s]) << "step " << s;
    EXPECT_GT(ddp.clipNorms[s], run.clip) << "the test clips at every step";
  }
  expectRanksBitwiseEqual(zero);
  expectClose(zero, ddp, 1e-5);
}

// Note [Deferred all-gathers]: the wrapper's next forward waits for what step() left running;
// the same collectives in the same order, so the training is bitwise the one that waited in
// step() -- with accumulation, an overflow skipped on every rank, and clipping.
TEST_P(ZeroEquivalence, DeferredAllgathersTrainBitwiseAsWaitedOnes) {
  ZeroRun run;
  run.world = GetParam().world;
  run.stage = GetParam().stage;
  run.steps = 12;
  run.micro = 2;
  run.scaler = true;
  run.overflowStep = 4;
  run.overflowRank = run.world - 1;
  run.clip = 0.05;
  const ZeroResult waited = trainMlp(run);
  run.deferAllgatherWait = true;
  const ZeroResult deferred = trainMlp(run);
  EXPECT_EQ(deferred.skipped, 1);
  expectRanksBitwiseEqual(deferred);
  ASSERT_EQ(deferred.params.size(), waited.params.size());
  for (size_t r = 0; r < waited.params.size(); ++r) {
    for (const auto& [name, t] : waited.params[r]) {
      EXPECT_TRUE(torch::equal(deferred.params[r].at(name), t)) << "rank " << r << " " << name;
    }
  }
  EXPECT_EQ(deferred.clipNorms, waited.clipNorms);
}

// Note [Zeroed gradients]: each step first accumulates a micro-batch under noSync() that
// zero_grad() then drops, as an abandoned accumulation or an epoch's leftover micro-batches are;
// it leaves no trace whichever zero_grad() drops it -- the optimizer's, or the module's (zeroing
// in place or set_to_none) as the only one the program calls -- as under DDP. Two micro-batches
// per step, so the kept accumulation is told apart from the dropped one.
TEST_P(ZeroEquivalence, AnAbandonedAccumulationIsDroppedByEitherZeroGrad) {
  for (const char* who : {"optimizer", "module", "module-none"}) {
    SCOPED_TRACE(who);
    ZeroRun run;
    run.world = GetParam().world;
    run.steps = 8;
    run.micro = 2;
    run.abandoned = true;
    run.zeroGrad = who;
    const ZeroResult ddp = trainMlp(run);
    run.stage = GetParam().stage;
    const ZeroResult zero = trainMlp(run);
    expectRanksBitwiseEqual(zero);
    expectClose(zero, ddp, 1e-6);
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ZeroEquivalence,
                         ::testing::Values(Param{2, 1}, Param{2, 2}, Param{3, 1}, Param{3, 2},
                                           Param{4, 1}, Param{4, 2}),
                         [](const auto& info) {
                           return "world" + std::to_string(info.param.world) + "stage" +
                                  std::to_string(info.param.stage);
                         });

}  // namespace
}  // namespace dtrain::testing::zero_equivalence_test
