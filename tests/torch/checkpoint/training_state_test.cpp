// TrainingState alone -- what may be registered under which name, metadata kept on the CPU, the
// step boundary that runs DTRAIN_FAULT's process-level faults -- and a Checkpointer built from a
// TrainingState saving and restoring what was registered there.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "checkpoint_support.h"
#include "dtrain/base/error.h"
#include "dtrain/torch/checkpoint.h"
#include "dtrain/torch/distributed_sampler.h"
#include "dtrain/torch/grad_scaler.h"
#include "dtrain/torch/training_state.h"
#include "test_support.h"

namespace dtrain::testing::training_state_test {
namespace {

TEST(TrainingState, NamesAreUniquePerKindAndNullsAreRefused) {
  TrainingState state(soloGroup());
  torch::nn::Linear a(2, 2), b(2, 2);
  torch::optim::SGD sgd(a->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::Adam adam(b->parameters(), torch::optim::AdamOptions(0.1));
  torch::optim::StepLR lr(sgd, 2, 0.5);
  GradScaler scaler;
  DistributedSampler sampler(8, 1, 0);

  state.addModule("a", a);
  EXPECT_THROW(state.addModule("a", b), InvalidArgument);
  EXPECT_THROW(state.addModule("c", std::shared_ptr<torch::nn::Module>()), InvalidArgument);
  state.addModule("b", b);
  // One name space per kind: an optimizer, a scheduler, ... may share a module's name.
  state.addOptimizer("a", sgd);
  EXPECT_THROW(state.addOptimizer("a", adam), InvalidArgument);
  state.addScheduler("a", lr);
  EXPECT_THROW(state.addScheduler("a", lr), InvalidArgument);
  state.addScaler("a", scaler);
  EXPECT_THROW(state.addScaler("a", scaler), InvalidArgument);
  state.addSampler("a", sampler, [] { return size_t{0}; });
  EXPECT_THROW(state.addSampler("a", sampler), InvalidArgument);
  try {
    state.addOptimizer("a", adam);
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("an optimizer named \"a\" is registered already"),
              std::string::npos)
        << e.what();
  }
}

TEST(TrainingState, MetadataIsKeptOnTheCpuAndEmptyKeysAreRefused) {
  TrainingState state(soloGroup());
  EXPECT_TRUE(state.metadata().empty());
  torch::Tensor t = torch::arange(6, torch::kInt).reshape({2, 3}).t();  // not contiguous
  state.setMetadata("mask", t);
  state.setMetadata("note", std::string("hello"));
  state.setMetadata("note", int64_t{3});  // replaced
  const auto& kept = std::get<at::Tensor>(state.metadata().at("mask"));
  EXPECT_TRUE(kept.is_contiguous());
  EXPECT_TRUE(torch::equal(kept, t));
  t.zero_();  // a copy was kept, not the caller's tensor
  EXPECT_FALSE(torch::equal(kept, t));
  EXPECT_EQ(std::get<int64_t>(state.metadata().at("note")), 3);
  EXPECT_THROW(state.setMetadata("", 1.0), InvalidArgument);
  EXPECT_THROW(state.setMetadata("undefined", at::Tensor()), InvalidArgument);
}

TEST(TrainingState, CurrentStepIsTheLastBeginStep) {
  TrainingState state(soloGroup());
  EXPECT_EQ(state.currentStep(), -1);
  state.beginStep(0);
  EXPECT_EQ(state.currentStep(), 0);
  state.beginStep(41);
  EXPECT_EQ(state.currentStep(), 41);
}

// DTRAIN_FAULT is read once per process: the "threadsafe" death test runs the statement in a
// fresh process of this binary, which reads the variable set here.
TEST(TrainingState, BeginStepRunsTheMatchingFaultAtItsStepAndNotBefore) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ::setenv("DTRAIN_FAULT", "exit:7@step=3;exit:9@rank=1", 1);
  ::unsetenv("DTRAIN_RESTART_COUNT");
  EXPECT_EXIT(
      {
        TrainingState state(soloGroup());  // rank 0: the rank=1 fault is not ours
        for (int64_t step = 0; step < 3; ++step) state.beginStep(step);
        std::fprintf(stderr, "steps 0-2 ran\n");
        state.beginStep(3);
        std::exit(0);  // not reached
      },
      ::testing::ExitedWithCode(7), "steps 0-2 ran");
  ::unsetenv("DTRAIN_FAULT");
}

TEST(TrainingState, ACheckpointerBuiltFromItSavesAndRestoresWhatWasRegistered) {
  TempDir dir;
  auto state = std::make_shared<TrainingState>(soloGroup());
  torch::nn::Linear net(3, 2);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  DistributedSampler sampler(16, 1, 0);
  state->addModule("model", net);
  state->addOptimizer("sgd", sgd);
  state->addSampler("data", sampler);
  state->setMetadata("note", std::string("saved"));

  auto step = [&](int i) {
    state->beginStep(i);
    sgd.zero_grad();
    torch::manual_seed(700 + i);
    net->forward(torch::randn({4, 3})).pow(2).sum().backward();
    sgd.step();
    sampler.next(4);
  };
  Checkpointer checkpointer(state, optionsFor(dir.path()));
  EXPECT_EQ(&checkpointer.state(), state.get());
  EXPECT_FALSE(checkpointer.restore().has_value());
  for (int i = 0; i < 3; ++i) step(i);
  checkpointer.save(3);
  auto saved = stateOf(*net);
  auto position = sampler.state();

  for (int i = 3; i < 5; ++i) step(i);
  state->setMetadata("note", std::string("changed"));
  ASSERT_EQ(checkpointer.restore()->step, 3);
  expectBitwise(*net, saved, "model");
  EXPECT_EQ(sampler.state(), position);
  EXPECT_EQ(std::get<std::string>(state->metadata().at("note")), "saved");

  // Registered through the Checkpointer, the same objects land in the same TrainingState.
  torch::nn::Linear other(1, 1);
  checkpointer.addModule("other", other);
  EXPECT_THROW(state->addModule("other", other), InvalidArgument);

  // A Checkpointer built from its group has a TrainingState of its own.
  Checkpointer own(soloGroup(), optionsFor(dir.path() + "/own"));
  EXPECT_NE(&own.state(), state.get());
  EXPECT_TRUE(own.state().metadata().empty());
}

}  // namespace
}  // namespace dtrain::testing::training_state_test
